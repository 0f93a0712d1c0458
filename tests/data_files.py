"""Small data files in every format `luckystar.data.sources` reads (docs/data.md), for tests: `write_all(root)`."""

import json
import pathlib
import sqlite3

from luckystar import config as config_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]

CHATS = [
    {'messages': [{'role': 'user', 'content': 'What is 12 times 7?'},
                  {'role': 'assistant', 'thinking': 'Multiply with the calculator.',
                   'tool_calls': [{'type': 'function', 'function': {'name': 'calculator',
                                                                    'arguments': '{"expression": "12*7"}'}}]},
                  {'role': 'tool', 'content': '84'},
                  {'role': 'assistant', 'content': '12 times 7 is 84.'}]},
    {'messages': [{'role': 'system', 'content': 'Answer briefly.'},
                  {'role': 'user', 'content': '프랑스의 수도는 어디입니까?'},
                  {'role': 'assistant', 'content': '파리입니다.'}]},
    {'mode': 'reasoning', 'messages': [{'role': 'user', 'content': 'Name a primary colour.'},
                                       {'role': 'assistant', 'thinking': 'Red is one.', 'content': 'Red.'}]},
]
MATH = [{'problem': 'What is 3 + 4?', 'answer': '7'}, {'question': '5 곱하기 6은 얼마입니까?', 'answer': 30},
        {'problem': 'What is 10 - 2?', 'answer': '8'}, {'problem': 'What is 9 + 9?', 'answer': '18'}]
MATH_EVAL = [{'problem': 'What is 2 + 2?', 'answer': '4'}, {'problem': 'What is 3 + 4?', 'answer': '7'},
             {'problem': '7 더하기 8은 얼마입니까?', 'answer': '15'}]   # 'What is 3 + 4?' is also a training question
KOBALT = [{'question': '다음 중 올바른 문장은?', 'options': ['가', '나', '다', '라'], 'answer': 'B'},
          {'Question': '다음 중 맞춤법이 맞는 것은?\n\nA. 됬다\nB. 됐다', 'Answer': 'b'}]
PREFERENCES_TEXT = [{'prompt': 'What is 2 + 2?', 'chosen': '4.', 'rejected': 'Let me think at length. It is 4.'},
                    {'prompt': '한국의 수도는?', 'chosen': '서울입니다.', 'rejected': 'The capital is Seoul.'}]
PREFERENCES_MESSAGES = [
    {'prompt': [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Name a fruit.'}],
     'chosen': [{'role': 'assistant', 'content': 'Apple.'}],
     'rejected': [{'role': 'assistant', 'content': 'There are many fruits; one of them is the apple.'}]},
    {'prompt': [{'role': 'user', 'content': '3 + 5?'}],
     'chosen': [{'role': 'assistant', 'thinking': 'Add.', 'content': '8'}],
     'rejected': [{'role': 'assistant', 'thinking': 'Add them.', 'content': 'It could be 8 or 9.'}]}]


def _jsonl(path: pathlib.Path, records) -> pathlib.Path:
  path.write_text(''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in records), encoding='utf-8')
  return path


def _database(path: pathlib.Path, city: str) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  with sqlite3.connect(path) as connection:
    connection.execute('CREATE TABLE singer (name TEXT, age INTEGER, city TEXT)')
    connection.executemany('INSERT INTO singer VALUES (?, ?, ?)',
                           [('Kim', 31, city), ('Lee', 45, city), ('Park', 28, 'Busan')])


def nl2sql_dir(root: pathlib.Path, layout: str) -> pathlib.Path:
  """A Spider- or BIRD-layout directory with two SQLite databases; returns the questions file."""
  root.mkdir(parents=True, exist_ok=True)
  databases = root / ('database' if layout == 'spider' else 'dev_databases')
  for name, city in (('concert', 'Seoul'), ('music', 'Incheon')):
    _database(databases / name / f'{name}.sqlite', city)
  sql = 'query' if layout == 'spider' else 'SQL'
  records = [{'db_id': 'concert', 'question': 'How many singers are there?', sql: 'SELECT count(*) FROM singer'},
             {'db_id': 'music', 'question': 'What is the age of the oldest singer?', sql: 'SELECT max(age) FROM singer'},
             {'db_id': 'music', 'question': '가수는 모두 몇 명입니까?', sql: 'SELECT count(*) FROM singer'},
             {'db_id': 'concert', 'question': 'Which singers live nowhere?', sql: "SELECT name FROM singer WHERE city = 'x'"}]
  if layout == 'bird':
    records[1]['evidence'] = 'oldest refers to MAX(age)'
  questions = root / 'dev.json'
  questions.write_text(json.dumps(records, indent=1, ensure_ascii=False), encoding='utf-8')   # Spider: a JSON array
  return questions


