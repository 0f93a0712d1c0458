"""Concise chat verifier: does a response give the reference answer, and only it? (`luckystar.data.chat`)

A response is correct when
1. it names the reference as a word of its own: case, and spacing or punctuation inside it, are free
   ('mexico-city' is 'Mexico City'), but no letter or digit runs into it from before, and no Latin letter,
   digit or decimal part after it: '1월' is not in '11월', nor '42' in '142', '420' or '42.5'. Hangul may
   follow, as Korean particles do ('도쿄입니다', '1월입니다');
2. a numeric reference is instead the response's last number, thousands separators allowed ('7 hours is
   420 minutes', '1,140분입니다'), so '420 or 480' is a hedge, not an answer;
3. it names no other answer of its kind (`data.chat.ANSWERS`; none for an answer of no kind there), in
   either language, that the prompt does not name itself ('서울 (Seoul)입니다' names one answer twice):
   'Monday, Tuesday, …, or Sunday.' and '서울, 도쿄, 베이징, 파리 중 하나입니다.' list candidates and
   are wrong, while 'The day after Sunday is Monday.' restates the question and is right.

(A plain substring test would grade all three kinds of wrong answer above as correct.)
"""

import functools
import re

from luckystar.data import chat

_NUMBER = re.compile(r'\d+(?:,\d{3})*(?:\.\d+)?')


@functools.lru_cache(maxsize=4096)
def _pattern(answer: str) -> re.Pattern:
  """`answer` as a word of its own in casefolded text (rule 1 of the module docstring)."""
  pieces = [re.escape(piece) for piece in re.split(r'[\W_]+', answer.casefold()) if piece]
  return re.compile(r'(?<![^\W_])' + r'[\W_]*'.join(pieces) + r'(?![0-9a-z]|[.,]\d)')


def names(text: str, answer: str) -> bool:
  """Whether `text` names `answer` as a word of its own."""
  return bool(_pattern(answer).search(text.casefold()))


def is_correct(response: str, answer: str, *, prompt: str = '') -> bool:
  """The module docstring's three rules; the other answers are those of every kind `answer` is one of."""
  if answer.isdigit():
    numbers = _NUMBER.findall(response)
    return bool(numbers) and numbers[-1].replace(',', '') == answer
  if not names(response, answer):
    return False
  kinds = [groups for groups in chat.ANSWERS.values() if any(answer in group for group in groups)]
  others = {name for groups in kinds for group in groups if answer not in group for name in group}
  return not any(names(response, other) and not names(prompt, other) for other in others)
