"""Which language a prompt or response is in, by script: the language penalty of RLVR (docs/rl.md).

The reward is `correctness − language_penalty · mismatch`; the paper penalises
Korean prompts answered in English, and `language_mismatch` (docs/training.md) is,
among Korean prompts with a parsable response, the fraction whose response is
not Korean.

How a text is read
------------------
1. NFKC (full-width Latin → ASCII, decomposed Hangul → syllables).
2. Strip what carries no language: code markers (fences with their info
   string, backticks), SQL statements (`SELECT ... FROM ...` up to a newline,
   `;`, sentence end or the next Hangul letter; quoted literals inside are part
   of the SQL), URLs, e-mail addresses and JSON keys. What code markers hold is
   read like any text: its identifiers and keywords weigh 0 (step 3), its prose
   counts, so an English answer in backticks is still English (dropping code
   whole would let a Korean prompt's English answer escape the penalty that way).
3. Split on spaces (and , ; / |) into words and weigh each:
   - a word holding any Hangul letter (syllable or jamo) is one Korean word,
     even with Latin or digits in it: `Samsung이`, `total_sales는`,
     `1,234,000원이며` are Korean grammar around a name, identifier or number;
   - a Latin word counts 1, or NAME_WEIGHT if capitalised (in Korean text a
     capitalised Latin word is nearly always a name: `Apple과 Samsung`);
   - likewise a bare three-syllable Hangul word that starts with a common
     surname (`김민수`, `이영희`) counts NAME_WEIGHT: names are data, and
     "The top customers are 김민수 and 이영희." is an English answer;
   - identifiers (snake_case, camelCase, dotted.names, calls(, words with
     digits), ALL-CAPS acronyms and SQL keywords, and single letters other than
     `a`/`I` count 0: they are the same in either language;
   - a word in another script (Chinese, Cyrillic, ...) counts 1 for neither;
   - a word copied verbatim from `data` (the tool results the agent read:
     database values, column names) counts 0 whatever its script: "The result
     is 사무용 의자." reads a product's name off the table and is English, while
     "사무용 의자입니다" wraps it in Korean grammar and stays Korean.
4. Decide on the Korean share of the weight.

Words, not letters: a Hangul syllable packs 2–3 letters, so the same sentence
is about half as many letters in Korean as in English, and a letter share would
need a script-density fudge. A Korean word (eojeol) carries a little more than
an English word, so the bar for Korean is KOREAN_SHARE = 0.4 of the words, and
English needs ENGLISH_SHARE = 0.75: one Korean name in an English sentence does
not make it Korean, a few English names in a Korean sentence do not make it
English. In between the text is mixed (None): rules cannot decide, and the
caller may ask an LLM judge (`mismatch(..., judge=...)`).
"""

import re
import unicodedata
from typing import Callable, Sequence

KOREAN_SHARE = 0.4     # detect: 'ko' at ≥ 40% of the word weight in Korean words
ENGLISH_SHARE = 0.75   # detect: 'en' at ≥ 75% in Latin words
PROMPT_KOREAN_SHARE = 0.6    # classify_prompt is stricter: a clear majority either way
PROMPT_ENGLISH_SHARE = 0.9
ABSENT_SHARE = 0.15    # under this share the prompt's language is absent from a response (mismatch)
NAME_WEIGHT = 0.5      # a capitalised Latin word or a bare Hangul name: names are data, not language
MIN_WEIGHT = 0.5       # detect: at least one word (a lone capitalised one will do: "No")
MIN_PROMPT_WEIGHT = 1.0    # classify_prompt: "Hi", "OK", "1234" are too short to say
LANGUAGES = ('ko', 'en')
LANGUAGE_NAMES = {'ko': 'Korean', 'en': 'English'}

_HANGUL = '\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\ud7b0-\ud7ff\uffa0-\uffdc'
_HANGUL_RE = re.compile(f'[{_HANGUL}]')
_SURNAMES = '김이박최정강조윤장임한오서신권황안송전홍유류고문양손배백허남심노하곽성차주우구민나진지엄채원천방공현'
_HANGUL_NAME = re.compile(f'[{_SURNAMES}][\uac00-\ud7a3]{{2}}')
_LATIN_RE = re.compile('[A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]')

