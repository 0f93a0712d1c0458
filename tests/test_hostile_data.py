"""Hostile data files (issue 54) read as a stage reads them: deeply nested JSON, unencodable text, special files
(FIFOs, devices) and values that parse but mean nothing. Each fails with one error naming file:line, the path or
the config key, never a traceback or a hang; a UTF-8 byte-order mark and a >4,300-digit answer are accepted."""

import concurrent.futures
import json
import os
import pathlib
import random
import resource
import sqlite3
import subprocess
import sys

import ml_collections
import pytest

import data_files
from luckystar import errors
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import conversations, loaders, sources
from luckystar.data.loaders import DataError
from luckystar.engine import prompts
from luckystar.engine import pairs as pairs_lib

pytestmark = pytest.mark.fast

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEEP = '[' * 100_000 + ']' * 100_000   # Python's parser recurses once per level: a RecursionError today
SURROGATE = '"\\ud800"'                 # the JSON escape of a lone surrogate, which no UTF-8 encoder takes


@pytest.fixture(scope='module')
def tok():
  return tokenizer_lib.default()


def _lines(path: pathlib.Path, *lines: str) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(''.join(line + '\n' for line in lines), encoding='utf-8')
  return path


def _raises(call, message: str) -> str:
  """The one-line error message `call()` raises, checked to contain `message`."""
  with pytest.raises(errors.UserError) as raised:
    call()
  text = str(raised.value)
  assert message in text and '\n' not in text, text
  return text


# ---- each readable format, with one record of a given JSON value spliced in ------------------------------
# format: (how a good first line reads, how line 2 holds `value` (JSON text), load(path, tok))

def _dpo_pair(tok, question: str = '"q"') -> str:
  sides = {f'{side}_{k}': v for side in ('chosen', 'rejected')
           for k, v in (('tokens', [1, 2, 3]), ('loss_mask', [0, 1, 1]))}
  return json.dumps({**sides, 'tokenizer': tok.fingerprint})[:-1] + f', "question": {question}}}'


def _rs_trace(tok, example_id: str = '"a"') -> str:
  return json.dumps({'mode': 'reasoning', 'tokens': [1, 2], 'loss_mask': [0, 1],
                     'tokenizer': tok.fingerprint})[:-1] + f', "example_id": {example_id}}}'


def _dpo_sources(path):
  return ml_collections.ConfigDict({'dpo': {'sources': f'dpo_pairs:{path}'}})


FORMATS = {
    'math_jsonl': (lambda tok: '{"problem": "1+1?", "answer": "2"}',
                   lambda value, tok: f'{{"problem": {value}, "answer": "3"}}',
                   lambda path, tok: prompts.from_sources(f'math_jsonl:{path}', key='k', split='train', seed=0,
                                                          tokenizer=tok)),
    'kobalt_jsonl': (lambda tok: '{"question": "Q?", "options": ["a", "b"], "answer": "A"}',
                     lambda value, tok: f'{{"question": "Q?", "options": ["a", {value}], "answer": "B"}}',
                     lambda path, tok: prompts.from_sources(f'kobalt_jsonl:{path}', key='k', split='train', seed=0,
                                                            tokenizer=tok)),
    'chat_jsonl': (lambda tok: '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", '
                               '"content": "Hello."}]}',
                   lambda value, tok: f'{{"messages": [{{"role": "user", "content": {value}}}, '
                                      '{"role": "assistant", "content": "Hello."}]}',
                   lambda path, tok: sources.chat_conversations(sources.parse(f'chat_jsonl:{path}', key='k')[0], tok)),
    'preference_jsonl': (lambda tok: '{"prompt": "Hi", "chosen": "Hello.", "rejected": "Go away."}',
                         lambda value, tok: f'{{"prompt": "Hi", "chosen": {value}, "rejected": "No."}}',
                         lambda path, tok: sources.preference_pairs(
                             sources.parse(f'preference_jsonl:{path}', key='k')[0], tok)),
    'dpo_pairs': (lambda tok: _dpo_pair(tok), lambda value, tok: _dpo_pair(tok, value),
                  lambda path, tok: pairs_lib.read_sources(_dpo_sources(path), tok)),
    'rs_traces': (lambda tok: _rs_trace(tok), lambda value, tok: _rs_trace(tok, value),
                  lambda path, tok: conversations.read_rs_traces(str(path), tok)),
    # JSON inside JSON: OpenAI tool-call arguments are a JSON string, parsed again
    'tool_call_arguments': (
        lambda tok: '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}',
        lambda value, tok: json.dumps({'messages': [
            {'role': 'user', 'content': '12*7?'},
            {'role': 'assistant', 'tool_calls': [{'type': 'function', 'function': {
                'name': 'calculator', 'arguments': f'{{"expression": {value}}}'}}]}]}),
        lambda path, tok: sources.chat_conversations(sources.parse(f'chat_jsonl:{path}', key='k')[0], tok)),
}


