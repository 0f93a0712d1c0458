"""Language detection on text we did not write, read at test time from installed packages.

Korean: Faker's ko_KR providers (names, jobs, companies, addresses, catch
phrases; faker is an install requirement) and humanize's ko_KR catalog
(installed with orbax-checkpoint). English: docstrings of the Python standard
library and the descriptions in our dependencies' METADATA.
"""

import importlib
import importlib.metadata
import inspect
import pathlib
import re

import faker
import hypothesis
import pytest
from faker.providers.job import ko_KR as faker_job_ko
from hypothesis import strategies as st

from luckystar.rewards import language

pytestmark = pytest.mark.fast

SAMPLES_PER_LANGUAGE = 400
ACCURACY_BAR = 0.99

_STDLIB_MODULES = (
    'argparse', 'asyncio', 'ast', 'bisect', 'calendar', 'codecs', 'collections', 'concurrent.futures',
    'configparser', 'contextlib', 'csv', 'dataclasses', 'datetime', 'decimal', 'difflib', 'email.message',
    'enum', 'fractions', 'functools', 'gettext', 'heapq', 'http.client', 'http.server', 'inspect', 'io',
    'ipaddress', 'itertools', 'json', 'logging', 'mailbox', 'operator', 'optparse', 'os', 'pathlib',
    'pickle', 'pprint', 'queue', 'random', 'sched', 'secrets', 'shutil', 'smtplib', 'socket', 'sqlite3',
    'statistics', 'string', 'subprocess', 'tarfile', 'tempfile', 'textwrap', 'threading', 'timeit',
    'tokenize', 'traceback', 'typing', 'unittest', 'urllib.parse', 'urllib.request', 'uuid', 'warnings',
    'weakref', 'zipfile')
_DEPENDENCIES = ('jax', 'flax', 'optax', 'orbax-checkpoint', 'grain', 'tensorstore', 'sentencepiece',
                 'ml-collections', 'chex', 'aqtp', 'math-verify', 'sqlglot', 'absl-py', 'numpy',
                 'safetensors', 'faker', 'tqdm', 'matplotlib', 'tensorboardX', 'pytest', 'hypothesis',
                 'nbclient', 'nbformat', 'ipykernel')
_PLAIN_WORD = re.compile(r'[a-z]+[,.;:]?')


def _prose_sentences(text: str) -> list[str]:
  """Sentences of ≥ 5 words, mostly plain lower-case words (not code, tables or signatures)."""
  sentences = []
  for sentence in re.split(r'(?<=[.!?])\s+', ' '.join(text.split())):
    words = sentence.split()
    if (5 <= len(words) <= 60 and '>>>' not in sentence and '```' not in sentence
        and sum(bool(_PLAIN_WORD.fullmatch(w)) for w in words) >= 0.6 * len(words)):
      sentences.append(sentence)
  return sentences


