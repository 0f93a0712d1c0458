"""The SQL tool: runs one untrusted, read-only query against a SQLite database.

The query comes from a policy that RL pushes to exploit every hole, so
`execute` never raises on it and each guard below holds without the others:

  1. text checks (here): a str or UTF-8 bytes of at most MAX_SQL_CHARS, no NUL
     or lone surrogate, exactly one statement (sqlglot's tokenizer, so a `;`
     inside a string, identifier or comment does not count; trailing `;`s and
     comments are fine and are cut before SQLite sees the text), starting with
     SELECT, WITH or VALUES;
  2. the database is read without writing a byte beside it (a missing file is
     an error, never created), yet returns what a normal read would (`_open`):
     a rollback-journal database opens `mode=ro`; a WAL database whose content
     is all in its file opens `immutable=1` (`mode=ro` would create -wal and
     -shm); one with a non-empty -wal or -journal beside it (committed frames to
     read, or a hot journal to roll back) is copied with it into the worker's
     private directory and read there, because in place `immutable=1` returns
     stale or torn rows and `mode=ro` writes the -shm or fails. Then
     `PRAGMA query_only=ON`, load_extension off, SQLITE_LIMIT_ATTACHED 0;
  3. an authorizer that allows only SELECT, READ, RECURSIVE and FUNCTION
     (minus DENIED_FUNCTIONS): every write, ATTACH/DETACH (VACUUM INTO attaches
     its target, so it dies here too), CREATE/DROP/ALTER (temp objects too),
     PRAGMA, transaction and savepoint is refused. Table-valued functions
     (json_each, pragma_table_info, dbstat) are refused as well, because SQLite
     authorizes their construction as an UPDATE of sqlite_master;
  4. resource caps: a progress handler every PROGRESS_OPS VM steps stops the
     query at the deadline; SQLITE_LIMIT_LENGTH (MAX_VALUE_BYTES) makes a
     multi-GB zeroblob/randomblob/replace fail at once instead of allocating;
     rows, bytes per cell and bytes in total are capped while fetching;
  5. a separate process: the progress handler and sqlite3_interrupt are only
     checked at the bottom of VM loops, so straight-line SQL such as
     `instr(a, b) + instr(a, b) + ...` over 100 kB strings, or SQLite's own
     printf('%.*c', 2000000000, 'x') loop, runs for minutes inside one step.
     Queries therefore run in a pooled worker process (`luckystar.workers`:
     `python -I -S`, stdlib only, address space and file size limited) that
     the caller kills at timeout_s + KILL_GRACE_S and replaces at once. A
     call costs ~1 ms of IPC; a cold worker needs ~0.1 s to start, which
     counts against the call's timeout (a worker not started in time is kept
     for the next call).

A bad timeout_s or cap is the caller's bug, not the model's, so it raises
ValueError at once; everything about the query text or the database is an
`ok=False` result with a readable `error`. Databases are assumed not to be
written while they are read (the copy of a -wal or -journal is not atomic).

Cells keep SQLite's Python types: int, float, str, None, and bytes for BLOBs
(bytes, not hex text, so a BLOB never equals a TEXT that spells its hex;
format_result renders them as x'..'). Invalid UTF-8 in TEXT decodes with
U+FFFD. A TEXT cell cut at max_cell_bytes ends in TRUNCATION_MARK.

Needs a POSIX system (poll on pipes, the resource module).
"""

import atexit
import dataclasses
import marshal
import math
import numbers
import os
import pathlib
import shutil
import sqlite3
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse
from typing import Any, Callable

from luckystar import workers

MAX_SQL_CHARS = 20_000          # real NL2SQL queries are < 5k; also bounds tokenizing time
MAX_VALUE_BYTES = 1_000_000     # SQLITE_LIMIT_LENGTH: the largest string or blob a query may build
MAX_LIKE_PATTERN_BYTES = 1_000  # SQLITE_LIMIT_LIKE_PATTERN_LENGTH (SQLite's default is 50k)
PROGRESS_OPS = 1_000            # VM steps between deadline checks
BUSY_TIMEOUT_S = 0.1            # a write lock held by someone else fails fast instead of sleeping
KILL_GRACE_S = 0.25             # past timeout_s the worker gets this long to answer, then is killed
WORKER_MEMORY_BYTES = 2 << 30   # RLIMIT_AS of a worker: a runaway query gets 'out of memory'
WORKER_FILE_BYTES = 1 << 30     # RLIMIT_FSIZE: caps the temp files a big sort spills to
MAX_IDLE_WORKERS = 4
TRUNCATION_MARK = '…'