# Code markers: a fence with its info string (```sql), backticks. What they hold is read like any text.
_FENCED_CODE = re.compile(r'(```|~~~)(?:[\w.+-]*[ \t]*\n)?(.*?)(?:\1|\Z)', re.DOTALL)
_INLINE_CODE = re.compile(r'`([^`\n]*)`')
_URL = re.compile(r"\b(?:[a-zA-Z][a-zA-Z0-9+.-]{0,15}://|www\.)[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")
_EMAIL = re.compile(r'[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){1,8}')  # RFC lengths: linear time
_JSON_KEY = re.compile(r'"[^"\n]{1,80}"\s*:|\'[^\'\n]{1,80}\'\s*:')
# A SQL statement starts at an unmistakable opening (upper case: any SELECT; either case: a
# SELECT list that looks like SQL, INSERT INTO, DELETE FROM, CREATE TABLE, ...) and runs to a
# newline, `;`, a sentence end or the next Hangul letter; quoted literals ride along whole.
_SQL = re.compile(
    r'(?:\bSELECT\b|\bWITH\s+\w+\s+AS\s*\(|\bUPDATE\s+\w+\s+SET\b'
    r'|(?i:\bselect\s+(?:\*|distinct\b|top\b|\w+\s*\(|[\w.]+\s*,|\w+\.\w+|\w+\s+from\s+\w+))'
    r'|(?i:\b(?:insert\s+into|delete\s+from|create\s+(?:table|view|index)|drop\s+table)\b))'
    rf'(?:\'[^\'\n]*\'|"[^"\n]*"|[^\n;\'"{_HANGUL}.!?]|[.!?](?=\S))*')
# Quoted material: "…", “…”, 「…」, 『…』 (one line, bounded length). A reasoning trace that quotes the
# Korean sentence it reasons about is still English reasoning.
_QUOTED = re.compile(r'"[^"\n]{0,200}"|“[^”\n]{0,200}”|「[^」\n]{0,200}」|『[^』\n]{0,200}』')
_WORD_SPLIT = re.compile(r'[\s,;/|]+')
_PUNCTUATION = '()[]{}<>"\'`.,:;!?…·*#~“”‘’«»「」『』'
_IDENTIFIER = re.compile(r'_|\d|[a-z][A-Z]|\w\.\w|\w\(|[=<>@$\\]')


def _strip_non_language(text: str) -> str:
  """Drops code markers, SQL, URLs, e-mails and JSON keys: they read the same in either language."""
  text = unicodedata.normalize('NFKC', text)
  text = _INLINE_CODE.sub(r' \1 ', _FENCED_CODE.sub(r' \2 ', text))
  for pattern in (_URL, _EMAIL, _JSON_KEY, _SQL):
    text = pattern.sub(' ', text)
  return text


def _latin_weight(word: str) -> float:
  """Weight of a word without Hangul: 1 for an English word, NAME_WEIGHT for a capitalised one,
  0 for identifiers, acronyms, numbers and stray letters."""
  if _IDENTIFIER.search(word):
    return 0.0
  core = word.strip(_PUNCTUATION)
  letters = _LATIN_RE.findall(core)
  if not letters:
    return 0.0
  if len(letters) == 1 and core not in ('a', 'I'):
    return 0.0
  if len(letters) > 1 and all(letter.isupper() for letter in letters):
    return 0.0  # SQL, API, NASA: acronyms and keywords read the same in Korean text
  return NAME_WEIGHT if letters[0].isupper() else 1.0


def _words(text: str) -> list[str]:
  return _WORD_SPLIT.split(_strip_non_language(text))


def word_weights(text: str, data: Sequence[str] = ()) -> tuple[float, float, float]:
  """(korean, latin, other-script) word weights of `text` after stripping code, SQL, URLs, ...;
  words found among the words of `data` (tool results) weigh 0."""
  copied = {word.strip(_PUNCTUATION) for source in data for word in _words(source)} - {''}
  korean = latin = other = 0.0
  for word in _words(text):
    if word.strip(_PUNCTUATION) in copied:
      continue
    if _HANGUL_RE.search(word):
      korean += NAME_WEIGHT if _HANGUL_NAME.fullmatch(word.strip(_PUNCTUATION)) else 1.0
    elif any(ch.isalpha() and not _LATIN_RE.match(ch) for ch in word):
      other += 1
    else:
      latin += _latin_weight(word)
  return korean, latin, other