def english_samples() -> list[str]:
  texts = []
  for name in _STDLIB_MODULES:
    module = importlib.import_module(name)
    texts.append(module.__doc__ or '')
    for _, member in sorted(vars(module).items()):
      if (inspect.isclass(member) or inspect.isfunction(member)) and member.__module__ == module.__name__:
        texts.append(inspect.getdoc(member) or '')
  for distribution in _DEPENDENCIES:
    try:
      metadata = importlib.metadata.metadata(distribution)
    except importlib.metadata.PackageNotFoundError:
      continue
    texts += [metadata.get('Summary') or '', metadata.get_payload() or '']
  sentences = list(dict.fromkeys(s for text in texts for s in _prose_sentences(text)))
  return sentences[::max(1, len(sentences) // SAMPLES_PER_LANGUAGE)]


def _humanize_korean() -> list[str]:
  """The Korean msgstr entries of humanize's catalog (empty if humanize is absent)."""
  try:
    import humanize  # pylint: disable=g-import-not-at-top
  except ImportError:
    return []
  po = pathlib.Path(humanize.__file__).parent / 'locale' / 'ko_KR' / 'LC_MESSAGES' / 'humanize.po'
  if not po.is_file():
    return []
  strings = re.findall(r'^msgstr(?:\[\d\])? "(.+)"$', po.read_text(encoding='utf-8'), re.MULTILINE)
  return list(dict.fromkeys(s for s in strings if re.search('[가-힣]', s)))


def korean_samples() -> list[str]:
  """Faker ko_KR data as-is (jobs, catch phrases, addresses) and a few fields joined into one line."""
  fake = faker.Faker('ko_KR')
  fake.seed_instance(20240601)
  samples = list(faker_job_ko.Provider.jobs[::4])
  for _ in range(SAMPLES_PER_LANGUAGE // 4):
    samples += [fake.address(), fake.catch_phrase(), fake.bs(),
                ', '.join([fake.name(), fake.job(), fake.company(), fake.address()])]
  return samples + _humanize_korean()


def _accuracy(function, samples, expected):
  wrong = [s for s in samples if function(s) != expected]
  return 1 - len(wrong) / len(samples), wrong


@pytest.fixture(scope='module')
def corpora():
  return {'ko': korean_samples(), 'en': english_samples()}


@pytest.mark.parametrize('function', [language.detect, language.classify_prompt], ids=['detect', 'prompt'])
@pytest.mark.parametrize('expected', ['ko', 'en'])
def test_real_text_accuracy(corpora, function, expected):
  samples = corpora[expected]
  assert len(samples) >= 300, f'only {len(samples)} {expected} samples found in installed packages'
  accuracy, wrong = _accuracy(function, samples, expected)
  print(f'{function.__name__} {expected}: {accuracy:.2%} of {len(samples)} samples; wrong: {wrong[:5]}')
  assert accuracy >= ACCURACY_BAR, wrong[:20]


def test_real_text_mismatch(corpora):
  """A Korean prompt answered with English text is a mismatch, answered with Korean text it is not."""
  assert _accuracy(lambda s: language.mismatch('ko', s), corpora['en'], True)[0] >= ACCURACY_BAR
  assert _accuracy(lambda s: language.mismatch('ko', s), corpora['ko'], False)[0] >= ACCURACY_BAR
  assert _accuracy(lambda s: language.mismatch('en', s), corpora['en'], False)[0] >= ACCURACY_BAR


def test_korean_with_english_data_from_faker():
  """Korean lines holding English names, companies, e-mails and URLs (all from Faker) stay Korean."""
  korean, english = faker.Faker('ko_KR'), faker.Faker('en_US')
  korean.seed_instance(7)
  english.seed_instance(7)
  samples = [f'{korean.name()}({english.email()}) 님은 {english.company()}의 {korean.job()}이며 '
             f'{korean.address()}에 삽니다. 자세한 내용은 {english.url()} 참고.' for _ in range(200)]
  accuracy, wrong = _accuracy(language.detect, samples, 'ko')
  print(f'korean with english data: {accuracy:.2%} of {len(samples)}')
  assert accuracy >= ACCURACY_BAR, wrong[:10]


def test_english_with_a_korean_name_from_faker(corpora):
  """A real English sentence with one Korean name (Faker ko_KR, in Hangul) dropped in stays English."""
  fake = faker.Faker('ko_KR')
  fake.seed_instance(11)
  samples = []
  for sentence in corpora['en']:
    words = sentence.split()
    words.insert(fake.random_int(0, len(words)), fake.name())
    samples.append(' '.join(words))
  accuracy, wrong = _accuracy(language.detect, samples, 'en')
  print(f'english with a korean name: {accuracy:.2%} of {len(samples)}')
  assert accuracy >= ACCURACY_BAR, wrong[:10]


BRIEF_EXAMPLE = ('김민수 님의 total_sales는 1,234,000원이며, `SELECT SUM(amount) FROM orders` 결과입니다. '
                 'Apple과 Samsung 중 Samsung이 더 큽니다.')
KOREAN_RESPONSES = [
    BRIEF_EXAMPLE,
    '네',
    '2+3은 5입니다.',
    '정답은 42입니다.',
    '다음 쿼리를 실행하면 됩니다.\n```sql\nSELECT name, SUM(amount) AS total\nFROM orders o JOIN customers c '
    'ON o.customer_id = c.id\nGROUP BY name ORDER BY total DESC LIMIT 3;\n```\n가장 많이 구매한 고객은 '
    'Kim Min-su입니다.',
    "주문 수는 select count(*) from orders where status = 'shipped' 로 구할 수 있습니다.",
    "SELECT name FROM customers WHERE city = '서울' ORDER BY total DESC; 결과는 김민수, 이영희입니다.",
    '쿼리: select name, city from customers where city is not null order by name desc limit 10',
    '상위 제품은 Wireless Mouse, Mechanical Keyboard, USB-C Hub, Laptop Stand입니다.',
    '`orders.created_at` 열에서 2023년 12월 데이터를 보면 revenueByMonth 값이 3.5% 증가했습니다.',
    '{"customer_name": "김민수", "total": 1234}처럼 JSON으로 반환합니다.',
    '자세한 내용은 https://docs.python.org/3/library/sqlite3.html 또는 admin@example.com으로 문의하세요.',
    'Apple, Samsung, Google, Microsoft 중 Microsoft가 가장 큽니다.',
    'ＳＥＬＥＣＴ 결과는 세 건입니다.',  # full-width Latin, NFKC-normalised
    '\u1100\u1161\u11a8\u1100\u1161\u11a8 분해된 자모도 한국어입니다.',  # decomposed Hangul (NFD)
]
ENGLISH_RESPONSES = [
    'The quarterly report was prepared by 김민수 and sent to the finance team yesterday.',
    'Kim Min-su placed the largest order, worth 1,234,000 won.',
    'Run `SELECT SUM(amount) FROM orders` to get the total revenue, which is 1,234,000.',
    'The top customers are 김민수 and 이영희.',
    'There are 42 orders whose total_sales exceeds the average.',
    'No.',
    'You can select items from the menu, then press the button to continue.',
]
AMBIGUOUS = ['', '   ', '1234', '3.14 + 2 = 5.14', 'SELECT * FROM t', 'select * from t;', '👍', '🎉🎉',
             '```sql\nSELECT 1\n```', 'https://example.com', 'a@b.co', 'OK', 'USB-C', 'x', 'total_sales']


@pytest.mark.parametrize('response', ['`The answer is 14.`', '```\nThe answer is 14.\n```', '```text\nThe answer is 14.```',
                                      '정답: `The answer is fourteen, as the sum shows.`'])
def test_english_in_code_markers_is_english(response):
  """Code markers are not a way out of the penalty: the prose they hold counts (code itself still weighs 0)."""
  assert language.detect(response) == 'en' and language.mismatch('ko', response), language.word_weights(response)


@pytest.mark.parametrize('text', KOREAN_RESPONSES)
def test_korean_responses(text):
  assert language.detect(text) == 'ko', language.word_weights(text)


@pytest.mark.parametrize('text', ENGLISH_RESPONSES)
def test_english_responses(text):
  assert language.detect(text) == 'en', language.word_weights(text)


@pytest.mark.parametrize('text', AMBIGUOUS)
def test_no_words_is_none(text):
  assert language.detect(text) is None
  assert language.classify_prompt(text) is None


@pytest.mark.parametrize('text', ['김민수 and 이영희 have the highest total, 북쪽 지점',
                                  '北京是中国的首都。', 'Привет, как дела?'])
def test_mixed_or_other_script_is_none(text):
  assert language.detect(text) is None


@pytest.mark.parametrize('text, expected', [
    ('이번 달 매출 상위 5개 제품을 알려줘', 'ko'),
    ('orders 테이블에서 2023년 매출 합계를 구하세요', 'ko'),
    ('2+3은?', 'ko'),
    ('Which customers placed more than three orders last month?', 'en'),
    ('Translate into English: 안녕하세요 반갑습니다', None),   # mixed: either answer language is fine
    ('Hi', None),                                            # too short to tell
    ('김민수 and 이영희', None),
])
def test_classify_prompt(text, expected):
  assert language.classify_prompt(text) == expected


def test_mismatch_semantics():
  english, korean = ENGLISH_RESPONSES[0], KOREAN_RESPONSES[0]
  assert language.mismatch('ko', english)
  assert not language.mismatch('ko', korean)
  assert language.mismatch('en', korean)  # symmetric; the paper's figure counts Korean prompts only
  assert not language.mismatch('en', english)
  assert not language.mismatch(None, english)  # ambiguous prompt: no penalty
  assert not language.mismatch('ko', None)     # missing response: the format check scores it
  assert not language.mismatch('ko', '  ')
  assert not language.mismatch('ko', '42')     # no words: readable in any language
  assert not language.mismatch('ko', 'SELECT * FROM t')
  assert language.mismatch('ko', '北京是中国的首都。')  # neither Korean nor English is still not Korean
  with pytest.raises(ValueError, match='classify_prompt'):
    language.mismatch('korean', english)


def test_words_copied_from_a_tool_result_are_data():
  result = 'product_name | units\n사무용 의자 | 12\n(1 rows)'
  english = 'The result is 사무용 의자.'
  assert language.mismatch('en', english)                    # without the result: two of five words Korean
  assert not language.mismatch('en', english, data=[result])  # the product's name read off the table
  assert language.detect(english, data=[result]) == 'en'
  assert language.mismatch('en', '결과는 사무용 의자입니다.', data=[result])  # Korean grammar around the name
  assert not language.mismatch('ko', '결과는 사무용 의자입니다.', data=[result])
  assert language.mismatch('ko', english, data=[result])      # an English answer to a Korean prompt still is
  assert not language.mismatch('ko', '사무용 의자', data=[result])  # only copied words: readable in either
  assert language.mismatch('en', '사무용 책상.', data=[result])   # a value that is not in the result counts


def test_mixed_response_asks_the_judge():
  mixed = '김민수 and 이영희 have the highest total, 북쪽 지점'
  assert language.detect(mixed) is None
  asked = []

  def judge(verdict):
    def call(question, reference, candidate, *, criterion):
      asked.append((question, reference, candidate, criterion))
      return verdict
    return call

  assert not language.mismatch('ko', mixed)  # no judge: rules cannot decide, no penalty
  assert language.mismatch('ko', mixed, judge=judge(False))
  assert not language.mismatch('ko', mixed, judge=judge(True))
  assert not language.mismatch('ko', mixed, judge=judge(None))  # failed verdict: no penalty (the judge counts it)
  assert asked[0] == ('', 'Korean', mixed, 'language')
  assert not language.mismatch('ko', KOREAN_RESPONSES[0], judge=judge(False))  # rules decide first
  assert len(asked) == 3
  # mismatch_verdict also says whether the judge decided: only a verdict on a mixed response counts.
  assert language.mismatch_verdict('ko', mixed, judge=judge(False)) == (True, True)
  assert language.mismatch_verdict('ko', mixed, judge=judge(True)) == (False, True)
  assert language.mismatch_verdict('ko', mixed, judge=judge(None)) == (False, False)
  assert language.mismatch_verdict('ko', mixed) == (False, False)
  assert language.mismatch_verdict('ko', 'The answer is 7.', judge=judge(True)) == (True, False)


_identifier = st.from_regex(r'[a-z]{2,8}(_[a-z]{2,8}){1,2}|[a-z]{2,6}[A-Z][a-z]{2,6}|[a-z]{1,5}[0-9]{1,4}',
                            fullmatch=True)
_number = st.integers(0, 10**9).map(lambda n: f'{n:,}')
_sql = st.sampled_from(['`SELECT * FROM orders`', 'SELECT COUNT(*) FROM users WHERE age > 30',
                        '```sql\nSELECT a.id, b.name FROM a JOIN b ON a.id = b.id;\n```'])


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(st.lists(st.one_of(_identifier, _number, _sql), min_size=1, max_size=4), st.randoms())
def test_identifiers_numbers_and_sql_do_not_change_korean(inserts, random):
  """Inserting identifiers, numbers and SQL between the words of a Korean sentence keeps it Korean."""
  words = '이번 분기에 가장 많이 팔린 제품의 매출 합계를 정리했습니다'.split()
  for insert in inserts:
    words.insert(random.randrange(len(words) + 1), insert)
  assert language.detect(' '.join(words)) == 'ko'


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.text(max_size=300), st.sampled_from(['ko', 'en', None]))
def test_never_raises(text, prompt_language):
  assert language.detect(text) in ('ko', 'en', None)
  assert language.classify_prompt(text) in ('ko', 'en', None)
  assert language.mismatch(prompt_language, text) in (True, False)