ALLOWED_FIRST_KEYWORDS = ('SELECT', 'WITH', 'VALUES')
DENIED_FUNCTIONS = frozenset({'load_extension', 'fts3_tokenizer', 'readfile', 'writefile', 'edit'})

_LIMITS = {  # looked up on the sqlite3 module, so a Python without a constant skips it
    'SQLITE_LIMIT_LENGTH': MAX_VALUE_BYTES,
    'SQLITE_LIMIT_SQL_LENGTH': 4 * MAX_SQL_CHARS,   # bytes; a Korean character is 3 in UTF-8
    'SQLITE_LIMIT_ATTACHED': 0,
    'SQLITE_LIMIT_LIKE_PATTERN_LENGTH': MAX_LIKE_PATTERN_BYTES,
    'SQLITE_LIMIT_TRIGGER_DEPTH': 1,
    'SQLITE_LIMIT_WORKER_THREADS': 0,
}
_READ_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
_DENIAL_REASONS = {  # authorizer action → what the error tells the model; anything else is a schema change
    sqlite3.SQLITE_INSERT: 'write',
    sqlite3.SQLITE_UPDATE: 'write',
    sqlite3.SQLITE_DELETE: 'write',
    sqlite3.SQLITE_ATTACH: 'attach',
    sqlite3.SQLITE_DETACH: 'attach',
    sqlite3.SQLITE_PRAGMA: 'pragma',
    sqlite3.SQLITE_TRANSACTION: 'transaction',
    sqlite3.SQLITE_SAVEPOINT: 'transaction',
}
_FIRST_KEYWORD_REASONS = {  # leading keyword of a refused statement → reason
    **dict.fromkeys(('INSERT', 'UPDATE', 'DELETE', 'REPLACE', 'UPSERT', 'MERGE', 'VACUUM'), 'write'),
    **dict.fromkeys(('CREATE', 'DROP', 'ALTER', 'REINDEX', 'ANALYZE'), 'schema change'),
    **dict.fromkeys(('ATTACH', 'DETACH'), 'attach'),
    **dict.fromkeys(('BEGIN', 'COMMIT', 'END', 'ROLLBACK', 'SAVEPOINT', 'RELEASE'), 'transaction'),
    'PRAGMA': 'pragma',
}


@dataclasses.dataclass(frozen=True)
class SqlResult:
  """What one query returned, or why it did not run.

  `truncated` says the row, cell or total-size cap was hit: `rows` then holds
  a prefix of the real rows, or cut cells, not the result.
  """
  ok: bool
  columns: tuple[str, ...] = ()
  rows: tuple[tuple[Any, ...], ...] = ()
  truncated: bool = False
  error: str | None = None
  elapsed_s: float = 0.0


def execute(db_path: str | os.PathLike, sql: Any, *, timeout_s: float = 2.0, max_rows: int = 200,
            max_cell_bytes: int = 2_000, max_total_bytes: int = 200_000) -> SqlResult:
  """Runs one read-only query in a sandbox: a failure is `ok=False` with a readable `error`, whatever `sql` is.

  Returns within about timeout_s + KILL_GRACE_S, whatever the query. Raises ValueError only for the caller's
  own arguments: timeout_s must be a positive finite number, the caps positive integers.
  """
  timeout_s, caps = _checked_arguments(timeout_s, max_rows=max_rows, max_cell_bytes=max_cell_bytes,
                                       max_total_bytes=max_total_bytes)
  start = time.monotonic()
  try:
    result = _execute(db_path, sql, start + timeout_s, timeout_s, *caps)
  except Exception as e:  # pylint: disable=broad-except  # the contract: a result, never an exception
    result = SqlResult(ok=False, error=f'internal error: {type(e).__name__}: {e}')
  return dataclasses.replace(result, elapsed_s=time.monotonic() - start)


def _checked_arguments(timeout_s, **caps) -> tuple[float, tuple[int, ...]]:
  """(timeout_s, caps) as float and ints, or ValueError naming the bad one (NaN fails every comparison)."""
  if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not 0 < timeout_s < math.inf:
    raise ValueError(f'timeout_s must be a positive finite number of seconds, got {timeout_s!r}')
  for name, value in caps.items():
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
      raise ValueError(f'{name} must be a positive integer, got {value!r}')
  return float(timeout_s), tuple(int(value) for value in caps.values())


