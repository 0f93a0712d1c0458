"""Seeded bilingual math word problems with step-by-step traces (English and Korean).

Each template draws numbers, then states the same problem in English and Korean
with the same steps in both languages, so the English-vs-Korean thinking ablation
(paper Table 1) compares traces of identical content.

A trace sets the problem up step by step as one arithmetic expression (`meta['expression']`,
the last step's), and the reasoning-mode conversation computes it with the `calculator` tool
(`luckystar.tools.calculator`) before answering: the agent reasons, the tool does the digits.
A 5M-parameter model does not learn multi-digit arithmetic in its weights at our budget, even
from scratchpad traces (docs/models.md), while copying numbers into an expression and
a tool's result into the answer is what it does well.
"""

import random
from fractions import Fraction
from typing import Callable, Iterator

from luckystar.data.examples import Example, dedupe, split_of
from luckystar.data.korean import attach
from luckystar.tools.calculator import format_value

KO_NAMES = ('민준', '서연', '지우', '하은', '도윤', '수아', '예준', '지호', '윤서', '현우', '채원', '준서')
EN_NAMES = ('Alice', 'Ben', 'Chloe', 'David', 'Emma', 'Frank', 'Grace', 'Henry', 'Ivy', 'Jack', 'Kate', 'Leo')
ITEMS = (('apples', '사과'), ('pencils', '연필'), ('books', '책'), ('stickers', '스티커'), ('cookies', '쿠키'),
         ('marbles', '구슬'), ('notebooks', '공책'), ('oranges', '귤'))


class _Problem:
  """Collects the English and Korean text of one problem as it is built."""

  def __init__(self, rng: random.Random):
    self.rng = rng
    i = rng.randrange(len(KO_NAMES))
    self.name_en, self.name_ko = EN_NAMES[i], KO_NAMES[i]
    self.item_en, self.item_ko = rng.choice(ITEMS)
    self.steps_en: list[str] = []
    self.steps_ko: list[str] = []

  def step(self, en: str, ko: str):
    self.steps_en.append(en)
    self.steps_ko.append(ko)


def _shopping(p: _Problem):
  have, bought, gave = p.rng.randint(5, 60), p.rng.randint(2, 40), p.rng.randint(1, 30)
  gave = min(gave, have + bought - 1)
  answer = have + bought - gave
  p.step(f'{p.name_en} starts with {have} and buys {bought}: {have} + {bought}.',
         f'{attach(p.name_ko, "topic")} 처음에 {have}개가 있고 {bought}개를 사므로 {have} + {bought}입니다.')
  expression = f'{have} + {bought} - {gave}'
  p.step(f'Then gives away {gave}: {expression}.', f'그다음 {gave}개를 주므로 {expression}입니다.')
  return (f'{p.name_en} has {have} {p.item_en}, buys {bought} more, and then gives {gave} to a friend. '
          f'How many {p.item_en} does {p.name_en} have now?',
          f'{attach(p.name_ko, "topic")} {attach(p.item_ko, "object")} {have}개 가지고 있습니다. {bought}개를 더 사고 친구에게 {gave}개를 주었습니다. '
          f'{p.name_ko}에게 남은 {attach(p.item_ko, "topic")} 몇 개입니까?', answer, 1, expression)


def _boxes(p: _Problem):
  boxes, per_box, extra = p.rng.randint(3, 25), p.rng.randint(4, 24), p.rng.randint(0, 15)
  answer = boxes * per_box + extra
  p.step(f'{boxes} boxes with {per_box} each: {boxes} × {per_box}.',
         f'상자 {boxes}개에 {per_box}개씩이므로 {boxes} × {per_box}입니다.')
  expression = f'{boxes} × {per_box} + {extra}'
  p.step(f'Add the {extra} loose ones: {expression}.', f'낱개 {extra}개를 더하면 {expression}입니다.')
  return (f'A store has {boxes} boxes of {p.item_en} with {per_box} in each box, plus {extra} loose {p.item_en}. '
          f'How many {p.item_en} are there in total?',
          f'가게에 {attach(p.item_ko, "subject")} {per_box}개씩 든 상자가 {boxes}개 있고, 낱개로 {extra}개가 더 있습니다. '
          f'{attach(p.item_ko, "topic")} 모두 몇 개입니까?', answer, 1, expression)


