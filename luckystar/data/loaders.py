"""Loaders for the real formats users bring: Spider/BIRD, math jsonl, KoBALT-style MC jsonl.

Every loader names the file and line of a malformed record, as a `DataError`: a ValueError that
`luckystar.main` prints without a traceback.
"""

import json
import pathlib
import re
from typing import Any, Iterator

from luckystar import errors
from luckystar.data import korean_mc, nl2sql
from luckystar.data.examples import Example
from luckystar.rewards import language as rewards_language

_WHITESPACE = re.compile(r'\s*')


class DataError(errors.UserError, ValueError):
  """A malformed data file; the message names file:line."""


def read_records(path: str | pathlib.Path) -> Iterator[tuple[int, dict]]:
  """(line number, object) from a JSON-lines file or a JSON array file (Spider's layout); blank lines
  are skipped, and anything that is not a JSON object is an error naming file and line."""
  for line, record in _read_json_values(path):
    if not isinstance(record, dict):
      raise DataError(f'{path}:{line}: expected a JSON object, got {type(record).__name__}')
    yield line, record


def _read_json_values(path: str | pathlib.Path) -> Iterator[tuple[int, Any]]:
  """(line number, value) of each element of a JSON array file, or of each non-blank line of a JSON-lines file.

  Lines end at '\n' only (a '\r' before it is dropped): json.dumps(ensure_ascii=False) leaves U+2028, U+2029
  and U+0085 unescaped inside strings, and str.splitlines() would split a record there. Text after an
  array's closing bracket, or a trailing comma in it, is an error naming file and line."""
  path = pathlib.Path(path)
  try:
    text = path.read_text(encoding='utf-8')
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f'{path}: cannot read: {e}') from None
  line_at = lambda index: text.count('\n', 0, index) + 1
  decoder = json.JSONDecoder()
  start = _WHITESPACE.match(text).end()
  if text[start:start + 1] == '[':  # a JSON array: decode element by element to keep line numbers
    index = _WHITESPACE.match(text, start + 1).end()
    while text[index:index + 1] != ']':  # not an empty array
      try:
        record, end = decoder.raw_decode(text, index)
      except json.JSONDecodeError as e:
        raise DataError(f'{path}:{line_at(e.pos)}: invalid JSON: {e.msg}') from None
      yield line_at(index), record
      index = _WHITESPACE.match(text, end).end()
      if text[index:index + 1] == ']':
        break
      if text[index:index + 1] != ',':
        raise DataError(f'{path}:{line_at(index)}: expected "," or "]" in JSON array')
      index = _WHITESPACE.match(text, index + 1).end()
      if text[index:index + 1] == ']':
        raise DataError(f'{path}:{line_at(index)}: invalid JSON: trailing "," before "]" in JSON array')
    if (end := _WHITESPACE.match(text, index + 1).end()) < len(text):
      raise DataError(f'{path}:{line_at(end)}: unexpected text after the JSON array\'s closing "]"')
    return
  for line, raw in enumerate(text.split('\n'), 1):
    raw = raw.removesuffix('\r')
    if raw.strip():
      try:
        yield line, json.loads(raw)
      except json.JSONDecodeError as e:
        raise DataError(f'{path}:{line}: invalid JSON: {e.msg}') from None


def _field(record: dict, names: tuple[str, ...], path, line, kind=str):
  for name in names:
    if name in record:
      value = record[name]
      if not isinstance(value, kind) or (isinstance(value, str) and not value.strip()):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        raise DataError(f'{path}:{line}: field {name!r} must be a non-empty {" or ".join(k.__name__ for k in kinds)}')
      return value
  raise DataError(f'{path}:{line}: missing field {" or ".join(repr(n) for n in names)}')


def _language(record: dict, text: str, path, line) -> str:
  language = record.get('language')
  if language is None:  # the one prompt-language rule; text with no clear language (e.g. "1+1?") is tagged en
    return rewards_language.classify_prompt(text) or 'en'
  if language not in ('ko', 'en'):
    raise DataError(f'{path}:{line}: language must be "ko" or "en", got {language!r}')
  return language


def load_spider(questions: str | pathlib.Path, database_dir: str | pathlib.Path, *, split: str = 'heldout'
                ) -> list[Example]:
  """Spider (`question`, `query`, `db_id`) or BIRD (`question`, `SQL`, `db_id`, optional `evidence`) records;
  databases at `database_dir/<db_id>/<db_id>.sqlite`."""
  database_dir, contexts, examples = pathlib.Path(database_dir), {}, []
  for line, record in read_records(questions):
    question = _field(record, ('question',), questions, line)
    sql = _field(record, ('query', 'SQL'), questions, line)
    name = _field(record, ('db_id',), questions, line)
    db_path = database_dir / name / f'{name}.sqlite'
    if name not in contexts:
      if not db_path.is_file():
        raise DataError(f'{questions}:{line}: database {db_path} does not exist')
      contexts[name] = nl2sql.context(name, db_path)
    evidence = record.get('evidence')
    prompt = f'{question}\n(Hint: {evidence})' if evidence else question
    examples.append(Example(
        id=f'{pathlib.Path(questions).stem}-{line}', task='nl2sql', language=_language(record, question,
                                                                                          questions, line),
        split=split, prompt=prompt, answer=sql, system=contexts[name],
        meta={'db_id': name, 'db_path': str(db_path)}))
  return examples


def load_math_jsonl(path: str | pathlib.Path, *, split: str = 'heldout') -> list[Example]:
  """Records with `problem` (or `question`) and `answer` (string or number); optional `solution` and `language`."""
  examples = []
  for line, record in read_records(path):
    problem = _field(record, ('problem', 'question'), path, line)
    answer = _field(record, ('answer',), path, line, kind=(str, int, float))
    examples.append(Example(
        id=f'{pathlib.Path(path).stem}-{line}', task='math', language=_language(record, problem, path, line),
        split=split, prompt=problem, answer=str(answer), thinking=record.get('solution')))
  return examples


def load_kobalt_jsonl(path: str | pathlib.Path, *, split: str = 'heldout') -> list[Example]:
  """KoBALT-style records: `question`/`Question` (options inside, or a separate `options` list of ≤ 10)
  and `answer`/`Answer`, a letter A–J."""
  examples = []
  for line, record in read_records(path):
    question = _field(record, ('question', 'Question'), path, line)
    answer = _field(record, ('answer', 'Answer'), path, line).strip().upper()
    options = record.get('options')
    if options is not None:
      if not isinstance(options, list) or not 2 <= len(options) <= korean_mc.NUM_OPTIONS:
        raise DataError(f'{path}:{line}: options must be a list of 2–{korean_mc.NUM_OPTIONS} strings')
      question += '\n\n' + '\n'.join(f'{l}. {o}' for l, o in zip(korean_mc.LETTERS, options))
    letters = korean_mc.LETTERS[:len(options)] if options else korean_mc.LETTERS
    if answer not in letters:
      raise DataError(f'{path}:{line}: answer {answer!r} is not one of the letters {letters}')
    examples.append(Example(
        id=f'{pathlib.Path(path).stem}-{line}', task='korean_mc', language='ko', split=split, prompt=question,
        answer=answer, meta={k: record[k] for k in ('Class', 'Subclass', 'Difficulty', 'class', 'subclass')
                             if k in record}))
  return examples
