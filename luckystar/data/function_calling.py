"""Seeded bilingual function-calling tasks: JSON tool schemas and gold calls.

Gold answers use BFCL's ground-truth format — `[{function_name: {arg: [allowed values]}}]`,
with "" among the allowed values marking an optional argument that may be omitted — so
the one checker in `luckystar.rewards.function_call` scores both these and real BFCL data.
Categories follow BFCL: simple (one function shown, one call), multiple (several shown,
one call), parallel (one function, several calls), parallel_multiple.
"""

import json
import random
from typing import Iterator

from luckystar.data.examples import Example, dedupe, split_of
from luckystar.data.korean import attach
from luckystar.data.nl2sql import EN_CITIES, KO_CITIES
from luckystar.tokenizer import formats


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
  return {'name': name, 'description': description,
          'parameters': {'type': 'dict', 'properties': properties, 'required': required}}


FUNCTIONS = {
    'get_weather': _fn('get_weather', 'Current weather for a city.', {
        'city': {'type': 'string', 'description': 'City name, e.g. Seoul or 서울.'},
        'unit': {'type': 'string', 'enum': ['celsius', 'fahrenheit'], 'description': 'Default celsius.'}},
        ['city']),
    'convert_currency': _fn('convert_currency', 'Convert an amount between currencies.', {
        'amount': {'type': 'float', 'description': 'Amount to convert.'},
        'from_currency': {'type': 'string', 'description': 'ISO code, e.g. KRW.'},
        'to_currency': {'type': 'string', 'description': 'ISO code, e.g. USD.'}},
        ['amount', 'from_currency', 'to_currency']),
    'get_stock_price': _fn('get_stock_price', 'Latest stock price for a ticker symbol.', {
        'ticker': {'type': 'string', 'description': 'Ticker symbol, e.g. 005930.KS.'}}, ['ticker']),
    'search_orders': _fn('search_orders', 'Search customer orders.', {
        'customer_name': {'type': 'string', 'description': 'Exact customer name.'},
        'status': {'type': 'string', 'enum': ['paid', 'shipped', 'cancelled'], 'description': 'Optional filter.'},
        'limit': {'type': 'integer', 'description': 'Maximum results, default 10.'}},
        ['customer_name']),
    'calculate_loan_payment': _fn('calculate_loan_payment', 'Monthly payment of a fixed-rate loan.', {
        'principal': {'type': 'float', 'description': 'Loan amount.'},
        'annual_rate': {'type': 'float', 'description': 'Annual interest rate in percent.'},
        'years': {'type': 'integer', 'description': 'Loan term in years.'}},
        ['principal', 'annual_rate', 'years']),
    'translate_text': _fn('translate_text', 'Translate text into a target language.', {
        'text': {'type': 'string', 'description': 'Text to translate.'},
        'target_language': {'type': 'string', 'enum': ['ko', 'en', 'ja'], 'description': 'Target language.'}},
        ['text', 'target_language']),
}

TICKERS = (('Samsung Electronics', '삼성전자', '005930.KS'), ('SK hynix', 'SK하이닉스', '000660.KS'),
           ('NAVER', '네이버', '035420.KS'), ('Kakao', '카카오', '035720.KS'), ('Apple', '애플', 'AAPL'))
CUSTOMERS = ('김민수', '이서연', 'John Smith', '박지훈', 'Emily Davis', '최유진')
PHRASES = (('Good morning', '좋은 아침입니다'), ('Thank you for your order', '주문해 주셔서 감사합니다'),
           ('The meeting is delayed', '회의가 연기되었습니다'))


def _weather(rng):
  i = rng.randrange(len(KO_CITIES))
  unit = rng.choice((None, 'celsius', 'fahrenheit'))
  en_unit = f' in {unit}' if unit else ''
  ko_unit = {'celsius': ' 섭씨로', 'fahrenheit': ' 화씨로', None: ''}[unit]
  call = {'city': [EN_CITIES[i], KO_CITIES[i]], 'unit': [unit] if unit else ['celsius', '']}
  return (f"What's the weather in {EN_CITIES[i]}{en_unit}?", f'{KO_CITIES[i]} 날씨를{ko_unit} 알려 줘.',
          'get_weather', call)


def _currency(rng):
  amount = rng.choice((100, 250, 1000, 50000, 1200000))
  pair = rng.choice((('KRW', 'USD', '원', '달러'), ('USD', 'KRW', '달러', '원'), ('JPY', 'KRW', '엔', '원'),
                     ('EUR', 'USD', '유로', '달러')))
  call = {'amount': [float(amount)], 'from_currency': [pair[0]], 'to_currency': [pair[1]]}
  return (f'Convert {amount} {pair[0]} to {pair[1]}.',
          f'{amount}{attach(pair[2], "object")} {attach(pair[3], "direction")} 환전하면 얼마야?',
          'convert_currency', call)