def schema(db_path: str | os.PathLike) -> str:
  """The CREATE TABLE statements of a database, in creation order, one per line with whitespace
  collapsed (a compact prompt)."""
  result = execute(db_path, "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL "
                   "AND name NOT LIKE 'sqlite^_%' ESCAPE '^' ORDER BY rowid", timeout_s=10.0,
                   max_rows=10_000, max_cell_bytes=MAX_VALUE_BYTES, max_total_bytes=10 * MAX_VALUE_BYTES)
  if not result.ok:
    raise ValueError(f'{db_path}: cannot read the schema: {result.error}')
  if result.truncated:
    raise ValueError(f'{db_path}: the schema is larger than {10 * MAX_VALUE_BYTES} bytes; too big for a prompt')
  return '\n'.join(' '.join(row[0].split()) + ';' for row in result.rows)


def format_result(result: SqlResult, max_chars: int = 2_000) -> str:
  """Deterministic text of a result for the tool turn the model reads.

  A header of column names, one line per row (cells joined by ' | ', NULL for
  None, newlines escaped) and a footer with the row count that says when the
  result was truncated or rows were dropped to fit max_chars.
  """
  if not result.ok:
    return f'ERROR: {result.error}'[:max_chars]
  lines = [' | '.join(_render_cell(c) for c in result.columns)]
  lines += [' | '.join(_render_cell(c) for c in row) for row in result.rows]
  total = len(result.rows)
  more = '+' if result.truncated else ''
  text = '\n'.join([*lines, f'({total}{more} rows{"; truncated" if more else ""})'])
  for shown in range(total - 1, -1, -1):  # drop rows from the end until the text fits
    if len(text) <= max_chars:
      break
    text = '\n'.join([*lines[:shown + 1], f'({shown} of {total}{more} rows shown)'])
  return text[:max_chars]


def _render_cell(value: Any) -> str:
  if value is None:
    return 'NULL'
  if isinstance(value, bytes):
    return f"x'{value.hex()}'"
  if isinstance(value, float):
    return repr(value)
  return str(value).replace('\\', '\\\\').replace('\n', '\\n').replace('\r', '\\r')


# ---- The caller's side: text checks and the worker pool. ----


def _execute(db_path, sql, deadline, timeout_s, max_rows, max_cell_bytes, max_total_bytes) -> SqlResult:
  text, error = _check_text(sql)
  if error:
    return SqlResult(ok=False, error=error)
  try:
    path = pathlib.Path(os.fsdecode(db_path)).resolve()
  except (TypeError, ValueError, OSError) as e:
    return SqlResult(ok=False, error=f'bad database path {db_path!r}: {e}')
  try:
    mode = path.stat().st_mode
  except (FileNotFoundError, NotADirectoryError):
    return SqlResult(ok=False, error=f'database not found: {path}')
  except OSError as e:
    return SqlResult(ok=False, error=f'cannot open database {path}: {e}')
  if not stat.S_ISREG(mode):
    return SqlResult(ok=False, error=f'database is not a file: {path}')
  worker = _checkout_worker()
  request = (str(path), worker.scratch, text, timeout_s, max_rows, max_cell_bytes, max_total_bytes)
  try:
    if not worker.wait_until_ready(deadline + KILL_GRACE_S):
      _return_worker(worker)  # only slow to start (a loaded machine): the next call gets it ready
      return SqlResult(ok=False, error=f'timeout: the sandbox process did not start within {timeout_s:g} s')
    reply = worker.ask(request, deadline, deadline + KILL_GRACE_S)
  except workers.WorkerDied:
    worker.kill()
    _return_worker(_Worker())
    return SqlResult(ok=False, error='sandbox error: the query process died (crashed or was killed); try again')
  except Exception:
    worker.kill()
    raise
  if reply is None:
    worker.kill()
    _return_worker(_Worker())  # start the replacement now, so the next call does not wait for its startup
    return SqlResult(ok=False, error=f'timeout: the query ran longer than {timeout_s:g} s')
  _return_worker(worker)
  ok, columns, rows, truncated, error = marshal.loads(reply)
  return SqlResult(ok=ok, columns=columns, rows=rows, truncated=truncated, error=error)