def _spider(root: pathlib.Path, question: str = '"How many singers?"', db_id: str = '"concert"') -> pathlib.Path:
  """A Spider directory (databases from tests/data_files) whose questions file, a JSON array, holds on its line 3
  a record with `question` and `db_id` as given (JSON text)."""
  questions = data_files.nl2sql_dir(root, 'spider')
  questions.write_text('[\n {"db_id": "concert", "question": "How many?", "query": "SELECT count(*) FROM singer"},\n'
                       f' {{"db_id": {db_id}, "question": {question}, "query": "SELECT 1"}}\n]\n', encoding='utf-8')
  return questions


def _load_spider(questions, tok=None):
  return prompts.from_sources(f'spider:{questions}', key='config.rlvr.sources', split='train', seed=0, tokenizer=tok)


# ---- nested JSON ---------------------------------------------------------------------------------------

@pytest.mark.parametrize('form', sorted(FORMATS))
def test_deeply_nested_json_is_one_error_naming_file_and_line(tmp_path, tok, form):
  first, broken, load = FORMATS[form]
  path = _lines(tmp_path / 'data.jsonl', first(tok), broken(DEEP, tok))
  assert 'levels deep (at most 64)' in _raises(lambda: load(path, tok), f'{path}:2: ')


def test_deeply_nested_json_in_a_spider_array_names_its_line(tmp_path, tok):
  questions = _spider(tmp_path / 'spider', question=DEEP)
  _raises(lambda: _load_spider(questions, tok), f'{questions}:3: JSON nested')


# ---- unencodable text ------------------------------------------------------------------------------------

@pytest.mark.parametrize('form', sorted(FORMATS))
def test_a_lone_surrogate_is_refused_at_load_naming_file_and_line(tmp_path, tok, form):
  first, broken, load = FORMATS[form]
  path = _lines(tmp_path / 'data.jsonl', first(tok), broken(SURROGATE, tok))
  assert 'lone surrogate' in _raises(lambda: load(path, tok), f'{path}:2: ')


def test_a_lone_surrogate_in_a_spider_array_names_its_line(tmp_path, tok):
  questions = _spider(tmp_path / 'spider', question='"How many \\udc00 singers?"')
  _raises(lambda: _load_spider(questions, tok), f'{questions}:3: a string is not valid Unicode')


def test_a_lone_surrogate_in_a_record_key_is_refused(tmp_path, tok):
  path = _lines(tmp_path / 'k.jsonl', '{"question": "Q?", "options": ["a", "b"], "answer": "A", "Class\\udbff": 1}')
  _raises(lambda: FORMATS['kobalt_jsonl'][2](path, tok), f'{path}:1: a string is not valid Unicode')


# ---- special files ---------------------------------------------------------------------------------------
# Reading a FIFO blocks and /dev/zero never ends: those cases run in a child process with a timeout and a memory
# cap, so a regression fails the test instead of hanging it.

_CHILD = '''
import sys
from luckystar import errors
try:
  exec(sys.argv[1])
except errors.UserError as e:
  print(type(e).__name__, str(e), sep='|')
else:
  print('no error|')
'''


