"""Multiple-choice verifier: which option letter does a response choose? (KoBALT: 10 options, A-J)

Reads only the response section. The rules go from explicit to weak; the
first rule that finds any letter decides, and within it every letter found
must agree, or the answer is ambiguous (None). A hedge is None too: a policy
must not win by naming several. None is no choice, so `is_correct` (and the
RL reward through it) scores a hedge as wrong, never as unscorable. A hedge
offers a second letter as a possible answer, wherever it stands:

- chained onto the chosen letter, with or without softening words: 'A or B',
  'A 또는 B', 'A (or B)', 'A, or possibly B', 'A, maybe B', 'A 혹은 아마 B';
- opening a sentence or clause: 'Or B.', 'Alternatively, B', 'If not, B',
  '아니면 B', '혹은 B';
- with a modal or 'also': 'it could also be B', 'the answer might be B',
  'B might also be correct', 'B is also possible', 'B is correct too',
  'B일 수도 있습니다', 'B도 정답일 수 있습니다', 'B도 가능합니다'.

Naming other letters to discuss or reject them is no hedge ('B and C are
plausible, but the answer is C', 'A는 틀렸습니다', 'C, not D').

1. Answer markers: 'answer is C', 'Answer: (C)', 'the correct option is C',
   'I choose C', '\\boxed{C}', '정답: C', '정답은 C입니다', '답은 C', 'C가
   정답', 'C is correct'. A letter a marker names more than once is fine;
   two different ones ('the answer is A ... the answer is B') are None.
2. A leading letter, labelled or followed by Hangul: 'B', '(C)', '**G**',
   'G. 사과를', 'C) because', 'D입니다' (but not 'A B C D': see rule 4).
3. A letter in brackets or bold anywhere: 'I think (B)', 'I'd say **E**'.
4. A lone capital letter anywhere: 'I'd go with C', '저는 C라고 생각합니다'.

'A' and 'I' are also English words: outside an answer marker, 'A' or 'I'
followed by a lowercase word is read as the article or pronoun ('A good
choice is D' → D, 'I think C' → C), except before 'or', 'and', 'is'
('A or B', 'A is correct'). A letter glued to other ASCII letters, digits or
an apostrophe is never a choice ('DNA', 'H2O', "I'd"); Hangul after it is
fine ('E입니다'). Full-width and circled letters (Ｃ, Ⓒ) count as C.

A letter past the option count ('K' of 10) is never a valid choice: when the
deciding rule points at one, the result is None.
"""

import re
import string
import unicodedata

KOBALT_NUM_OPTIONS = 10

_LETTER = r'(?P<letter>[A-Z])(?![A-Za-z0-9\'’_])'
_OPEN = r'[\s(\[{<*"“\'‘]*'   # what may wrap a letter on its left: brackets, bold, quotes
_COPULA = (r'(?:is|was|would\s+be|should\s+be|will\s+be|must\s+be|seems\s+to\s+be)'
           r'(?:\s+(?:probably|likely|most\s+likely|definitely|clearly))?')
_ANSWER_MARKERS = tuple(re.compile(pattern, re.IGNORECASE) for pattern in (
    # 'the answer is C', 'Answer: (C)', 'final answer would be option C'
    rf'answer\s*(?:{_COPULA}\s*)?[:=：\-]?\s*(?:(?:option|choice)\s*)?{_OPEN}(?-i:{_LETTER})',
    # 'the correct option is C', 'my choice: C' (a bare 'option C' is a mention, not a choice)
    rf'(?:option|choice)\s*(?:{_COPULA}\s*[:：]?|[:：])\s*{_OPEN}(?-i:{_LETTER})',
    # 'I choose C', 'I'd go with option C'
    rf'\b(?:choose|chose|pick|picked|select|selected|go\s+with|going\s+with)\s+(?:(?:option|choice)\s*)?'
    rf'{_OPEN}(?-i:{_LETTER})',
    # '\boxed{C}', '\boxed{\text{C}}'
    rf'\\boxed\{{\s*(?:\\text(?:bf)?\{{)?\s*\(?(?-i:{_LETTER})',
    # '정답: C', '정답은 바로 (C)입니다', '최종 답은 C', '선택: C'
    rf'(?:정답|답|선택)\s*(?:은|는|:|：|=)?\s*(?:바로\s*)?{_OPEN}(?-i:{_LETTER})',
    # 'C가 정답', 'C번이 맞습니다', 'C is correct', 'C is the answer'
    rf'(?<![A-Za-z0-9])(?-i:{_LETTER})[)\]*]*\s*(?:번)?\s*(?:가|이|은|는)?\s*'
    r'(?:정답(?!이\s*아)|맞습니다|맞아요|옳습니다)',
    rf'(?<![A-Za-z0-9])(?-i:{_LETTER})[)\]*]*\s+is\s+(?:the\s+)?(?:correct|right|best|answer)\b',
))
# Words that soften a second letter without withdrawing it: 'or possibly B', 'or else option B', '또는 아마 B'.
_SOFTENING = (r'(?:\s*(?:\b(?:also|else|even|maybe|perhaps|possibly|probably|just|option|choice)\b'
              r'|아마도?|어쩌면))*')
