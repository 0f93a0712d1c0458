"""Generated task suites, splits, Korean particles and the real-format loaders."""

import collections
import dataclasses
import json
import sqlite3

import pytest

from luckystar.data import chat, function_calling, korean, korean_mc, loaders, math_problems, nl2sql, suites
from luckystar.data.examples import LANGUAGES, SPLITS
from luckystar.tasks import TASKS
from luckystar.tools import sql as sql_tool

pytestmark = pytest.mark.fast


@pytest.fixture(scope='session')
def db_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp('nl2sql')
  nl2sql.build_databases(path)
  return path


@pytest.fixture(scope='session')
def all_examples(db_dir):
  return {task: suites.load(task, db_dir=db_dir) for task in TASKS}


def test_every_example_is_tagged_and_splits_share_no_question(all_examples):
  for task, examples in all_examples.items():
    assert examples, task
    by_split = collections.defaultdict(set)
    for e in examples:
      assert e.task == task and e.language in LANGUAGES and e.split in SPLITS and e.answer, e
      by_split[e.split].add(e.prompt)
    assert set(by_split) == set(SPLITS), (task, set(by_split))
    for a in SPLITS:
      for b in SPLITS:
        if a < b:
          assert not by_split[a] & by_split[b], (task, a, b)
    print(task, {s: len(p) for s, p in by_split.items()})


def test_suites_are_deterministic(db_dir):
  assert math_problems.suite(seed=3, per_template=20) == math_problems.suite(seed=3, per_template=20)
  assert math_problems.suite(seed=3, per_template=20) != math_problems.suite(seed=4, per_template=20)
  for generate in (function_calling.suite, korean_mc.suite, chat.suite):
    assert generate(seed=1, count=200) == generate(seed=1, count=200)
  paths = nl2sql.build_databases(db_dir)
  assert nl2sql.suite(paths) == nl2sql.suite(paths)


def test_both_languages_and_graded_difficulty(all_examples):
  for task in ('math', 'nl2sql', 'function_calling', 'chat'):
    assert {e.language for e in all_examples[task]} == {'ko', 'en'}, task
  assert {e.difficulty for e in all_examples['nl2sql']} == {1, 2, 3}
  assert {e.difficulty for e in all_examples['math']} == {1, 2, 3}
  math = [e for e in all_examples['math'] if e.language == 'ko']
  assert all(e.thinking and e.thinking_ko and e.response.endswith('입니다.') for e in math)


def test_nl2sql_splits_use_disjoint_databases_of_four_domains(all_examples, db_dir):
  databases = collections.defaultdict(set)
  for e in all_examples['nl2sql']:
    databases[e.split].add(e.meta['db_id'])
  assert [len(databases[s]) for s in SPLITS] == [12, 4, 4]
  assert not databases['train'] & databases['heldout']
  assert not databases['teacher'] & (databases['train'] | databases['heldout'])
  # Held-out databases differ in schema wording, not only in rows.
  tables = {}
  for name, path in nl2sql.build_databases(db_dir).items():
    with sqlite3.connect(path) as conn:
      tables[name] = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
  for domain in nl2sql.DOMAINS:
    train, heldout, teacher = tables[f'{domain}_0'], tables[f'{domain}_3'], tables[f'{domain}_4']
    assert not train & heldout and not train & teacher and not heldout & teacher, domain


def test_nl2sql_databases_have_korean_text_dates_and_nulls(db_dir):
  path = nl2sql.build_databases(db_dir)['hr_4']
  n = nl2sql.names('hr', 4)
  with sqlite3.connect(path) as conn:
    names = [r[0] for r in conn.execute(f'SELECT name FROM {n["employees"]}')]
    assert any(korean.final_consonant(name) is not None for name in names)
    assert any(name.isascii() for name in names)
    assert conn.execute(f'SELECT COUNT(*) FROM {n["employees"]} WHERE {n["manager"]} IS NULL').fetchone()[0] > 0
    assert conn.execute(f"SELECT COUNT(*) FROM {n['employees']} WHERE {n['hired']} LIKE '20__-__-__'"
                        ).fetchone()[0] > 0


def test_nl2sql_gold_sql_executes_on_its_database(all_examples, db_dir):
  paths = nl2sql.build_databases(db_dir)
  for e in all_examples['nl2sql']:
    with sqlite3.connect(paths[e.meta['db_id']]) as conn:
      conn.execute(e.answer).fetchall()