def _check_text(sql: Any) -> tuple[str, str | None]:
  """(query text, None), or ('', why it is refused before SQLite sees it)."""
  import sqlglot  # pylint: disable=import-outside-toplevel  # workers run without site-packages
  if isinstance(sql, (bytes, bytearray, memoryview)):
    size = memoryview(sql).nbytes
    if size > 4 * MAX_SQL_CHARS:
      return '', f'query too long: {size} bytes (at most {MAX_SQL_CHARS} characters)'
    try:
      sql = bytes(sql).decode('utf-8')
    except UnicodeDecodeError as e:
      return '', f'query is not valid UTF-8: {e}'
  if not isinstance(sql, str):
    return '', f'query must be a string, got {type(sql).__name__}'
  sql = str(sql)  # a str subclass would not marshal to the worker
  if len(sql) > MAX_SQL_CHARS:
    return '', f'query too long: {len(sql)} characters (at most {MAX_SQL_CHARS})'
  if '\0' in sql:
    return '', 'query contains a NUL character'
  try:
    sql.encode('utf-8')
  except UnicodeEncodeError as e:  # SQLite takes UTF-8, which cannot carry a lone surrogate
    return '', f'query is not valid Unicode: lone surrogate U+{ord(sql[e.start]):04X} at character {e.start}'
  try:
    tokens = sqlglot.tokenize(sql, read='sqlite')
  except Exception as e:  # pylint: disable=broad-except  # any tokenizer failure is the query's
    return '', f'syntax error: cannot tokenize the query (unterminated string, identifier or comment?): {e}'
  statement_end = len(tokens)
  while statement_end and tokens[statement_end - 1].token_type == sqlglot.TokenType.SEMICOLON:
    statement_end -= 1
  if not statement_end:
    return '', 'empty query: send one SELECT query'
  if any(t.token_type == sqlglot.TokenType.SEMICOLON for t in tokens[:statement_end]):
    return '', 'multiple statements: send exactly one SELECT query'
  first = tokens[0].text.upper()
  if first not in ALLOWED_FIRST_KEYWORDS:
    reason = _FIRST_KEYWORD_REASONS.get(first, f'statement {first[:30]!r}')
    return '', f'not allowed: {reason}; only read-only SELECT / WITH / VALUES queries may run'
  if statement_end < len(tokens) and sql[tokens[statement_end].start] == ';':
    # Python's sqlite3 refuses text after the statement other than one `;`, whitespace and comments
    # (`SELECT 1;;`); what follows the first trailing `;` is only more of those, so it is cut.
    sql = sql[:tokens[statement_end].start]
  return sql, None


class _Worker:
  """One sandbox process (`luckystar.workers`), used by one call at a time; frames are marshal.

  `scratch` is its private directory for database copies (`_open`); killing the worker removes it, so a copy
  cut short by the kill does not stay behind.
  """

  def __init__(self):
    self.scratch = tempfile.mkdtemp(prefix='luckystar-sql-')
    self.child = workers.Worker(str(pathlib.Path(__file__).resolve()), '_worker_setup', flags=('-I', '-S'),
                                limits={'RLIMIT_AS': WORKER_MEMORY_BYTES, 'RLIMIT_FSIZE': WORKER_FILE_BYTES},
                                stderr=subprocess.DEVNULL)

  def wait_until_ready(self, deadline: float) -> bool:
    """Whether the worker has started (its imports done)."""
    return self.child.wait_until_ready(deadline)

  def ask(self, request: tuple, query_deadline: float, kill_deadline: float) -> bytes | None:
    """The marshalled reply, or None when kill_deadline passed first.

    The worker gets the seconds left until query_deadline, so its own clean
    timeout comes before the kill even when it started slowly.
    """
    try:
      return self.child.ask(marshal.dumps((query_deadline - time.monotonic(), *request)), kill_deadline)
    except TimeoutError:
      return None

  def kill(self):
    self.child.kill()
    shutil.rmtree(self.scratch, ignore_errors=True)


_idle_workers: list[_Worker] = []
_pool_lock = threading.Lock()
_pool_pid = os.getpid()


def _checkout_worker() -> _Worker:
  global _pool_pid
  with _pool_lock:
    if os.getpid() != _pool_pid:  # a forked child must not share its parent's pipes
      _idle_workers.clear()
      _pool_pid = os.getpid()
    if _idle_workers:
      return _idle_workers.pop()
  return _Worker()