# A second letter chained on by 'or', 'and', '/', ',', '또는' ... turns one assertion into a hedge.
_HEDGE = re.compile(r'[)\]*]*\s*\(?(?:\s*(?:,|/|\bor\b|\band\b|\bnor\b|또는|혹은|아니면|이나|나|와|과|및|'
                    rf'(?i:maybe|perhaps|possibly)))+{_SOFTENING}\s*{_OPEN}{_LETTER}')
_POSSIBLE = r'(?:correct|right|possible|valid|acceptable|an?\s+(?:option|answer)|the\s+answer)'
# A letter offered as a possible answer anywhere in the response (see the module docstring).
_ALTERNATIVES = tuple(re.compile(pattern, re.IGNORECASE) for pattern in (
    # 'Or B.', 'Alternatively, B', 'If not, B', '아니면 B' opening a sentence or clause
    r'(?:^|[.;!?:]\s*|,\s*(?=if\b))(?:or|alternatively|otherwise|if\s+not|아니면|혹은|또는)\b[\s,]*'
    rf'{_SOFTENING}\s*{_OPEN}(?-i:{_LETTER})',
    # 'it could also be B', 'the answer might be option B'
    rf'\b(?:could|might|may)\s+(?:also\s+)?be\s+{_SOFTENING}\s*{_OPEN}(?-i:{_LETTER})',
    # 'B might also be correct', 'B is also possible', 'B is correct too'
    rf'(?<![A-Za-z0-9])(?-i:{_LETTER})[)\]*]*\s+(?:(?:could|might|may)\s+(?:also\s+)?be|(?:is|would\s+be)\s+also)'
    rf'\s+{_POSSIBLE}',
    rf'(?<![A-Za-z0-9])(?-i:{_LETTER})[)\]*]*\s+is\s+{_POSSIBLE}\s+(?:too|as\s+well)\b',
    # 'B일 수도 있습니다', 'B번도 정답일 수', 'B도 가능합니다'
    rf'(?<![A-Za-z0-9])(?-i:{_LETTER})[)\]*]*\s*(?:번)?\s*(?:(?:이|가)?\s*일\s*수도|도\s*(?:정답|답이|가능|맞))',
))
# A leading letter counts when a label ends it ('G.', 'C)', '**G**', 'B,') or Hangul follows ('D입니다'),
# not in a row of letters ('A B C D ...').
_LEADING = re.compile(rf'^{_OPEN}{_LETTER}(?=[.):\]}}>*,/]|$|\s?[가-힣])')
_WRAPPED = re.compile(r'(?:[(\[{<]\s*(?P<a>[A-Z])\s*[)\]}>]|\*\*\s*(?P<b>[A-Z])\s*\*\*)')
_LONE = re.compile(rf'(?<![A-Za-z0-9\'’_]){_LETTER}')
_ENGLISH_WORD_USE = re.compile(r'\s+(?!(?:or|and|nor|is)\b)[a-z]')   # after 'A'/'I': article, pronoun
_NEGATION = re.compile(r'[)\]*]*(?:\s*(?:가|이|는|은)\s*(?:(?:정답이\s*)?아[니닙닌냐]|틀)'   # 'A는 정답이 아닙니다', 'A는 틀림'
                       r'|\s+(?:is\s+not|isn\'t|is\s+wrong)\b)')
_WHITESPACE = re.compile(r'\s+')
_WHOLE_RESPONSE_LETTER = re.compile(r'^[\s(\[{<*"“\'‘]*(?P<letter>[A-Za-z])[\s)\]}>*"”\'’.:]*$')