def write_all(root: pathlib.Path) -> dict[str, pathlib.Path]:
  """Every format's file under `root`, by format name (math_eval: a second math file for held-out eval)."""
  root.mkdir(parents=True, exist_ok=True)
  return {'chat_jsonl': _jsonl(root / 'chats.jsonl', CHATS), 'math_jsonl': _jsonl(root / 'math.jsonl', MATH),
          'math_eval': _jsonl(root / 'math_eval.jsonl', MATH_EVAL),
          'kobalt_jsonl': _jsonl(root / 'kobalt.jsonl', KOBALT),
          'preference_text': _jsonl(root / 'preferences.jsonl', PREFERENCES_TEXT),
          'preference_messages': _jsonl(root / 'preference_messages.jsonl', PREFERENCES_MESSAGES),
          'spider': nl2sql_dir(root / 'spider', 'spider'), 'bird': nl2sql_dir(root / 'bird' / 'dev', 'bird')}


# One malformed record per format: (format key, record replacing the file's second one, the field the error names).
MALFORMED = {
    'chat_jsonl': ({'messages': [{'role': 'user', 'content': 'Hi'},
                                 {'role': 'assistant', 'tool_calls': [{'type': 'function', 'function': {
                                     'name': 'calculator', 'arguments': '{"expression": '}}]}]},
                   'arguments is not JSON'),
    'math_jsonl': ({'problem': 'What is 1 + 1?'}, "missing field 'answer'"),
    'kobalt_jsonl': ({'question': 'Q?', 'options': ['a', 'b'], 'answer': 'E'}, "answer 'E' is not one of"),
    'preference_text': ({'prompt': 'Hi', 'chosen': 'Hello.'}, "missing field 'rejected'"),
    'preference_messages': ({'prompt': [{'role': 'user', 'content': 'Hi'}],
                             'chosen': [{'role': 'user', 'content': 'Hello.'}], 'rejected': 'No.'},
                            "'chosen' must start with an assistant message"),
    'spider': ({'db_id': 'concert', 'question': 'How many?'}, "missing field 'query' or 'SQL'"),
    'bird': ({'db_id': 'missing_db', 'question': 'How many?', 'SQL': 'SELECT 1'}, 'missing_db.sqlite does not exist'),
}


def break_file(path: pathlib.Path, record: dict) -> int:
  """Replaces the second record of a JSON-lines or JSON-array file with `record`; returns its line number."""
  text = path.read_text(encoding='utf-8')
  if text.lstrip().startswith('['):
    records = json.loads(text)
    records[1] = record
    path.write_text(json.dumps(records, indent=1, ensure_ascii=False), encoding='utf-8')
    return next(i for i, line in enumerate(path.read_text().split('\n'), 1) if line.startswith(' {') and i > 2)
  lines = text.splitlines()
  lines[1] = json.dumps(record, ensure_ascii=False)
  path.write_text('\n'.join(lines) + '\n', encoding='utf-8')
  return 2


def smoke_config(stage: str, **changes):
  """configs/<stage>.py:smoke with `changes` (dotted keys), checked, on a 2×2×2 mesh of the 8 test devices (the
  tiny model has 2 KV heads), for running a stage in the test process."""
  config = config_lib.from_file(ROOT / 'configs' / f'{stage}.py', 'smoke')
  config.mesh.update(dict(data=2, fsdp=2, tensor=2))
  for key, value in changes.items():
    node = config
    *parents, leaf = key.split('.')
    for part in parents:
      node = node[part]
    node[leaf] = value
  config_lib.check(config)
  return config