def _stock(rng):
  en, ko, ticker = rng.choice(TICKERS)
  return (f'What is the stock price of {en} ({ticker})?', f'{ko}({ticker}) 주가 알려 줘.', 'get_stock_price',
          {'ticker': [ticker]})


def _orders(rng):
  name, status, limit = rng.choice(CUSTOMERS), rng.choice((None, 'paid', 'shipped', 'cancelled')), rng.choice(
      (None, 5, 20))
  status_en = f' with status {status}' if status else ''
  status_ko = {'paid': ' 결제 완료(paid) 상태인', 'shipped': ' 배송된(shipped)', 'cancelled': ' 취소된(cancelled)',
               None: ''}[status]
  limit_en, limit_ko = (f', at most {limit}', f' 최대 {limit}건') if limit else ('', '')
  call = {'customer_name': [name], 'status': [status] if status else [''], 'limit': [limit] if limit else [10, '']}
  return (f'Find orders of {name}{status_en}{limit_en}.', f'{name} 고객의{status_ko} 주문을{limit_ko} 찾아 줘.',
          'search_orders', call)


def _loan(rng):
  principal, rate, years = rng.choice((1e7, 5e7, 2e8, 3e8)), rng.choice((3.5, 4.2, 5.0, 6.1)), rng.choice(
      (5, 10, 20, 30))
  return (f'What is the monthly payment on a {int(principal)} won loan at {rate}% for {years} years?',
          f'{int(principal)}원을 연 {rate}% 금리로 {years}년 동안 빌리면 월 상환액이 얼마야?', 'calculate_loan_payment',
          {'principal': [principal], 'annual_rate': [rate], 'years': [years]})


def _translate(rng):
  en, ko = rng.choice(PHRASES)
  if rng.random() < 0.5:
    return (f'Translate "{en}" into Korean.', f'다음 문장을 한국어로 번역해 줘: "{en}"', 'translate_text',
            {'text': [en], 'target_language': ['ko']})
  return (f'Translate "{ko}" into English.', f'다음 문장을 영어로 번역해 줘: "{ko}"', 'translate_text',
          {'text': [ko], 'target_language': ['en']})


_DRAWS = (_weather, _currency, _stock, _orders, _loan, _translate)


def tool_system(functions: list[dict]) -> str:
  """The system turn that shows a model its tools, as `Tokenizer.render(tools=...)` lays them out, so a
  server's `tools` renders what training saw."""
  return formats.tools_text(functions)


def generate(seed: int = 0, count: int = 1500) -> Iterator[Example]:
  rng = random.Random(f'function_calling:{seed}')
  for _ in range(count):
    category = rng.choice(('simple', 'multiple', 'parallel', 'parallel_multiple'))
    draws = [rng.choice(_DRAWS)]
    if category == 'parallel':
      draws.append(draws[0])
    elif category == 'parallel_multiple':
      draws.append(rng.choice([d for d in _DRAWS if d is not draws[0]]))
    calls = [draw(rng) for draw in draws]
    if len({json.dumps(c[3], sort_keys=True) for c in calls}) < len(calls):
      continue  # a parallel pair that drew the same call twice
    names = [c[2] for c in calls]
    shown = list(dict.fromkeys(names))
    if category in ('multiple', 'parallel_multiple'):
      shown += rng.sample([n for n in FUNCTIONS if n not in shown], 2)
      rng.shuffle(shown)
    functions = [FUNCTIONS[n] for n in shown]
    ground_truth = [{name: args} for (_, _, name, args) in calls]
    en = ' '.join(c[0] for c in calls) if len(calls) > 1 else calls[0][0]
    ko = ' 그리고 '.join(c[1] for c in calls) if len(calls) > 1 else calls[0][1]
    split = split_of(en, seed)
    for language, prompt in (('en', en), ('ko', ko)):
      yield Example(
          id=f'fc-{category}-{language}-{rng.getrandbits(32):08x}', task='function_calling', language=language,
          split=split, prompt=prompt, answer=json.dumps(ground_truth, ensure_ascii=False),
          system=tool_system(functions), difficulty=1 + (category != 'simple') + (category == 'parallel_multiple'),
          meta={'category': category, 'functions': functions, 'ground_truth': ground_truth})


def suite(seed: int = 0, count: int = 1500) -> list[Example]:
  return dedupe(generate(seed, count))