def _return_worker(worker: _Worker):
  with _pool_lock:
    if len(_idle_workers) < MAX_IDLE_WORKERS and os.getpid() == _pool_pid:
      _idle_workers.append(worker)
      return
  worker.kill()


@atexit.register
def _stop_workers():
  with _pool_lock:
    while _idle_workers:
      _idle_workers.pop().kill()


# ---- The worker's side: stdlib only, in the `python -I -S` child `luckystar.workers` starts. ----


def _worker_setup() -> Callable[[bytes], bytes]:
  """The worker's answer to each request; the imports are done when this file loads."""
  return _answer


def _answer(request: bytes) -> bytes:
  try:
    return marshal.dumps(_run(*marshal.loads(request)))
  except MemoryError:  # RLIMIT_AS reached while Python held the rows
    return marshal.dumps((False, (), (), False, f'out of memory: the query needs more than '
                          f'{WORKER_MEMORY_BYTES >> 20} MiB'))
  except BaseException as e:  # pylint: disable=broad-except  # one bad request must not end the worker
    return marshal.dumps((False, (), (), False, f'internal error: {type(e).__name__}: {e}'))


def _run(seconds_left: float, path: str, scratch: str, text: str, timeout_s: float, max_rows: int,
         max_cell_bytes: int, max_total_bytes: int):
  """(ok, columns, rows, truncated, error) of one query, under guards 2-4."""
  try:
    return _run_in(seconds_left, path, scratch, text, timeout_s, max_rows, max_cell_bytes, max_total_bytes)
  finally:
    if os.path.isdir(scratch):
      for name in os.listdir(scratch):  # a private copy lives for one query
        os.unlink(os.path.join(scratch, name))


def _run_in(seconds_left, path, scratch, text, timeout_s, max_rows, max_cell_bytes, max_total_bytes):
  deadline = time.monotonic() + seconds_left
  denials = []  # the authorizer's reasons, for the error message
  try:
    conn = _open(path, scratch, deadline, denials)
  except (sqlite3.Error, OSError) as e:
    return False, (), (), False, f'cannot open database {path}: {e}'
  timeout = f'timeout: the query ran longer than {timeout_s:g} s'
  try:
    cursor = conn.execute(text)
    columns = tuple(str(d[0]) for d in cursor.description or ())
    rows, truncated = _fetch(cursor, max_rows, max_cell_bytes, max_total_bytes, deadline)
    if rows is None:
      return False, (), (), False, timeout
    return True, columns, rows, truncated, None
  except sqlite3.Error as e:
    if denials:
      return False, (), (), False, f'not allowed: {denials[-1]}; only read-only queries may run'
    if 'one statement' in str(e):
      return False, (), (), False, 'multiple statements: send exactly one SELECT query'
    if time.monotonic() >= deadline and 'interrupt' in str(e):
      return False, (), (), False, timeout
    if 'too big' in str(e):
      return False, (), (), False, f'result too large: a value would exceed {MAX_VALUE_BYTES} bytes ({e})'
    return False, (), (), False, f'sql error: {e}'
  finally:
    conn.close()


class _CannotOpen(OSError):
  pass


def _open(path: str, scratch: str, deadline: float, denials: list) -> sqlite3.Connection:
  """`_connect` on `path`, or on a private copy, so that the rows are a normal read's and nothing is written
  beside `path` (guard 2 of the module doc)."""
  with open(path, 'rb') as file:
    header = file.read(100)
  if not header:  # an empty database: a normal open reads nothing more (it deletes any -wal or -journal)
    return _connect(path, deadline, denials, immutable=True)
  if not header.startswith(b'SQLite format 3\0'):
    raise _CannotOpen('file is not a SQLite database')
  pending = [suffix for suffix in ('-wal', '-journal') if _starts_with_nonzero_byte(path + suffix)]
  if not pending:
    # File format versions at bytes 18-19: 2 is WAL. mode=ro on a WAL database, or beside any -wal file,
    # creates the -shm (and the -wal); with nothing to replay, the file alone is what a normal read sees.
    return _connect(path, deadline, denials, immutable=2 in header[18:20] or os.path.exists(path + '-wal'))
  size = sum(os.stat(path + suffix).st_size for suffix in ('', *pending))
  if size > WORKER_FILE_BYTES:
    raise _CannotOpen(f'it must be read from a private copy with its {" and ".join(pending)}, but they are '
                      f'{size} bytes (at most {WORKER_FILE_BYTES}); open it once with write access to fold '
                      f'them in (sqlite3 {path} "PRAGMA wal_checkpoint(TRUNCATE)")')
  os.makedirs(scratch, mode=0o700, exist_ok=True)  # the parent made it; a temp-directory cleaner may not wait
  copy = os.path.join(scratch, 'db.sqlite')
  for suffix in ('', *pending):
    shutil.copyfile(path + suffix, copy + suffix)
  recovery = sqlite3.connect(copy, isolation_level=None)  # no query of the model's: replays the WAL frames or
  try:                                                      # rolls back the hot journal, as a normal read would
    recovery.execute('SELECT count(*) FROM sqlite_master').fetchall()
  finally:
    recovery.close()
  return _connect(copy, deadline, denials)