def _is_english_word(text: str, match: re.Match) -> bool:
  """'A good choice', 'I think': the letter is an English word, not an option."""
  letter = match.group('letter')
  return letter in 'AI' and _ENGLISH_WORD_USE.match(text, match.end('letter')) is not None


def _is_ruled_out(text: str, match: re.Match) -> bool:
  """'A is wrong', 'A는 정답이 아닙니다': the letter is named only to be rejected."""
  return _NEGATION.match(text, match.end('letter')) is not None


def _with_hedges(text: str, match: re.Match) -> list[str]:
  """The matched letter plus any letters hedged onto it ('C or D')."""
  letters = [match.group('letter')]
  position = match.end('letter')
  while (hedge := _HEDGE.match(text, position)) and not _is_english_word(text, hedge):
    letters.append(hedge.group('letter'))
    position = hedge.end('letter')
  return letters


def _marked_letters(text: str) -> list[str]:
  letters = []
  for pattern in _ANSWER_MARKERS:
    for match in pattern.finditer(text):
      # After a marker 'A' is the option ('the answer is A because'); 'I' may still be the pronoun.
      if match.group('letter') == 'I' and _is_english_word(text, match):
        continue
      if _is_ruled_out(text, match):   # '정답은 A가 아니라 B': A is not the choice
        continue
      letters += _with_hedges(text, match)
  return letters


def _leading_letters(text: str) -> list[str]:
  if whole := _WHOLE_RESPONSE_LETTER.match(text):   # a bare 'c' or '(b).' is a choice in any case
    return [whole.group('letter').upper()]
  match = _LEADING.match(text)
  if match is None or _is_english_word(text, match) or _is_ruled_out(text, match):
    return []
  return _with_hedges(text, match)


def _alternative_letters(text: str) -> set[str]:
  """Letters the response offers as possible answers besides whatever it chose ('..., but it could also be B')."""
  return {match.group('letter') for pattern in _ALTERNATIVES for match in pattern.finditer(text)
          if not _is_english_word(text, match) and not _is_ruled_out(text, match)}


def _wrapped_letters(text: str) -> list[str]:
  return [match.group('a') or match.group('b') for match in _WRAPPED.finditer(text)]


def _lone_letters(text: str) -> list[str]:
  return [match.group('letter') for match in _LONE.finditer(text)
          if not _is_english_word(text, match) and not _is_ruled_out(text, match)]


_RULES = (_marked_letters, _leading_letters, _wrapped_letters, _lone_letters)


def option_letters(num_options: int = KOBALT_NUM_OPTIONS) -> str:
  """'ABCDEFGHIJ' for 10 options."""
  if not 1 <= num_options <= 26:
    raise ValueError(f'num_options must be between 1 and 26 (one letter each), got {num_options}')
  return string.ascii_uppercase[:num_options]


def extract_choice(response: str, num_options: int = KOBALT_NUM_OPTIONS) -> str | None:
  """The option letter the response chooses, or None (no letter, a hedge, or past the option count)."""
  if not isinstance(response, str):
    raise TypeError(f"response must be str, got {type(response).__name__}; pass '' for a missing response")
  valid = option_letters(num_options)
  # NFKC: Ｃ, Ⓒ → C. One space per run also keeps the patterns' neighbouring \s* linear on junk.
  text = _WHITESPACE.sub(' ', unicodedata.normalize('NFKC', response)).strip()
  for rule in _RULES:
    letters = set(rule(text))
    if letters:
      if len(letters) > 1:
        return None
      (letter,) = letters
      if (_alternative_letters(text) - {letter}) & set(valid):   # another option offered as well: a hedge
        return None
      return letter if letter in valid else None
  return None


def is_correct(response: str, gold_letter: str, num_options: int = KOBALT_NUM_OPTIONS) -> bool:
  """Does the response choose gold_letter (case-insensitive)? A missing choice or a hedge is False."""
  gold = gold_letter.strip().upper() if isinstance(gold_letter, str) else gold_letter
  if gold not in tuple(option_letters(num_options)):
    raise ValueError(f'gold_letter {gold_letter!r} is not one of the {num_options} options '
                     f'{option_letters(num_options)}; check the data file')
  return extract_choice(response, num_options) == gold