def test_teacher_databases_mix_the_wordings_and_share_no_question_with_the_student(all_examples, db_dir):
  for domain in nl2sql.DOMAINS:
    wordings = nl2sql.teacher_wordings(domain)
    instances = [nl2sql.names(domain, i) for i in nl2sql.INSTANCES]
    assert len(wordings) == nl2sql.TEACHER_WORDINGS and len({tuple(sorted(w.items())) for w in wordings}) == len(wordings)
    assert not any(w == n for w in wordings for n in instances)
    assert all(w[key] in {n[key] for n in instances} for w in wordings for key in w)
  teacher = nl2sql.teacher_suite(db_dir)
  assert teacher == nl2sql.teacher_suite(db_dir) and {e.split for e in teacher} == {'teacher'}
  student = {e.prompt for e in all_examples['nl2sql'] if e.split != 'teacher'}
  assert not {e.prompt for e in teacher} & student
  assert {e.meta['db_id'] for e in teacher} == {f'{d}_{kind}{k}' for d in nl2sql.DOMAINS for kind, count in (
      ('t', nl2sql.TEACHER_WORDINGS), ('s', nl2sql.TEACHER_TRAIN_WORDING)) for k in range(count)}
  # The train-wording teacher databases have the training schema but rows of their own.
  train = nl2sql.build_databases(db_dir)['sales_0']
  own = next(e.meta['db_path'] for e in teacher if e.meta['db_id'] == 'sales_s0')
  customers = lambda path: {row[0] for row in sqlite3.connect(path).execute('SELECT name FROM customers')}
  assert sql_tool.schema(own) == sql_tool.schema(train)
  assert len(customers(own) & customers(train)) < len(customers(own)) // 10
  for e in teacher[::50]:
    with sqlite3.connect(e.meta['db_path']) as conn:
      conn.execute(e.answer).fetchall()


@pytest.mark.parametrize('word,kind,expected', [
    ('사과', 'object', '를'), ('책', 'object', '을'), ('물', 'subject', '이'), ('커피', 'subject', '가'),
    ('학교', 'topic', '는'), ('집', 'topic', '은'), ('빵', 'with', '과'), ('우유', 'with', '와'),
    ('서울', 'direction', '로'), ('부산', 'direction', '으로'), ('바다', 'direction', '로')])
def test_particles_follow_the_final_consonant(word, kind, expected):
  assert korean.particle(word, kind) == expected


def test_particle_needs_a_hangul_ending():
  with pytest.raises(ValueError, match='Hangul'):
    korean.particle('CPU', 'object')


def test_korean_mc_has_ten_options_and_one_correct_letter(all_examples):
  for e in all_examples['korean_mc'][:300]:
    options = e.meta['options']
    assert len(options) == len(set(options)) == 10
    assert e.answer in korean_mc.LETTERS
    kind = e.meta['phenomenon'].split('/')[1]
    noun = e.prompt.split('문장: ')[1].split('( )')[0].split()[-1]
    assert options[korean_mc.LETTERS.index(e.answer)] == korean.particle(noun, kind)


def test_function_calling_gold_uses_shown_functions(all_examples):
  for e in all_examples['function_calling']:
    shown = {f['name'] for f in e.meta['functions']}
    assert {next(iter(call)) for call in json.loads(e.answer)} <= shown


# ---- real-format loaders ------------------------------------------------------------------

def test_read_records_names_file_and_line(tmp_path):
  path = tmp_path / 'rows.jsonl'
  path.write_text('{"a": 1}\n\n{"a": 2,}\n')
  rows = loaders.read_records(path)
  assert next(rows) == (1, {'a': 1})
  with pytest.raises(ValueError, match=f'^{path}:3: invalid JSON'):
    next(rows)
  path.write_text('{"a": 1}\n[1, 2]\n')
  with pytest.raises(ValueError, match=f'^{path}:2: expected a JSON object'):
    list(loaders.read_records(path))
  array = tmp_path / 'rows.json'
  array.write_text('[\n  {"a": 1},\n  {"a": 2}\n  {"a": 3}\n]')
  with pytest.raises(ValueError, match=f'^{array}:4: expected ","'):
    list(loaders.read_records(array))


def test_jsonl_lines_end_at_newline_only(tmp_path):
  """json.dumps(ensure_ascii=False) leaves U+2028, U+2029 and U+0085 raw in strings; they are not line ends."""
  path = tmp_path / 'ko.jsonl'
  problem = '첫 줄\u2028둘째 줄\u2029셋째\x85줄?'
  path.write_text(json.dumps({'problem': problem, 'answer': '1'}, ensure_ascii=False) + '\r\n'
                  + '{"problem": "x", "answer": 3}\r\n{"problem": "y"}\n', newline='')
  rows = loaders.read_records(path)
  assert next(rows) == (1, {'problem': problem, 'answer': '1'}) and next(rows)[0] == 2
  with pytest.raises(ValueError, match=f"^{path}:3: missing field 'answer'"):
    loaders.load_math_jsonl(path)