def _starts_with_nonzero_byte(path: str) -> bool:
  """Whether a -wal or -journal holds anything SQLite would read: absent, empty or zeroed ones (journal_mode
  TRUNCATE or PERSIST after a commit) do not, a WAL starts with its magic and a hot journal with its own."""
  try:
    with open(path, 'rb') as file:
      return file.read(1) not in (b'', b'\0')
  except FileNotFoundError:
    return False


def _connect(path: str, deadline: float, denials: list, *, immutable: bool = False) -> sqlite3.Connection:
  """A connection that can only read `path` and stops at `deadline` (guards 2-4 of the module doc).

  immutable=True ignores locks and any -wal or -journal: right only where `_open` has found none to read.
  """
  uri = f'file:{urllib.parse.quote(path)}?mode=ro{"&immutable=1" if immutable else ""}'
  conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
  try:
    if hasattr(conn, 'enable_load_extension'):
      conn.enable_load_extension(False)
    for name, value in _LIMITS.items():
      if hasattr(sqlite3, name):
        conn.setlimit(getattr(sqlite3, name), value)
    conn.execute('PRAGMA query_only = ON')
    conn.text_factory = lambda raw: raw.decode('utf-8', 'replace')

    def authorize(action, arg1, arg2, unused_db_name, unused_trigger):
      if action in _READ_ACTIONS:
        return sqlite3.SQLITE_OK
      if action == sqlite3.SQLITE_FUNCTION:
        if (arg2 or '').lower() not in DENIED_FUNCTIONS:
          return sqlite3.SQLITE_OK
        denials.append(f'function {arg2}()')
      elif action == sqlite3.SQLITE_UPDATE and arg1 == 'sqlite_master':
        denials.append('schema write (table-valued functions such as json_each and pragma_table_info '
                       'are not available)')
      else:
        denials.append(_DENIAL_REASONS.get(action, 'schema change'))
      return sqlite3.SQLITE_DENY

    conn.set_authorizer(authorize)
    conn.set_progress_handler(lambda: time.monotonic() >= deadline, PROGRESS_OPS)  # true interrupts
  except BaseException:
    conn.close()
    raise
  return conn


def _fetch(cursor, max_rows, max_cell_bytes, max_total_bytes, deadline):
  """(rows, truncated) under the caps, one row at a time; rows is None past the deadline."""
  rows, total_bytes, truncated = [], 0, False
  while (row := cursor.fetchone()) is not None:
    if time.monotonic() >= deadline:
      return None, False
    if len(rows) >= max_rows:
      return tuple(rows), True
    cells = [_cap_cell(value, max_cell_bytes) for value in row]
    total_bytes += sum(size for _, size, _ in cells)
    if total_bytes > max_total_bytes:
      return tuple(rows), True
    rows.append(tuple(value for value, _, _ in cells))
    truncated |= any(cut for _, _, cut in cells)
  return tuple(rows), truncated


def _cap_cell(value, max_cell_bytes):
  """(value, its size in bytes, was_cut): TEXT cut at a UTF-8 boundary plus TRUNCATION_MARK, BLOB cut."""
  if isinstance(value, bytes):
    if len(value) > max_cell_bytes:
      return value[:max_cell_bytes], max_cell_bytes, True
    return value, len(value), False
  if isinstance(value, str):
    encoded = value.encode('utf-8')
    if len(encoded) > max_cell_bytes:
      return encoded[:max_cell_bytes].decode('utf-8', 'ignore') + TRUNCATION_MARK, max_cell_bytes, True
    return value, len(encoded), False
  return value, 8, False
