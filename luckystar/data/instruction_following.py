"""Verifiable instruction following (IFEval-style), generated and checked by rule.

Each prompt is a held-out concise-chat question with one constraint appended, in the question's
language: a length bound, a format (JSON object, bullet list), a response language, lowercase, or a
closing word. `generate(seed, per_language)` draws them deterministically; `follows(example,
response)` checks the constraint on the response section only (not whether the answer is right).

    max_words  "Answer in at most 5 words."                       1 ≤ whitespace words ≤ 5
    json       'Reply only with a JSON object whose key "answer" …' json.loads gives a dict with "answer"
    bullets    "… exactly 3 bullet points, each starting with '- '" exactly 3 non-blank lines, all '- …'
    language   "Answer in Korean." (asked in English, and vice versa)  rewards.language.detect == target
    lowercase  "Answer in lowercase letters only." (English only)  no upper-case letter
    ends_with  'End your reply with the word "Done".'            last word, trailing punctuation aside
"""

import json
import random
import re

from luckystar.data import suites
from luckystar.data.examples import Example
from luckystar.rewards import language

KINDS = ('max_words', 'json', 'bullets', 'language', 'lowercase', 'ends_with')
CLOSING_WORDS = {'en': 'Done', 'ko': '끝'}
_LANGUAGE_NAMES = {('en', 'ko'): 'Korean', ('en', 'en'): 'English', ('ko', 'ko'): '한국어', ('ko', 'en'): '영어'}


def _instruction(kind: str, lang: str, param) -> str:
  if kind == 'max_words':
    return f'Answer in at most {param} words.' if lang == 'en' else f'{param}단어 이내로 답하세요.'
  if kind == 'json':
    return ('Reply only with a JSON object whose key "answer" holds your answer.' if lang == 'en'
            else '"answer" 키에 답을 담은 JSON 객체로만 답하세요.')
  if kind == 'bullets':
    return (f"Answer as exactly {param} bullet points, each on its own line starting with '- '." if lang == 'en'
            else f"'- '로 시작하는 글머리 기호 {param}개로, 한 줄에 하나씩 답하세요.")
  if kind == 'language':
    name = _LANGUAGE_NAMES[(lang, param)]
    return f'Answer in {name}.' if lang == 'en' else f'{name}로 답하세요.'
  if kind == 'lowercase':
    return 'Answer in lowercase letters only.'
  if kind == 'ends_with':
    return (f'End your reply with the word "{param}".' if lang == 'en'
            else f'답의 마지막 단어는 "{param}"이어야 합니다.')
  raise ValueError(f'unknown instruction kind {kind!r}; expected one of {KINDS}')


def generate(seed: int = 0, per_language: int = 16) -> list[Example]:
  """`per_language` prompts per language on held-out chat questions, constraints drawn in turn so every
  kind appears; deterministic in `seed`."""
  rng = random.Random(f'instruction_following:{seed}')
  questions = {lang: [e for e in suites.load('chat', 'heldout', seed=seed) if e.language == lang]
               for lang in ('en', 'ko')}
  examples = []
  for lang, pool in questions.items():
    kinds = [k for k in KINDS if not (k == 'lowercase' and lang == 'ko')]  # Hangul has no case
    for i in range(per_language):
      base, kind = pool[i % len(pool)], kinds[i % len(kinds)]
      param = {'max_words': rng.choice((3, 5, 8)), 'bullets': rng.choice((2, 3)),
               'language': 'ko' if lang == 'en' else 'en', 'ends_with': CLOSING_WORDS[lang]}.get(kind)
      examples.append(Example(id=f'if-{lang}-{i}-{kind}', task='chat', language=lang, split='heldout',
                              prompt=f'{base.prompt} {_instruction(kind, lang, param)}', answer=base.answer,
                              meta={'constraint': kind, 'param': param}))
  return examples


def follows(example: Example, response: str | None) -> bool:
  """Whether `response` meets the example's constraint (module docstring)."""
  kind, param, text = example.meta['constraint'], example.meta['param'], (response or '').strip()
  if not text:
    return False
  if kind == 'max_words':
    return len(text.split()) <= param
  if kind == 'json':
    try:
      value = json.loads(text)
    except ValueError:
      return False
    return isinstance(value, dict) and 'answer' in value
  if kind == 'bullets':
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return len(lines) == param and all(line.startswith('- ') and line[2:].strip() for line in lines)
  if kind == 'language':
    return language.detect(text) == param
  if kind == 'lowercase':
    return text == text.lower()
  if kind == 'ends_with':
    words = re.sub(r'[\s.!?。"\'”’]+$', '', text).split()
    return bool(words) and words[-1].endswith(param)
  raise ValueError(f'example {example.id}: unknown constraint {kind!r}; expected one of {KINDS}')
