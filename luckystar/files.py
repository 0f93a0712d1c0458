"""Reading what comes from outside (data files, checkpoint files, request bodies, a judge's reply) within bounds.

Every external input is bounded in size and JSON depth before it is parsed and checked to be encodable text, so a
hostile file or body fails with one line naming its source (`file:line`, a request field, a path) instead of a
`RecursionError`, a hang on a FIFO or a read of `/dev/zero`. docs/testing.md lists where each class is tested.
"""

import json
import math
import os
import pathlib
import re
import stat
from typing import Any, Iterator

import numpy as np

from luckystar import errors

MAX_JSON_DEPTH = 64            # deeper than any chat, data or tokenizer file; Python's parser recurses per level
MAX_FILE_BYTES = 1 << 30       # a data file read whole (the largest real one, BIRD's train.json, is ~10 MB)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def regular_file(path: str | pathlib.Path, what: str = 'file') -> pathlib.Path:
  """`path`, checked to exist and to be a regular file (a symlink to one is fine): reading a FIFO blocks and a
  device never ends. Raises MissingFile or InvalidFile naming the path."""
  path = pathlib.Path(path)
  try:
    mode = os.stat(path).st_mode
  except FileNotFoundError:
    raise errors.MissingFile(f'{path}: no such {what}') from None
  except OSError as e:
    raise errors.InvalidFile(f'{path}: cannot read the {what}: {e.strerror or e}') from None
  if not stat.S_ISREG(mode):
    raise errors.InvalidFile(f'{path}: the {what} is not a regular file (a FIFO, device or directory)')
  return path


def read_bytes(path: str | pathlib.Path, max_bytes: int = MAX_FILE_BYTES, what: str = 'file') -> bytes:
  """The bytes of a regular file of at most `max_bytes`; one error naming the path otherwise."""
  path = regular_file(path, what)
  try:
    with open(path, 'rb') as f:
      if os.fstat(f.fileno()).st_size > max_bytes:
        raise errors.InvalidFile(f'{path}: the {what} is larger than {max_bytes:,} bytes')
      data = f.read(max_bytes + 1)
  except OSError as e:
    raise errors.InvalidFile(f'{path}: cannot read the {what}: {e.strerror or e}') from None
  if len(data) > max_bytes:   # grew while being read
    raise errors.InvalidFile(f'{path}: the {what} is larger than {max_bytes:,} bytes')
  return data


def read_text(path: str | pathlib.Path, max_bytes: int = MAX_FILE_BYTES, what: str = 'file') -> str:
  """UTF-8 text of a regular file, a leading byte-order mark dropped (Windows editors write one)."""
  data = read_bytes(path, max_bytes, what)
  try:
    return data.decode('utf-8-sig')
  except UnicodeDecodeError as e:
    line = data.count(b'\n', 0, e.start) + 1
    raise errors.InvalidFile(f'{path}:{line}: the {what} is not UTF-8 text (byte {e.start})') from None


def json_depth(text: str | bytes) -> int:
  """How deeply arrays and objects nest in JSON text, brackets inside strings ignored; linear and recursion-free."""
  data = text.encode('utf-8', 'surrogatepass') if isinstance(text, str) else text
  codes = np.frombuffer(_STRING.sub(b'""', data), np.uint8)
  steps = (codes == ord('[')).astype(np.int32) + (codes == ord('{')) - (codes == ord(']')) - (codes == ord('}'))
  return int(np.cumsum(steps).max(initial=0))


def unencodable(value: Any) -> str | None:
  """The first string in `value` (nested lists and dicts, keys included) that is not valid Unicode (a lone
  surrogate, which JSON's `\\ud800` escape can carry), or None."""
  stack = [value]
  while stack:
    item = stack.pop()
    if isinstance(item, str):
      try:
        item.encode('utf-8')
      except UnicodeEncodeError:
        return item
    elif isinstance(item, dict):
      stack.extend(item.keys())
      stack.extend(item.values())
    elif isinstance(item, (list, tuple)):
      stack.extend(item)
  return None