def test_json_array_with_trailing_text_or_comma_is_an_error(tmp_path):
  path = tmp_path / 'rows.json'
  for text, line in (('[{"a": 1}] garbage {', 1), ('[\n {"a": 1},\n]', 3), ('[{"a": 1}]\n\n]', 3)):
    path.write_text(text)
    with pytest.raises(ValueError, match=f'^{path}:{line}: '):
      list(loaders.read_records(path))
  path.write_text(' [\n {"a": 1},\n {"a": 2}\n ]\n\n')
  assert list(loaders.read_records(path)) == [(2, {'a': 1}), (3, {'a': 2})]
  path.write_text('[]')
  assert list(loaders.read_records(path)) == []


def test_spider_and_bird_layouts(tmp_path, db_dir):
  database = tmp_path / 'database'
  source = nl2sql.build_databases(db_dir)['sales_0']
  (database / 'shop').mkdir(parents=True)
  (database / 'shop' / 'shop.sqlite').write_bytes(source.read_bytes())
  spider = tmp_path / 'dev.json'
  spider.write_text(json.dumps([{'db_id': 'shop', 'question': 'How many customers?',
                                 'query': 'SELECT COUNT(*) FROM customers'}], indent=2))
  bird = tmp_path / 'bird.json'
  bird.write_text(json.dumps([{'db_id': 'shop', 'question': '고객은 몇 명?', 'SQL': 'SELECT COUNT(*) FROM customers',
                               'evidence': 'customers table'}], indent=2))
  (example,) = loaders.load_spider(spider, database)
  assert example.answer == 'SELECT COUNT(*) FROM customers' and 'CREATE TABLE customers' in example.system
  (example,) = loaders.load_spider(bird, database)
  assert example.language == 'ko' and 'customers table' in example.prompt
  broken = tmp_path / 'broken.json'
  broken.write_text(json.dumps([{'db_id': 'shop', 'question': 'q', 'query': 'SELECT 1'},
                                {'db_id': 'shop', 'question': 'missing the SQL'}], indent=2))
  with pytest.raises(ValueError, match=f"^{broken}:7: missing field 'query' or 'SQL'"):
    loaders.load_spider(broken, database)


def test_math_and_kobalt_jsonl(tmp_path):
  math = tmp_path / 'math.jsonl'
  math.write_text('{"problem": "1+1?", "answer": 2}\n{"problem": "2+2는?", "answer": "4"}\n')
  examples = loaders.load_math_jsonl(math)
  assert [(e.answer, e.language) for e in examples] == [('2', 'en'), ('4', 'ko')]
  math.write_text('{"problem": "1+1?", "answer": 2}\n{"problem": "no answer"}\n')
  with pytest.raises(ValueError, match=f"^{math}:2: missing field 'answer'"):
    loaders.load_math_jsonl(math)
  for answer in ('null', '""', '" "', '[2]'):   # the message once crashed on the tuple of accepted types
    math.write_text(f'{{"problem": "1+1?", "answer": 2}}\n{{"problem": "2+2?", "answer": {answer}}}\n')
    with pytest.raises(ValueError, match=f"^{math}:2: field 'answer' must be a non-empty str or int or float$"):
      loaders.load_math_jsonl(math)
  mc = tmp_path / 'kobalt.jsonl'
  mc.write_text(json.dumps({'Question': '다음 중 …?\nA. 가\nB. 나', 'Answer': 'B', 'Class': 'Syntax'},
                           ensure_ascii=False) + '\n' + json.dumps({'question': 'q', 'options': ['x', 'y'],
                                                                   'answer': 'C'}) + '\n')
  with pytest.raises(ValueError, match=f"^{mc}:2: answer 'C' is not one of the letters AB"):
    loaders.load_kobalt_jsonl(mc)
  mc.write_text(mc.read_text().splitlines()[0] + '\n')
  (example,) = loaders.load_kobalt_jsonl(mc)
  assert example.answer == 'B' and example.meta == {'Class': 'Syntax'}


def test_nl2sql_curation_reports_each_reason(db_dir):
  from luckystar import tokenizer
  paths = nl2sql.build_databases(db_dir)
  base = next(e for e in nl2sql.suite(paths) if e.meta['db_id'] == 'sales_0')
  n = nl2sql.names('sales', 0)
  cases = {'kept': base.answer, 'gold_failed': 'SELEC broken', 'empty_result': f'SELECT name FROM {n["customers"]} '
           "WHERE name = 'nobody'", 'too_long': f'SELECT * FROM {n["orders"]}'}
  examples = [dataclasses.replace(base, id=reason, answer=sql) for reason, sql in cases.items()]
  examples.append(dataclasses.replace(base, id='null_sum', answer=f'SELECT SUM({n["price"]}) FROM {n["products"]} '
                                                                  'WHERE 0'))
  tok = tokenizer.default()
  kept, report = nl2sql.curate(examples, lambda text: len(tok.encode(text)))
  assert [e.id for e in kept] == ['kept']
  assert report == {'kept': 1, 'gold_failed': 1, 'empty_result': 2, 'too_long': 1}
  curated = suites.load('nl2sql', db_dir=db_dir)
  assert 0 < len(curated) <= len(nl2sql.suite(paths))