def _change(p: _Problem):
  price, count = p.rng.randint(3, 90) * 100, p.rng.randint(2, 9)
  cost = price * count
  paid = ((cost // 10000) + 1) * 10000
  answer = paid - cost
  p.step(f'Cost: {count} × {price} won.', f'가격은 {count} × {price}원입니다.')
  expression = f'{paid} - {count} × {price}'
  p.step(f'Change: {expression} won.', f'거스름돈은 {expression}원입니다.')
  return (f'{p.name_en} buys {count} {p.item_en} at {price} won each and pays with {paid} won. '
          f'How much change, in won, does {p.name_en} get?',
          f'{attach(p.name_ko, "topic")} 한 개에 {price}원인 {attach(p.item_ko, "object")} {count}개 사고 {paid}원을 냈습니다. '
          f'거스름돈은 몇 원입니까?', answer, 2, expression)


def _average(p: _Problem):
  scores = [p.rng.randint(50, 100) for _ in range(p.rng.randint(3, 5))]
  answer = Fraction(sum(scores), len(scores))
  listed, added = ', '.join(map(str, scores)), ' + '.join(map(str, scores))
  p.step(f'Sum of the scores: {added}.', f'점수의 합은 {added}입니다.')
  expression = f'({added}) / {len(scores)}'
  p.step(f'Divide by {len(scores)} tests: {expression}.', f'시험 {len(scores)}번으로 나누면 {expression}입니다.')
  return (f"{p.name_en}'s test scores are {listed}. What is the average score?",
          f'{p.name_ko}의 시험 점수는 {listed}점입니다. 평균 점수는 몇 점입니까?', answer, 2, expression)


def _discount(p: _Problem):
  price, percent = p.rng.randint(2, 50) * 1000, p.rng.choice((10, 15, 20, 25, 30, 40, 50))
  answer = price - Fraction(price * percent, 100)
  p.step(f'{percent}% of {price} is {price} × {percent} / 100.', f'{price}의 {percent}%는 {price} × {percent} / 100입니다.')
  expression = f'{price} - {price} × {percent} / 100'
  p.step(f'Sale price: {expression} won.', f'할인 가격은 {expression}원입니다.')
  return (f'A jacket costs {price} won and is on sale for {percent}% off. What is the sale price in won?',
          f'{price}원짜리 재킷을 {percent}% 할인해서 판매합니다. 할인된 가격은 몇 원입니까?', answer, 2, expression)


def _speed(p: _Problem):
  speed, hours, minutes = p.rng.randint(30, 110), p.rng.randint(1, 5), p.rng.choice((0, 15, 30, 45))
  answer = speed * (Fraction(hours) + Fraction(minutes, 60))
  p.step(f'Time: {hours} h {minutes} min = {hours} + {minutes} / 60 hours.',
         f'시간은 {hours}시간 {minutes}분 = {hours} + {minutes} / 60시간입니다.')
  expression = f'{speed} × ({hours} + {minutes} / 60)'
  p.step(f'Distance: {expression} km.', f'거리는 {expression}km입니다.')
  return (f'A car drives at {speed} km/h for {hours} hours and {minutes} minutes. How many kilometres does it go?',
          f'자동차가 시속 {speed}km로 {hours}시간 {minutes}분 동안 달렸습니다. 몇 km를 갔습니까?', answer, 2, expression)


def _ratio(p: _Problem):
  a, b = p.rng.randint(1, 7), p.rng.randint(1, 7)
  unit = p.rng.randint(2, 30)
  total = (a + b) * unit
  answer = a * unit
  p.step(f'The ratio {a}:{b} has {a} + {b} parts; one part is {total} / ({a} + {b}).',
         f'비율 {a}:{b}에서 전체는 {a} + {b}부분이고, 한 부분은 {total} / ({a} + {b})입니다.')
  expression = f'{a} × {total} / ({a} + {b})'
  p.step(f'{p.name_en} gets {a} parts: {expression}.', f'{attach(p.name_ko, "topic")} {a}부분을 받으므로 {expression}입니다.')
  return (f'{p.name_en} and a sibling share {total} {p.item_en} in the ratio {a}:{b}. '
          f'How many does {p.name_en} get?',
          f'{attach(p.name_ko, "with")} 동생이 {p.item_ko} {total}개를 {a}:{b}의 비율로 나눕니다. {attach(p.name_ko, "topic")} 몇 개를 받습니까?',
          answer, 3, expression)


def _savings(p: _Problem):
  start, weekly, weeks = p.rng.randint(0, 50) * 1000, p.rng.randint(1, 20) * 1000, p.rng.randint(2, 12)
  saved = weekly * weeks
  spent = p.rng.randint(0, saved // 1000) * 1000
  answer = start + saved - spent
  p.step(f'Saved over {weeks} weeks: {weekly} × {weeks}.', f'{weeks}주 동안 모은 돈은 {weekly} × {weeks}원입니다.')
  expression = f'{start} + {weekly} × {weeks} - {spent}'
  p.step(f'Total: {expression} won.', f'합계는 {expression}원입니다.')
  return (f'{p.name_en} has {start} won, saves {weekly} won every week for {weeks} weeks, then spends {spent} won. '
          f'How many won does {p.name_en} have?',
          f'{attach(p.name_ko, "topic")} {start}원이 있고 매주 {weekly}원씩 {weeks}주 동안 저축한 뒤 {spent}원을 썼습니다. '
          f'{p.name_ko}에게 남은 돈은 몇 원입니까?', answer, 3, expression)


def _area(p: _Problem):
  width, height, cut = p.rng.randint(4, 30), p.rng.randint(4, 30), p.rng.randint(1, 3)
  answer = width * height - cut * cut
  p.step(f'Area of the rectangle: {width} × {height}.', f'직사각형의 넓이는 {width} × {height}입니다.')
  expression = f'{width} × {height} - {cut} × {cut}'
  p.step(f'Remove the {cut} × {cut} square: {expression}.', f'{cut} × {cut} 정사각형을 빼면 {expression}입니다.')
  return (f'A rectangle is {width} cm by {height} cm. A {cut} cm by {cut} cm square is cut out of a corner. '
          f'What area, in square centimetres, remains?',
          f'가로 {width}cm, 세로 {height}cm인 직사각형의 한 귀퉁이에서 한 변이 {cut}cm인 정사각형을 잘라 냈습니다. '
          f'남은 넓이는 몇 제곱센티미터입니까?', answer, 3, expression)


TEMPLATES: tuple[Callable[[_Problem], tuple], ...] = (
    _shopping, _boxes, _change, _average, _discount, _speed, _ratio, _savings, _area)


def generate(seed: int = 0, per_template: int = 300) -> Iterator[Example]:
  """Each drawn problem yields an English and a Korean example (same numbers, same steps)."""
  rng = random.Random(f'math:{seed}')
  for template in TEMPLATES:
    for _ in range(per_template):
      problem = _Problem(rng)
      question_en, question_ko, answer, difficulty, expression = template(problem)
      answer = format_value(Fraction(answer))
      thinking_en, thinking_ko = ' '.join(problem.steps_en), ' '.join(problem.steps_ko)
      # One split for the pair, so a translation never leaks across splits.
      split = split_of(question_en, seed)
      for language, question, response in (('en', question_en, f'The answer is {answer}.'),
                                           ('ko', question_ko, f'정답은 {answer}입니다.')):
        yield Example(
            id=f'math-{template.__name__[1:]}-{language}-{rng.getrandbits(32):08x}', task='math',
            language=language, split=split, prompt=question, answer=answer, thinking=thinking_en,
            thinking_ko=thinking_ko, response=response, difficulty=difficulty,
            meta={'template': template.__name__[1:], 'expression': expression})


def suite(seed: int = 0, per_template: int = 300) -> list[Example]:
  return dedupe(generate(seed, per_template))