def loads(text: str | bytes, source: str, *, max_depth: int = MAX_JSON_DEPTH, check_text: bool = True,
          finite: bool = True) -> Any:
  """`json.loads` bounded in depth, its strings checked to be encodable; a ValueError (errors.InvalidFile) whose
  message starts with `source` (a path, `file:line` or a request field) for anything else.

  Non-finite numbers (`NaN`, `Infinity`, `1e999`, which Python's parser accepts) are refused: JSON has none.
  `finite=False` keeps them, for files Python's `json.dumps` wrote (a saved config or a model's config.json may
  hold `Infinity`).
  An integer of more than 4,000 digits stays a string (Python will not convert it); callers that need a number
  check the type."""
  if (depth := json_depth(text)) > max_depth:
    raise errors.InvalidFile(f'{source}: JSON nested {depth} levels deep (at most {max_depth})')
  try:
    value = (json.loads(text, parse_constant=_refuse_constant, parse_int=_integer, parse_float=_finite) if finite
             else json.loads(text, parse_int=_integer))
  except json.JSONDecodeError as e:
    raise errors.InvalidFile(f'{source}: invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})') from None
  except (UnicodeDecodeError, RecursionError, _NonFinite) as e:
    raise errors.InvalidFile(f'{source}: invalid JSON: {e}') from None
  if check_text and (bad := unencodable(value)) is not None:
    raise errors.InvalidFile(f'{source}: a string is not valid Unicode (a lone surrogate): {ascii(bad[:40])}')
  return value


def _integer(digits: str) -> int | str:
  # Python refuses to convert more than 4,300 digits (sys.set_int_max_str_digits); such a value stays its text
  return int(digits) if len(digits) <= 4000 else digits


class _NonFinite(ValueError):
  pass


def _finite(text: str) -> float:
  if not math.isfinite(value := float(text)):   # 1e999 parses to inf
    raise _NonFinite(f'{text} is not a finite number')
  return value


def _refuse_constant(name: str):
  raise _NonFinite(f'{name} is not a JSON number')


def read_json(path: str | pathlib.Path, max_bytes: int = MAX_FILE_BYTES, what: str = 'file', **kwargs) -> Any:
  """A JSON file read within `max_bytes` and `loads`' bounds; errors name the path."""
  return loads(read_text(path, max_bytes, what), str(path), **kwargs)


def read_json_object(path: str | pathlib.Path, max_bytes: int = MAX_FILE_BYTES, what: str = 'file',
                     **kwargs) -> dict[str, Any]:
  """`read_json` of a file that must hold one JSON object (a config, an index, a record)."""
  value = read_json(path, max_bytes, what, **kwargs)
  if not isinstance(value, dict):
    raise errors.InvalidFile(f'{path}: expected a JSON object, got a JSON {type(value).__name__}')
  return value


def json_lines(text: str) -> Iterator[tuple[int, str]]:
  """(line number, line) of each non-blank line of JSON-lines text. Lines end at '\\n' only (a '\\r' before it is
  dropped): json.dumps(ensure_ascii=False) leaves U+2028, U+2029 and U+0085 unescaped inside strings, and
  str.splitlines() would split a record there."""
  for number, line in enumerate(text.split('\n'), 1):
    if line.strip():
      yield number, line.removesuffix('\r')


def parse_jsonl(text: str, source: str | pathlib.Path, **kwargs) -> Iterator[tuple[int, Any]]:
  """(line number, value) of each non-blank line of JSON-lines text, each parsed by `loads` (with `kwargs`): a bad
  line is an InvalidFile that starts with `source:line`."""
  for number, line in json_lines(text):
    yield number, loads(line, f'{source}:{number}', **kwargs)


def read_jsonl(path: str | pathlib.Path, max_bytes: int = MAX_FILE_BYTES, what: str = 'file',
               **kwargs) -> Iterator[tuple[int, Any]]:
  """`parse_jsonl` of a JSON-lines file, read within `read_text`'s bounds now (a missing or unreadable file fails
  at the call), its lines parsed as they are iterated."""
  return parse_jsonl(read_text(path, max_bytes, what), path, **kwargs)
