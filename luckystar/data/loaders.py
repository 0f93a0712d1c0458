"""Loaders for the real formats users bring: Spider/BIRD, math jsonl, KoBALT-style MC jsonl.

Every loader names the file and line of a malformed record, as a `DataError`: a ValueError that
`luckystar.main` prints without a traceback.
"""

import bisect
import json
import pathlib
import re
from typing import Any, Iterator

from luckystar import errors, files
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

  Read within `files`' bounds: a FIFO or device, JSON nested too deep, NaN, or a lone surrogate is an error naming
  file and line; a leading byte-order mark is dropped. A JSON-lines file is `files.parse_jsonl`'s. Text after an
  array's closing bracket, or a trailing comma in it, is an error naming file and line."""
  path = pathlib.Path(path)
  try:
    text = files.read_text(path, what='data file')
  except errors.UserError as e:
    raise DataError(str(e)) from None
  line_at = lambda index: text.count('\n', 0, index) + 1
  start = _WHITESPACE.match(text).end()
  if text[start:start + 1] == '[':  # a JSON array: decode element by element to keep line numbers
    if files.json_depth(text) > files.MAX_JSON_DEPTH + 1:   # the array itself is one level
      line = _deepest_line(text)
      raise DataError(f'{path}:{line}: JSON nested more than {files.MAX_JSON_DEPTH} levels deep in this record')
    index = _WHITESPACE.match(text, start + 1).end()
    while text[index:index + 1] != ']':  # not an empty array
      try:
        _, end = _SCANNER.raw_decode(text, index)
      except json.JSONDecodeError as e:
        raise DataError(f'{path}:{line_at(e.pos)}: invalid JSON: {e.msg}') from None
      yield line_at(index), _loads(text[index:end], f'{path}:{line_at(index)}')
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
  try:
    yield from files.parse_jsonl(text, path)
  except errors.InvalidFile as e:
    raise DataError(str(e)) from None


# Finds where an array element ends, depth already checked; `files.loads` then parses the element itself, so a
# number too long for int() or a NaN is judged there, once, as in JSON-lines files.
_SCANNER = json.JSONDecoder(parse_int=str, parse_float=str, parse_constant=str)


def _loads(text: str, source: str) -> Any:
  try:
    return files.loads(text, source)
  except errors.InvalidFile as e:
    raise DataError(str(e)) from None


def _deepest_line(text: str) -> int:
  """The first line by whose end JSON `text` nests deeper than allowed (a line never ends inside a JSON string,
  so each prefix of whole lines has the depth it has in the file)."""
  ends = [match.start() for match in re.finditer('\n', text)] + [len(text)]
  limit = files.MAX_JSON_DEPTH + 1
  return bisect.bisect_left(range(len(ends)), True, key=lambda k: files.json_depth(text[:ends[k]]) > limit) + 1


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
  databases at `database_dir/<db_id>/<db_id>.sqlite`, which a db_id cannot leave."""
  database_dir, contexts, examples = pathlib.Path(database_dir), {}, []
  for line, record in read_records(questions):
    question = _field(record, ('question',), questions, line)
    sql = _field(record, ('query', 'SQL'), questions, line)
    name = _field(record, ('db_id',), questions, line)
    db_path = database_dir / name / f'{name}.sqlite'
    if name not in contexts:
      _check_database(db_path, name, database_dir, f'{questions}:{line}')
      try:
        contexts[name] = nl2sql.context(name, db_path)
      except ValueError as e:   # not a SQLite database, or one the sandbox cannot read
        raise DataError(f'{questions}:{line}: {" ".join(str(e).split())}') from None
    evidence = record.get('evidence')
    prompt = f'{question}\n(Hint: {evidence})' if evidence else question
    examples.append(Example(
        id=f'{pathlib.Path(questions).stem}-{line}', task='nl2sql', language=_language(record, question,
                                                                                          questions, line),
        split=split, prompt=prompt, answer=sql, system=contexts[name],
        meta={'db_id': name, 'db_path': str(db_path)}))
  return examples


def _check_database(db_path: pathlib.Path, name: str, database_dir: pathlib.Path, where: str) -> None:
  """A question's database must be a regular file inside `database_dir`: a db_id such as '../x' or '/x', or a
  link out of the directory, would have the sandbox read a database the dataset does not hold."""
  if name in ('.', '..') or any(c in name for c in '/\\\0'):
    raise DataError(f'{where}: db_id {name!r} must be the name of a directory in {database_dir}')
  try:
    files.regular_file(db_path, 'database')
  except errors.MissingFile:
    raise DataError(f'{where}: database {db_path} does not exist') from None
  except errors.InvalidFile as e:
    raise DataError(f'{where}: {e}') from None
  if not (resolved := db_path.resolve()).is_relative_to(database_dir.resolve()):
    raise DataError(f'{where}: database {db_path} is a link to {resolved}, outside {database_dir}; copy the database '
                    f'into the dataset (db_id {name!r})')


def _answer(record: dict, path, line) -> str:
  """A math answer as text: a string, or a number (a bool is no answer; `files.loads` already refused NaN and
  infinities, and kept a long integer as its digits)."""
  answer = _field(record, ('answer',), path, line, kind=(str, int, float))
  if isinstance(answer, bool):
    raise DataError(f'{path}:{line}: field \'answer\' must be a non-empty string or a finite number, got '
                    f'{json.dumps(answer)}')
  return str(answer)


def load_math_jsonl(path: str | pathlib.Path, *, split: str = 'heldout') -> list[Example]:
  """Records with `problem` (or `question`) and `answer` (string or number); optional `solution` and `language`."""
  examples = []
  for line, record in read_records(path):
    problem = _field(record, ('problem', 'question'), path, line)
    answer = _answer(record, path, line)
    solution = _field(record, ('solution',), path, line) if record.get('solution') is not None else None
    examples.append(Example(
        id=f'{pathlib.Path(path).stem}-{line}', task='math', language=_language(record, problem, path, line),
        split=split, prompt=problem, answer=answer, thinking=solution))
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
      if (not isinstance(options, list) or not 2 <= len(options) <= korean_mc.NUM_OPTIONS
          or not all(isinstance(o, str) and o.strip() for o in options)):
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
