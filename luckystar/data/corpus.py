"""Seeded bilingual (Korean/English) text for training the tokenizer.

Retrain the bundled tokenizer on it (deterministic, ~1 min):

    python -m luckystar.data.corpus --output=luckystar/assets/tokenizer.model

Two parts: every text field of the generated task suites (prompts, schemas,
tool docs, traces, answers, gold SQL — what the model will read and write),
and template sentences around real Korean and English strings from Faker's
`ko_KR` / `en_US` locale data (names, addresses, companies, jobs), for breadth.
"""

import argparse
import json
import pathlib
import random
from typing import Iterator, Sequence

import faker

from luckystar import tokenizer
from luckystar.data import suites
from luckystar.tasks import TASKS

_KO_TEMPLATES = (
    '{name}은(는) 사과를 {a}개 가지고 있고, {b}개를 더 샀습니다. 사과는 모두 몇 개입니까?',
    '{company}의 {job} {name} 님은 {city}에서 근무합니다.',
    '{name} 씨가 {a}원을 내고 {b}원짜리 물건을 샀다면 거스름돈은 얼마인가요?',
    '지난달 {company}의 매출은 {a}만 원이었고 이번 달은 {b}만 원입니다. 증가율을 구하세요.',
    '직원 테이블에서 부서별 평균 급여가 {a}원 이상인 부서를 찾아 주세요.',
    '{address}로 배송된 주문 중 {year}년 {month}월에 접수된 주문은 몇 건인가요?',
    '다음 중 빈칸에 들어갈 조사로 알맞은 것을 고르시오: "{word}( ) 좋아한다."',
    '답: {answer}입니다. 계산 과정을 간단히 설명하면 {a} 더하기 {b}는 {answer}입니다.',
    '안녕하세요! 무엇을 도와드릴까요? 오늘 {city}의 날씨는 맑겠습니다.',
    '재고가 {a}개 미만인 상품의 이름과 공급업체를 알려 주세요.',
    '{name} 님, 회의는 {month}월 {day}일 오후 {hour}시에 {company} 본사에서 열립니다.',
    '정답은 {letter}입니다.',
)
_EN_TEMPLATES = (
    '{name} has {a} apples and buys {b} more. How many apples does {name} have now?',
    'Step 1: add {a} and {b} to get {answer}. Step 2: the final answer is {answer}.',
    'List the departments of {company} whose average salary is above {a} dollars.',
    'How many orders shipped to {city} were placed in {month}/{year}?',
    "Let's think step by step. The table has {a} rows, and {b} of them match the filter.",
    '{name} works as a {job} at {company} in {city}.',
    'The answer is {letter}.',
    'Sure! Here is a short answer: {answer}.',
    'First, I need to join the orders table with the customers table on customer_id.',
    'The query returned {a} rows; the total revenue is {answer}.',
)
_SQL_TEMPLATES = (
    'SELECT name, salary FROM employees WHERE department_id = {a} ORDER BY salary DESC LIMIT {b};',
    "SELECT c.name, COUNT(o.id) AS orders FROM customers c JOIN orders o ON o.customer_id = c.id "
    "WHERE o.order_date >= '{year}-{month:02d}-01' GROUP BY c.name HAVING COUNT(o.id) > {b};",
    'SELECT AVG(amount) FROM transactions WHERE account_id IN (SELECT id FROM accounts WHERE balance > {a});',
    "SELECT product_name, stock FROM inventory WHERE stock < {b} AND supplier = '{company}';",
)


def _fields(rng: random.Random, fake_ko: faker.Faker, fake_en: faker.Faker, korean: bool) -> dict:
  fake = fake_ko if korean else fake_en
  a, b = rng.randint(1, 10_000), rng.randint(1, 500)
  return dict(name=fake.name(), company=fake.company(), job=fake.job(), city=fake.city(),
              address=fake.address().replace('\n', ' '), a=a, b=b, answer=a + b,
              year=rng.randint(2015, 2026), month=rng.randint(1, 12), day=rng.randint(1, 28),
              hour=rng.randint(1, 12), letter=rng.choice('ABCDEFGHIJ'),
              word=rng.choice(('사과', '책', '음악', '고양이', '바다', '커피', '학교', '친구')))


def _tool_call(rng: random.Random, fields: dict) -> str:
  call = {'tool_name': rng.choice(('execute_sql', 'get_weather', 'search_orders', 'send_email')),
          'parameters': {'query': rng.choice(_SQL_TEMPLATES).format(**fields), 'limit': fields['b'],
                         'city': fields['city']}}
  return json.dumps(call, ensure_ascii=False)


def suite_text(seed: int = 0, db_dir: str | None = None) -> Iterator[str]:
  """Every text field of the train and teacher splits of every task suite, and the chat preambles.
  Held-out text stays out, so evaluation prompts are as unseen to the tokenizer as to the model."""
  yield from tokenizer.PREAMBLES.values()
  for task in TASKS:
    for example in suites.load(task, seed=seed, db_dir=db_dir, curate=False):
      if example.split == 'heldout':
        continue
      for text in (example.prompt, example.answer, example.system, example.thinking, example.thinking_ko,
                   example.response):
        if text:
          yield text


def tokenizer_corpus(seed: int = 0, num_lines: int = 40_000, db_dir: str | None = None) -> Iterator[str]:
  """Deterministic lines of Korean, English, SQL and JSON text: the task suites, then templates."""
  yield from suite_text(seed, db_dir)
  yield from template_text(seed, num_lines)


def template_text(seed: int = 0, num_lines: int = 40_000) -> Iterator[str]:
  """Template sentences around Faker's real Korean and English names, places and companies."""
  rng = random.Random(seed)
  fake_ko, fake_en = faker.Faker('ko_KR'), faker.Faker('en_US')
  fake_ko.seed_instance(seed)
  fake_en.seed_instance(seed + 1)
  for _ in range(num_lines):
    kind = rng.random()
    fields = _fields(rng, fake_ko, fake_en, korean=kind < 0.5)
    if kind < 0.5:
      yield rng.choice(_KO_TEMPLATES).format(**fields)
    elif kind < 0.8:
      yield rng.choice(_EN_TEMPLATES).format(**fields)
    elif kind < 0.9:
      yield rng.choice(_SQL_TEMPLATES).format(**fields)
    else:
      yield _tool_call(rng, fields)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description='Train the bundled bilingual tokenizer.')
  parser.add_argument('--output', default=str(tokenizer.DEFAULT_PATH))
  parser.add_argument('--vocab_size', type=int, default=tokenizer.VOCAB_SIZE)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args(argv)
  proto = tokenizer.train(tokenizer_corpus(args.seed), args.vocab_size)
  pathlib.Path(args.output).write_bytes(proto)
  print(f'wrote {args.output}: {tokenizer.Tokenizer.from_sentencepiece(proto).vocab_size} pieces')


if __name__ == '__main__':
  main()