def _decide(weights: tuple[float, float, float], korean_share: float, english_share: float,
            min_weight: float) -> str | None:
  korean, latin, other = weights
  total = korean + latin + other
  if total < min_weight:
    return None
  if korean / total >= korean_share:
    return 'ko'
  if latin / total >= english_share:
    return 'en'
  return None


def detect(text: str | None, *, data: Sequence[str] = ()) -> str | None:
  """'ko', 'en', or None for a text with no words (numbers, SQL, emoji) or a mixed one.

  Korean when Korean words are ≥ KOREAN_SHARE of the word weight, English when
  Latin words are ≥ ENGLISH_SHARE (see the module docstring for the weights).
  Another script (Chinese, Russian, ...) is None too: it is neither. data: the
  tool results the text may quote (`Rollout.tool_results`); copied words weigh 0.
  """
  return _decide(word_weights(text or '', data), KOREAN_SHARE, ENGLISH_SHARE, MIN_WEIGHT)


def thinking_language(text: str | None) -> str | None:
  """The language a reasoning section is written in: `detect` on its prose, with quoted material
  (double quotes, “…”, 「…」, 『…』) left out. "The noun "가방" ends in "방", so the particle is "을"."
  is English reasoning about Korean text; the paper's hybrid contract asks for English reasoning,
  not for English data."""
  return detect(_QUOTED.sub(' ', text or ''))


def classify_prompt(text: str | None) -> str | None:
  """The prompt's language, decided up front; None (no language penalty) unless it is clear.

  Stricter than `detect`: Korean needs PROMPT_KOREAN_SHARE of the word weight,
  English PROMPT_ENGLISH_SHARE, and the prompt at least MIN_PROMPT_WEIGHT
  (one plain word). "Translate into English: 안녕하세요 반갑습니다" is mixed,
  hence None: either answer language is defensible.
  """
  return _decide(word_weights(text or ''), PROMPT_KOREAN_SHARE, PROMPT_ENGLISH_SHARE, MIN_PROMPT_WEIGHT)


def mismatch(prompt_language: str | None, response: str | None, *, data: Sequence[str] = (),
             judge: Callable[..., bool | None] | None = None) -> bool:
  """Whether the response is not in the prompt's language: the language penalty's indicator.

  prompt_language: from `classify_prompt` ('ko', 'en' or None). None ⇒ False
  (ambiguous prompts get no penalty). A missing or blank response ⇒ False: the
  format check scores it. A response with no words (a bare number, a table of
  figures, SQL only, or only words copied from `data`, the tool results the
  agent read) ⇒ False: it is readable in any language.

  Otherwise True when the response is detected as the other language, or when
  the prompt's language is nearly absent from it (under ABSENT_SHARE, e.g. a
  Chinese answer); False when it is detected as the prompt's language. A mixed
  response goes to `judge` if one is given (criterion 'language'; a failed
  verdict gives no penalty and is counted in `judge.stats`), else False.

  The rule is symmetric, so English prompts answered in Korean are penalised
  too, as docs/rl.md's reward says. The paper's reported figure is Korean →
  English only: compute `language_mismatch` over Korean prompts alone.
  """
  return mismatch_verdict(prompt_language, response, data=data, judge=judge)[0]


def mismatch_verdict(prompt_language: str | None, response: str | None, *, data: Sequence[str] = (),
                     judge: Callable[..., bool | None] | None = None) -> tuple[bool, bool]:
  """(`mismatch`, whether the judge decided it): True only where the rules left the response mixed and
  the judge gave a verdict, so a caller can count such responses as decided."""
  if prompt_language is None:
    return False, False
  if prompt_language not in LANGUAGES:
    raise ValueError(f'prompt_language must be one of {LANGUAGES} or None (from classify_prompt), '
                     f'got {prompt_language!r}')
  if response is None or not response.strip():
    return False, False
  weights = word_weights(response, data)
  korean, latin, other = weights
  total = korean + latin + other
  if total < MIN_WEIGHT:
    return False, False
  language = _decide(weights, KOREAN_SHARE, ENGLISH_SHARE, MIN_WEIGHT)
  if language is not None:
    return language != prompt_language, False
  if (korean if prompt_language == 'ko' else latin) / total < ABSENT_SHARE:
    return True, False
  if judge is None:
    return False, False
  verdict = judge('', LANGUAGE_NAMES[prompt_language], response, criterion='language')
  return verdict is False, verdict is not None