def _limit_memory():
  resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def _in_child(code: str) -> tuple[str, str]:
  """(error class, message) of the UserError that `code` raises in a child process."""
  try:
    result = subprocess.run([sys.executable, '-c', _CHILD, code], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, preexec_fn=_limit_memory,
                            env={k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'})
  except subprocess.TimeoutExpired:
    pytest.fail(f'{code!r} hung on a special file')
  assert result.returncode == 0 and '|' in result.stdout, result.stderr[-3000:]
  kind, message = result.stdout.strip().split('|', 1)
  return kind, message


def _special(path: pathlib.Path, kind: str) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  if kind == 'fifo':
    os.mkfifo(path)
  else:
    os.symlink('/dev/zero', path)
  return path


@pytest.mark.parametrize('kind', ['fifo', 'dev_zero'])
def test_a_data_file_source_that_is_not_a_regular_file_is_refused_by_parse(tmp_path, kind):
  path = _special(tmp_path / 'math.jsonl', kind)
  _raises(lambda: sources.parse(f'math_jsonl:{path}', key='config.rlvr.sources'),
          f'{path}: not a regular file (a FIFO, device or directory) (config.rlvr.sources, math_jsonl)')


@pytest.mark.parametrize('kind', ['fifo', 'dev_zero'])
def test_a_spider_questions_file_that_is_not_a_regular_file_is_refused_by_parse(tmp_path, kind):
  questions = data_files.nl2sql_dir(tmp_path / 'spider', 'spider')
  questions.unlink()
  _special(questions, kind)
  _raises(lambda: sources.parse(f'spider:{questions}', key='config.eval.sources'),
          f'{questions}: not a regular file')


@pytest.mark.parametrize('kind', ['fifo', 'dev_zero'])
def test_a_loader_reading_a_special_file_refuses_it_without_hanging(tmp_path, kind):
  path = _special(tmp_path / 'math.jsonl', kind)
  name, message = _in_child(f'from luckystar.data import loaders; loaders.load_math_jsonl({str(path)!r})')
  assert name == 'DataError' and message.startswith(f'{path}: ') and 'not a regular file' in message, message


@pytest.mark.parametrize('kind', ['fifo', 'dev_zero'])
def test_a_database_that_is_not_a_regular_file_is_refused_without_hanging(tmp_path, kind):
  """sources.digest hashes every *.sqlite under the database directory: a FIFO or /dev/zero there hung it."""
  questions = data_files.nl2sql_dir(tmp_path / 'spider', 'spider')
  database = questions.parent / 'database' / 'concert' / 'concert.sqlite'
  database.unlink()
  _special(database, kind)
  name, message = _in_child(f'from luckystar.engine import prompts; prompts.from_sources("spider:{questions}", '
                            'key="config.rlvr.sources", split="train", seed=0, tokenizer=None)')
  assert name in ('InvalidFile', 'DataError') and f'{database}' in message and 'not a regular file' in message, message


def test_a_stray_fifo_among_the_databases_is_refused_without_hanging(tmp_path):
  questions = data_files.nl2sql_dir(tmp_path / 'spider', 'spider')
  stray = _special(questions.parent / 'database' / 'junk' / 'junk.sqlite', 'fifo')
  name, message = _in_child(f'from luckystar.data import sources; '
                            f'sources.digest(sources.parse("spider:{questions}", key="k")[0])')
  assert f'{stray}' in message and 'not a regular file' in message, message


def test_rs_traces_and_dpo_pair_files_that_are_fifos_are_refused_without_hanging(tmp_path):
  traces, pairs = _special(tmp_path / 'rs_traces.jsonl', 'fifo'), _special(tmp_path / 'dpo_pairs.jsonl', 'fifo')
  tokenizer = 'from luckystar import tokenizer; tok = tokenizer.default(); '
  _, message = _in_child(tokenizer + f'from luckystar.data import conversations; '
                                     f'conversations.read_rs_traces({str(traces)!r}, tok)')
  assert message.startswith(f'{traces}: ') and 'not a regular file' in message, message
  _, message = _in_child(tokenizer + f'import pathlib; from luckystar.engine import pairs; '
                                     f'pairs.read_pairs(pathlib.Path({str(pairs)!r}), tok)')
  assert message.startswith(f'{pairs}: ') and 'not a regular file' in message, message


# ---- values that parse but mean nothing --------------------------------------------------------------------

@pytest.mark.parametrize('spec', ['bundled:math@1e-320',                    # subnormal: 1/w overflows
                                  'bundled:math@5e-324,bundled:chat',      # the smallest float there is
                                  'bundled:math@1e-200,bundled:chat@1e200'])   # normal, but 1e400 apart
def test_a_weight_that_cannot_be_normalised_is_refused_naming_the_key(spec):
  _raises(lambda: sources.parse(spec, key='config.rlvr.sources'), 'config.rlvr.sources')


@pytest.mark.parametrize('answer,message', [('NaN', 'NaN is not a JSON number'),
                                            ('-Infinity', '-Infinity is not a JSON number'),
                                            ('1e999', '1e999 is not a finite number'),
                                            ('true', "field 'answer' must be")])
def test_a_math_answer_that_is_not_a_string_or_finite_number_is_refused(tmp_path, tok, answer, message):
  path = _lines(tmp_path / 'math.jsonl', '{"problem": "1+1?", "answer": 2}', f'{{"problem": "2+2?", "answer": {answer}}}')
  assert message in _raises(lambda: FORMATS['math_jsonl'][2](path, tok), f'{path}:2: ')


def test_an_answer_of_more_digits_than_python_converts_is_kept_as_its_text(tmp_path):
  digits = '7' * 5001
  path = _lines(tmp_path / 'math.jsonl', f'{{"problem": "What is a big number?", "answer": {digits}}}')
  assert [e.answer for e in loaders.load_math_jsonl(path)] == [digits]


@pytest.mark.parametrize('options', ['[1, 2]', '["a", null]', '["a", ["b"]]', '["a", ""]'])
def test_kobalt_options_must_be_strings(tmp_path, tok, options):
  path = _lines(tmp_path / 'k.jsonl', f'{{"question": "Q?", "options": {options}, "answer": "A"}}')
  _raises(lambda: FORMATS['kobalt_jsonl'][2](path, tok), f'{path}:1: options must be a list of 2–10 strings')


@pytest.mark.parametrize('db_id', ['../outside', '/ABSOLUTE/outside/outside', 'a/b', '..'])
def test_a_db_id_cannot_reach_a_database_outside_the_dataset(tmp_path, tok, db_id):
  """Each db_id below names an existing database that a plain join of database/<db_id>/<db_id>.sqlite reaches."""
  db_id = db_id.replace('/ABSOLUTE', str(tmp_path))
  questions = _spider(tmp_path / 'spider', db_id=json.dumps(db_id))
  (questions.parent / 'outside').mkdir()   # database/../outside/../outside.sqlite
  for database in (questions.parent / 'outside.sqlite', tmp_path / 'outside' / 'outside.sqlite',
                   questions.parent / 'database' / 'a' / 'b' / 'a' / 'b.sqlite'):
    data_files._database(database, 'Seoul')
  assert f'db_id {db_id!r}' in _raises(lambda: _load_spider(questions, tok), f'{questions}:3: ')


def test_a_database_linked_from_outside_the_dataset_is_refused(tmp_path, tok):
  outside = tmp_path / 'outside' / 'concert.sqlite'
  data_files._database(outside, 'Seoul')
  questions = _spider(tmp_path / 'spider')
  database = questions.parent / 'database' / 'concert' / 'concert.sqlite'
  database.unlink()
  database.symlink_to(outside)
  message = _raises(lambda: _load_spider(questions, tok), f'{questions}:2: ')
  assert f'outside {questions.parent / "database"}' in message


@pytest.mark.parametrize('content', [random.Random(0).randbytes(4096), b'SQLite format 3\0' + b'\xff' * 4000, b'not sqlite'],
                         ids=['random_bytes', 'sqlite_header_then_garbage', 'text'])
def test_a_corrupt_database_is_one_line_naming_it(tmp_path, tok, content):
  questions = _spider(tmp_path / 'spider')
  database = questions.parent / 'database' / 'concert' / 'concert.sqlite'
  database.write_bytes(content)
  with pytest.raises(DataError) as raised:   # what a caller of load_spider catches
    _load_spider(questions, tok)
  message = str(raised.value)
  assert message.startswith(f'{questions}:2: ') and f'{database}' in message and '\n' not in message, message


def test_a_utf8_byte_order_mark_is_accepted(tmp_path, tok):
  bom = '\ufeff'
  math = _lines(tmp_path / 'math.jsonl', bom + '{"problem": "1+1?", "answer": "2"}')
  assert [e.answer for e in loaders.load_math_jsonl(math)] == ['2']
  questions = _spider(tmp_path / 'spider')
  questions.write_text(bom + questions.read_text(encoding='utf-8'), encoding='utf-8')
  assert len(_load_spider(questions, tok)[0]) == 2
  chat = _lines(tmp_path / 'chat.jsonl', bom + FORMATS['chat_jsonl'][0](tok))
  assert sources.chat_conversations(sources.parse(f'chat_jsonl:{chat}', key='k')[0], tok)[1].kept == 1
  traces = _lines(tmp_path / 'rs_traces.jsonl', bom + _rs_trace(tok))
  assert len(conversations.read_rs_traces(str(traces), tok)) == 1
  pairs = _lines(tmp_path / 'dpo_pairs.jsonl', bom + _dpo_pair(tok))
  assert len(pairs_lib.read_pairs(pairs, tok)) == 1


# ---- the command line -------------------------------------------------------------------------------------

def _database_bytes(root):
  questions = _spider(root)
  (questions.parent / 'database' / 'concert' / 'concert.sqlite').write_bytes(b'SQLite format 3\0' + b'\x07' * 2000)
  return f'spider:{questions}', f'{questions}:2: '


def _fifo(root):
  path = _special(root / 'math.jsonl', 'fifo')
  return f'math_jsonl:{path}', f'{path}: not a regular file'


# case: (writes the data under a root, returns (the rlvr.sources value, what the error line must say))
COMMAND_CASES = {
    'nested': lambda root: (f'math_jsonl:{_lines(root / "m.jsonl", FORMATS["math_jsonl"][0](None), DEEP)}',
                            f'{root / "m.jsonl"}:2: JSON nested'),
    'surrogate': lambda root: (f'math_jsonl:{_lines(root / "m.jsonl", FORMATS["math_jsonl"][1](SURROGATE, None))}',
                               f'{root / "m.jsonl"}:1: a string is not valid Unicode'),
    'fifo': _fifo,
    'corrupt_database': _database_bytes,
}


@pytest.fixture(scope='module')
def command_results(tmp_path_factory):
  root = tmp_path_factory.mktemp('commands')
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}   # one CPU device

  def run(case):
    spec, expected = COMMAND_CASES[case](root / case / 'data')
    workdir = root / case / 'run'
    result = subprocess.run([sys.executable, '-m', 'luckystar.main', '--config=configs/rlvr.py:smoke',
                             f'--config.rlvr.sources={spec}', f'--workdir={workdir}'], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    return result, expected, workdir

  with concurrent.futures.ThreadPoolExecutor(len(COMMAND_CASES)) as pool:
    return dict(zip(COMMAND_CASES, pool.map(run, COMMAND_CASES)))


@pytest.mark.parametrize('case', sorted(COMMAND_CASES))
def test_main_stops_on_a_hostile_data_file_with_one_error_line(command_results, case):
  result, expected, workdir = command_results[case]
  errors_ = [line for line in result.stderr.splitlines() if line.startswith('error: ')]   # the rest is logging
  assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr[-3000:]
  assert len(errors_) == 1 and expected in errors_[0], result.stderr[-3000:]
  assert result.stderr.strip().splitlines()[-1] == errors_[0]
  # main saves the run's config first; nothing of the stage's (checkpoints, metrics, data report) is written
  assert {p.name for p in workdir.iterdir()} <= {'config.json', 'tokenizer'}
