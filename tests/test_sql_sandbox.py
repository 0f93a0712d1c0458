"""The SQL sandbox against an adversarial list: nothing writes, nothing escapes, every call is bounded."""

import fractions
import hashlib
import os
import pathlib
import sqlite3
import time

import hypothesis
from hypothesis import strategies as st
import numpy
import pytest

from luckystar.tools import sql

pytestmark = pytest.mark.fast

TIMEOUT_S = 0.5
ANY_ERROR = 'ANY_ERROR'   # expectation: ok=False, whatever the message
OK = 'OK'                 # expectation: ok=True

CITIES = ('서울', '부산', '대구', '인천', '광주')


@pytest.fixture(scope='module')
def db_path(tmp_path_factory):
  """customers (100), orders (300) and products (20) with Korean text, NULLs and ISO dates."""
  path = tmp_path_factory.mktemp('db') / 'shop.sqlite'
  conn = sqlite3.connect(path)
  conn.executescript("""
      CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT, joined DATE, email TEXT);
      CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, price REAL, photo BLOB);
      CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id),
                           product_id INTEGER REFERENCES products(id), quantity INTEGER, ordered_at DATE);
  """)
  conn.executemany('INSERT INTO customers VALUES (?, ?, ?, ?, ?)', [
      (i, f'고객{i:03d}', CITIES[i % 5] if i % 7 else None, f'2023-{i % 12 + 1:02d}-{i % 28 + 1:02d}',
       None if i % 3 == 0 else f'c{i}@example.com') for i in range(1, 101)])
  conn.executemany('INSERT INTO products VALUES (?, ?, ?, ?)', [
      (i, f'상품 {i}', 1000.5 * i, bytes([i, 0, 255])) for i in range(1, 21)])
  conn.executemany('INSERT INTO orders VALUES (?, ?, ?, ?, ?)', [
      (i, i % 100 + 1, i % 20 + 1, i % 4 + 1, f'2024-{i % 12 + 1:02d}-{i % 28 + 1:02d}') for i in range(1, 301)])
  conn.commit()
  conn.close()
  return path


def _adversarial_queries(directory):
  """(sql, expected): expected is a substring of the error, ANY_ERROR, or OK."""
  infinite = 'WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) '
  big_strings = ("WITH s(a, b) AS (SELECT printf('%.*c', 99990, 'a'), printf('%.*c', 49990, 'a') || 'b') "
                 'SELECT ' + ' + '.join(['instr(a, b)'] * 40) + ' FROM s')
  return [
      # Writes of every kind.
      ("INSERT INTO customers VALUES (999, '해커', NULL, NULL, NULL)", 'not allowed: write'),
      ("UPDATE customers SET name = 'x'", 'not allowed: write'),
      ('DELETE FROM orders', 'not allowed: write'),
      ("REPLACE INTO customers (id, name) VALUES (1, 'x')", 'not allowed: write'),
      ("INSERT INTO customers (id, name) VALUES (1, 'x') ON CONFLICT(id) DO UPDATE SET name = 'y'",
       'not allowed: write'),
      ('WITH x AS (SELECT 1) INSERT INTO orders (id) SELECT * FROM x', 'not allowed: write'),  # past the text check
      ('WITH x AS (SELECT 1) DELETE FROM orders', 'not allowed: write'),
      ('WITH x AS (SELECT 1) UPDATE customers SET name = (SELECT * FROM x)', 'not allowed: write'),
      ('CREATE TABLE evil (x)', 'not allowed: schema change'),
      ('CREATE INDEX evil ON orders (quantity)', 'not allowed: schema change'),
      ('CREATE VIEW evil AS SELECT 1', 'not allowed: schema change'),
      ('CREATE TRIGGER evil AFTER INSERT ON orders BEGIN DELETE FROM customers; END', 'multiple statements'),
      ('CREATE TEMP TABLE evil AS SELECT * FROM customers', 'not allowed: schema change'),
      ('DROP TABLE orders', 'not allowed: schema change'),
      ('ALTER TABLE orders ADD COLUMN evil TEXT', 'not allowed: schema change'),
      ('VACUUM', 'not allowed: write'),
      (f"VACUUM INTO '{directory}/copy.sqlite'", 'not allowed: write'),
      ('REINDEX', 'not allowed: schema change'),
      ('ANALYZE', 'not allowed: schema change'),
      # Other databases, transactions, pragmas.
      (f"ATTACH DATABASE '{directory}/new.sqlite' AS evil", 'not allowed: attach'),
      ('DETACH DATABASE main', 'not allowed: attach'),
      ('BEGIN IMMEDIATE', 'not allowed: transaction'),
      ('COMMIT', 'not allowed: transaction'),
      ('SAVEPOINT s', 'not allowed: transaction'),
      ('PRAGMA journal_mode = DELETE', 'not allowed: pragma'),
      ('PRAGMA writable_schema = 1', 'not allowed: pragma'),
      ('PRAGMA user_version = 5', 'not allowed: pragma'),
      ('PRAGMA query_only = OFF', 'not allowed: pragma'),
      ("SELECT * FROM pragma_table_info('orders')", 'not allowed'),
      ("SELECT * FROM json_each('[1, 2]')", 'not allowed'),
      ('EXPLAIN SELECT 1', 'not allowed'),
      # Functions.
      ("SELECT load_extension('/tmp/evil.so')", 'not allowed: function load_extension'),
      ("SELECT fts3_tokenizer('simple')", 'not allowed: function fts3_tokenizer'),
      (f"SELECT writefile('{directory}/evil.txt', 'x')", ANY_ERROR),
      ("SELECT edit('x')", ANY_ERROR),
      # Statement smuggling.
      ('SELECT 1; DROP TABLE orders', 'multiple statements'),
      ('SELECT 1; -- x\n/* */ DROP TABLE orders', 'multiple statements'),
      ("SELECT ';' AS x; DROP TABLE orders", 'multiple statements'),
      ('SELECT 1 /* ; */; /* /* */ DROP TABLE orders', 'multiple statements'),
      ("SELECT '; DROP TABLE orders' AS x", OK),
      ('SELECT 1; -- a trailing comment is fine', OK),
      ('SELECT 1;', OK),
      ("SELECT 'unterminated", 'syntax error'),
      # Runaway work.
      (infinite + 'SELECT count(*) FROM r', 'timeout'),
      ('SELECT count(*) FROM orders a, orders b, orders c, orders d', 'timeout'),
      ('SELECT a.id FROM orders a, orders b, orders c, orders d ORDER BY random()', 'timeout'),
      (infinite + 'SELECT x FROM r', OK),   # huge output: cut at max_rows
      (infinite + "SELECT length(group_concat(printf('%.*c', 1000, 'x'))) FROM r", ANY_ERROR),
      (big_strings, 'timeout'),   # straight-line work the progress handler never sees: the worker is killed
      # Giant values.
      ('SELECT zeroblob(3000000000)', 'result too large'),
      ('SELECT length(randomblob(3000000000))', 'result too large'),
      ("SELECT printf('%.*c', 2000000000, 'x')", 'timeout'),  # SQLite loops 2e9 times; killed
      ("SELECT replace(hex(zeroblob(400000)), '0', 'aaaaaaaa')", 'result too large'),
      # Odd text.
      ("SELECT '" + 'a' * 1_000_000 + "'", 'query too long'),
      ('', 'empty query'),
      ('  \n\t ', 'empty query'),
      ('-- only a comment', 'empty query'),
      (b'SELECT \xff\xfe', 'not valid UTF-8'),
      ('SELECT 1\0; DROP TABLE orders', 'NUL'),
      (None, 'must be a string'),
      (12345, 'must be a string'),
      # Reading the schema is allowed: it is in the prompt anyway.
      ('SELECT * FROM sqlite_master', OK),
  ]


def _sha256(path):
  return hashlib.sha256(path.read_bytes()).hexdigest()


def test_adversarial_queries_change_nothing_and_return_in_time(db_path):
  directory = db_path.parent
  before_hash, before_files = _sha256(db_path), sorted(p.name for p in directory.iterdir())
  queries = _adversarial_queries(directory)
  assert len(queries) >= 30
  failures = []
  for query, expected in queries:
    start = time.monotonic()
    result = sql.execute(db_path, query, timeout_s=TIMEOUT_S)
    elapsed = time.monotonic() - start
    label = repr(query)[:90]
    if elapsed > TIMEOUT_S + 0.5:
      failures.append(f'{label}: took {elapsed:.2f} s')
    if expected == OK and not result.ok:
      failures.append(f'{label}: expected rows, got {result.error}')
    if expected != OK and result.ok:
      failures.append(f'{label}: expected an error, got ok with {len(result.rows)} rows')
    if expected not in (OK, ANY_ERROR) and expected not in (result.error or ''):
      failures.append(f'{label}: expected {expected!r} in the error, got {result.error!r}')
  assert not failures, '\n'.join(failures)
  assert _sha256(db_path) == before_hash
  assert sorted(p.name for p in directory.iterdir()) == before_files  # no -journal, -wal, attached or vacuumed file


def test_each_guard_alone_refuses_a_write(db_path):
  denials = []
  conn = sql._connect(str(db_path), time.monotonic() + 5, denials)
  try:
    # The authorizer, with the text checks bypassed.
    with pytest.raises(sqlite3.DatabaseError, match='not authorized'):
      conn.execute("WITH x AS (SELECT 1) INSERT INTO orders (id) SELECT * FROM x")
    assert denials == ['write']
    # Without the authorizer, query_only still refuses; without query_only, mode=ro does.
    conn.set_authorizer(None)
    with pytest.raises(sqlite3.OperationalError, match='readonly'):
      conn.execute('DELETE FROM orders')
    conn.execute('PRAGMA query_only = OFF')
    with pytest.raises(sqlite3.OperationalError, match='readonly'):
      conn.execute('DELETE FROM orders')
  finally:
    conn.close()


def test_select_with_join_and_aggregate(db_path):
  query = """
      SELECT c.city, count(*) AS orders, sum(o.quantity * p.price) AS revenue
      FROM orders o JOIN customers c ON c.id = o.customer_id JOIN products p ON p.id = o.product_id
      WHERE c.city IS NOT NULL GROUP BY c.city ORDER BY revenue DESC"""
  result = sql.execute(db_path, query)
  with sqlite3.connect(db_path) as conn:
    expected = tuple(conn.execute(query).fetchall())
  assert result.ok, result.error
  assert result.columns == ('city', 'orders', 'revenue')
  assert result.rows == expected
  assert {row[0] for row in result.rows} <= set(CITIES)
  assert not result.truncated and result.error is None and result.elapsed_s > 0


def test_nulls_dates_and_blobs_come_back_as_python_values(db_path):
  result = sql.execute(db_path, 'SELECT c.email, c.joined, p.photo FROM customers c, products p '
                       'WHERE c.id = 3 AND p.id = 2')
  assert result.rows == ((None, '2023-04-04', bytes([2, 0, 255])),)
  assert sql.format_result(result) == "email | joined | photo\nNULL | 2023-04-04 | x'0200ff'\n(1 rows)"


def test_row_cap_sets_truncated(db_path):
  result = sql.execute(db_path, 'SELECT id FROM customers ORDER BY id', max_rows=10)
  assert result.ok and result.truncated
  assert result.rows == tuple((i,) for i in range(1, 11))
  exact = sql.execute(db_path, 'SELECT id FROM customers', max_rows=100)
  assert len(exact.rows) == 100 and not exact.truncated


def test_cell_cap_cuts_text_at_a_character_boundary(db_path):
  result = sql.execute(db_path, "SELECT '가나다라마', 'short'", max_cell_bytes=7)  # 3 bytes a character
  assert result.ok and result.truncated
  assert result.rows == (('가나' + sql.TRUNCATION_MARK, 'short'),)
  blob = sql.execute(db_path, 'SELECT zeroblob(100)', max_cell_bytes=10)
  assert blob.rows == ((bytes(10),),) and blob.truncated


def test_total_bytes_cap(db_path):
  result = sql.execute(db_path, 'SELECT name FROM customers', max_total_bytes=100)  # '고객001' is 9 bytes
  assert result.ok and result.truncated
  assert len(result.rows) == 11


def test_missing_database_is_an_error_and_creates_no_file(tmp_path):
  missing = tmp_path / 'nope' / '..' / 'missing.sqlite'
  result = sql.execute(missing, 'SELECT 1')
  assert not result.ok and 'database not found' in result.error
  assert list(tmp_path.iterdir()) == []


def test_odd_path_characters_are_quoted(tmp_path):
  path = tmp_path / 'a b?c#d%e' / 'db.sqlite'
  path.parent.mkdir()
  sqlite3.connect(path).close()
  assert sql.execute(path, 'SELECT 41 + 1').rows == ((42,),)
  assert sorted(p.name for p in path.parent.iterdir()) == ['db.sqlite']


def test_format_result_is_stable():
  result = sql.SqlResult(ok=True, columns=('이름', 'n', 'x'), rows=(('김\n철수', 3, 0.1), (None, -1, 2.0)))
  assert sql.format_result(result) == '이름 | n | x\n김\\n철수 | 3 | 0.1\nNULL | -1 | 2.0\n(2 rows)'
  assert sql.format_result(result) == sql.format_result(result)
  truncated = sql.SqlResult(ok=True, columns=('id',), rows=tuple((i,) for i in range(5)), truncated=True)
  assert sql.format_result(truncated).endswith('\n4\n(5+ rows; truncated)')
  assert sql.format_result(truncated, max_chars=30) == 'id\n0\n1\n2\n(3 of 5+ rows shown)'
  assert sql.format_result(sql.SqlResult(ok=False, error='timeout: x')) == 'ERROR: timeout: x'


def test_format_result_drops_rows_to_fit():
  result = sql.SqlResult(ok=True, columns=('id',), rows=tuple((i,) for i in range(100)))
  assert sql.format_result(result, max_chars=60) == '\n'.join(['id', *map(str, range(15)), '(15 of 100 rows shown)'])
  assert len(sql.format_result(result, max_chars=5)) == 5


def test_schema_lists_create_table_statements(db_path):
  text = sql.schema(db_path)
  assert text.startswith('CREATE TABLE customers (')
  assert text.count('CREATE TABLE') == 3 and 'sqlite_' not in text
  with pytest.raises(ValueError, match='missing.sqlite'):
    sql.schema(db_path.parent / 'missing.sqlite')


def test_bytes_query_and_recovery_after_a_killed_worker(db_path):
  killed = sql.execute(db_path, "SELECT printf('%.*c', 2000000000, 'x')", timeout_s=TIMEOUT_S)
  assert not killed.ok and killed.error.startswith('timeout')
  assert sql.execute(db_path, b'SELECT count(*) FROM orders').rows == ((300,),)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(query=st.one_of(st.text(max_size=80), st.binary(max_size=80),
                                  st.text(alphabet='SELECT *FROM;\'"-/()customers', max_size=60)))
def test_never_raises(db_path, query):
  result = sql.execute(db_path, query, timeout_s=TIMEOUT_S)
  assert isinstance(result, sql.SqlResult)
  assert result.ok or result.error


# ---- Reading leaves the database's directory byte for byte as it was, and returns a normal read's rows. ----

DIGEST = 'SELECT count(*), sum(length(x)), min(substr(x, 1, 8)), max(substr(x, 1, 8)) FROM t'


def _snapshot(directory):
  """Every entry's name, mode, size and content hash: what a read must leave as it was."""
  return {p.name: (p.stat().st_mode, p.stat().st_size, _sha256(p) if p.is_file() else None)
          for p in sorted(directory.iterdir())}


def _frozen_state(kind, tmp_path):
  """A database directory as a writer left it mid-way (its files copied while it ran): the db path."""
  live, frozen = tmp_path / 'live', tmp_path / 'db'
  live.mkdir()
  frozen.mkdir()
  writer = sqlite3.connect(live / 'db.sqlite', isolation_level=None)
  wal = kind.startswith('wal')
  writer.execute(f'PRAGMA journal_mode = {"WAL" if wal else "PERSIST" if kind == "persist_journal" else "DELETE"}')
  writer.execute('PRAGMA wal_autocheckpoint = 0')
  writer.execute('CREATE TABLE t (x TEXT)')
  writer.executemany('INSERT INTO t VALUES (?)', [(f'base{i:04d}' * 20,) for i in range(50)])
  if wal:
    writer.execute('PRAGMA wal_checkpoint(TRUNCATE)')  # the base rows in the file, the -wal empty
  if kind in ('wal_committed', 'wal_committed_shm', 'wal_uncommitted_tail', 'wal_kept_frames', 'wal_readonly_dir'):
    writer.executemany('INSERT INTO t VALUES (?)', [(f'wal{i:04d}' * 20,) for i in range(30)])  # only in the -wal
  if kind == 'wal_kept_frames':
    writer.execute('PRAGMA wal_checkpoint(PASSIVE)')  # in the file too; the -wal keeps its frames
  if kind in ('wal_uncommitted_tail', 'hot_journal', 'empty_db_hot_journal'):
    writer.execute('PRAGMA cache_size = 1')  # a big transaction spills to the -wal, or to the file (journalled)
    writer.execute('BEGIN')
    writer.execute("UPDATE t SET x = 'torn'")
    writer.executemany('INSERT INTO t VALUES (?)', [(f'spill{i:04d}' * 200,) for i in range(200)])
  for source in live.iterdir():
    if not source.name.endswith('-shm') or kind in ('wal_committed_shm', 'wal_checkpointed_shm'):
      (frozen / source.name).write_bytes(source.read_bytes())
  if kind == 'stale_empty_wal':
    (frozen / 'db.sqlite-wal').write_bytes(b'')
  if kind == 'empty_db_hot_journal':
    (frozen / 'db.sqlite').write_bytes(b'')
  writer.close()
  if kind == 'wal_readonly_dir':
    frozen.chmod(0o555)
  return frozen / 'db.sqlite'


def _normal_read(db_path, query, tmp_path):
  """The rows a plain read-write sqlite3 open returns, on a copy of the directory (it may write there)."""
  scratch = tmp_path / 'normal'
  scratch.mkdir()
  for source in db_path.parent.iterdir():
    (scratch / source.name).write_bytes(source.read_bytes())
  conn = sqlite3.connect(scratch / db_path.name)
  try:
    return tuple(conn.execute(query).fetchall())
  finally:
    conn.close()


@pytest.mark.parametrize('kind, files, rows', [
    # WAL, committed rows only in the -wal (a writer that never checkpointed), -shm absent or present:
    # immutable=1 would miss them, mode=ro would create or write the -shm.
    ('wal_committed', ['db.sqlite', 'db.sqlite-wal'], (80, 12200, 'base0000', 'wal0029w')),
    ('wal_committed_shm', ['db.sqlite', 'db.sqlite-shm', 'db.sqlite-wal'], (80, 12200, 'base0000', 'wal0029w')),
    ('wal_readonly_dir', ['db.sqlite', 'db.sqlite-wal'], (80, 12200, 'base0000', 'wal0029w')),
    # ... and behind them uncommitted frames of a transaction that spilled: a normal read ignores them.
    ('wal_uncommitted_tail', ['db.sqlite', 'db.sqlite-wal'], (80, 12200, 'base0000', 'wal0029w')),
    # Checkpointed: the -wal still holds the frames, or was truncated to 0 bytes beside a live -shm.
    ('wal_kept_frames', ['db.sqlite', 'db.sqlite-wal'], (80, 12200, 'base0000', 'wal0029w')),
    ('wal_checkpointed_shm', ['db.sqlite', 'db.sqlite-shm', 'db.sqlite-wal'], (50, 8000, 'base0000', 'base0049')),
    # Rollback journal: a hot one from a transaction that wrote into the file (a normal read rolls it back;
    # mode=ro refuses, immutable=1 reads torn pages), a zeroed PERSIST one, a 0-byte -wal left beside it.
    ('hot_journal', ['db.sqlite', 'db.sqlite-journal'], (50, 8000, 'base0000', 'base0049')),
    ('persist_journal', ['db.sqlite', 'db.sqlite-journal'], (50, 8000, 'base0000', 'base0049')),
    ('stale_empty_wal', ['db.sqlite', 'db.sqlite-wal'], (50, 8000, 'base0000', 'base0049')),
])
def test_reads_change_no_byte_beside_the_database_and_see_what_a_normal_read_sees(kind, files, rows, tmp_path):
  db_path = _frozen_state(kind, tmp_path)
  try:
    before = _snapshot(db_path.parent)
    assert sorted(before) == files
    result = sql.execute(db_path, DIGEST)
    assert _snapshot(db_path.parent) == before
    assert sql.execute(db_path, 'SELECT x FROM t; ;; -- twice, and a failing one:').ok
    assert 'no such table' in sql.execute(db_path, 'SELECT * FROM missing').error
    assert _snapshot(db_path.parent) == before
  finally:
    db_path.parent.chmod(0o755)
  assert result.ok, result.error
  assert result.rows == (rows,) == _normal_read(db_path, DIGEST, tmp_path)
  assert all(not any(pathlib.Path(w.scratch).iterdir()) for w in sql._idle_workers)  # the copies are gone


def test_an_empty_file_is_an_empty_database_whatever_lies_beside_it(tmp_path):
  db_path = _frozen_state('empty_db_hot_journal', tmp_path)
  before = _snapshot(db_path.parent)
  assert sorted(before) == ['db.sqlite', 'db.sqlite-journal']
  result = sql.execute(db_path, 'SELECT count(*) FROM sqlite_master')
  assert result.rows == ((0,),) == _normal_read(db_path, 'SELECT count(*) FROM sqlite_master', tmp_path)
  assert _snapshot(db_path.parent) == before  # a normal open would have deleted the journal


def test_a_copy_too_large_for_the_worker_is_refused_with_what_to_do(tmp_path, monkeypatch):
  db_path = _frozen_state('wal_committed', tmp_path)
  monkeypatch.setattr(sql, 'WORKER_FILE_BYTES', 1000)  # _open runs here, in this process
  scratch = tmp_path / 'scratch'
  with pytest.raises(OSError, match='private copy with its -wal.*wal_checkpoint'):
    sql._open(str(db_path), str(scratch), time.monotonic() + 5, [])
  assert not scratch.exists()


@pytest.mark.parametrize('make, error', [
    (lambda d: d, 'database is not a file'),
    (lambda d: os.mkfifo(d / 'fifo.sqlite') or d / 'fifo.sqlite', 'database is not a file'),  # would block open()
    (lambda d: (d / 'notes.sqlite').write_text('hello, not a database') and d / 'notes.sqlite', 'not a SQLite'),
    (lambda d: (d / 'short.sqlite').write_bytes(b'SQLite') and d / 'short.sqlite', 'not a SQLite'),
    (lambda d: d / 'missing' / 'db.sqlite', 'database not found'),
    (lambda d: 'bad\0path', 'bad database path'),
    (lambda d: None, 'bad database path'),
])
def test_bad_database_paths_are_clear_errors_and_change_nothing(tmp_path, make, error):
  path = make(tmp_path)
  before = _snapshot(tmp_path)
  result = sql.execute(path, 'SELECT 1')
  assert not result.ok and error in result.error, result.error
  assert _snapshot(tmp_path) == before


# ---- Text the model controls is an error result to it; arguments the caller controls are a ValueError. ----


class _Text(str):
  pass


@pytest.mark.parametrize('query, expected', [
    ('SELECT 1;;', ((1,),)),
    ('SELECT 1; ;', ((1,),)),
    ('SELECT 1 ;\n;\n-- done\n', ((1,),)),
    ('SELECT 1 /* a */ ; /* b */ ; -- c', ((1,),)),
    ("SELECT ';;' ;;", ((';;',),)),
    ('SELECT 1 -- a trailing comment, no semicolon', ((1,),)),
    (_Text('SELECT 1'), ((1,),)),                 # a str subclass (marshal refuses those)
    (bytearray(b'SELECT 1;;'), ((1,),)),
    (memoryview(b'SELECT 1'), ((1,),)),
    ('SELECT 1;; SELECT 2', 'multiple statements'),
    (';SELECT 1', 'multiple statements'),
    (';;', 'empty query'),
    ('SELECT 1; DROP TABLE orders;;', 'multiple statements'),
    ('SELECT \ud800', 'lone surrogate U+D800'),
    ("SELECT '\udfff' AS x", 'lone surrogate U+DFFF'),
    ('SELECT 1 -- \ud83d in a comment', 'lone surrogate'),
    ('SELECT "\udc80"', 'lone surrogate'),
    (b"SELECT '\xed\xa0\x80'", 'not valid UTF-8'),  # a surrogate encoded as UTF-8 bytes
    ("SELECT '\0'", 'NUL'),
    (['SELECT 1'], 'must be a string'),
    (3.5, 'must be a string'),
])
def test_query_text_edge_cases(db_path, query, expected):
  result = sql.execute(db_path, query, timeout_s=TIMEOUT_S)
  if isinstance(expected, tuple):
    assert result.ok and result.rows == expected, result.error
  else:
    assert not result.ok and expected in result.error, result.error
    assert 'internal error' not in result.error


@pytest.mark.parametrize('arguments', [
    dict(timeout_s=float('nan')), dict(timeout_s=float('inf')), dict(timeout_s=-float('inf')),
    dict(timeout_s=-1), dict(timeout_s=0), dict(timeout_s=0.0), dict(timeout_s='2'), dict(timeout_s=None),
    dict(timeout_s=True), dict(max_rows=0), dict(max_rows=-1), dict(max_rows=1.5), dict(max_rows=float('nan')),
    dict(max_rows='10'), dict(max_rows=None), dict(max_rows=True), dict(max_cell_bytes=0),
    dict(max_total_bytes=-5),
])
def test_bad_caller_arguments_raise_value_error_naming_them(db_path, arguments):
  (name, _), = arguments.items()
  with pytest.raises(ValueError, match=name):
    sql.execute(db_path, 'SELECT 1', **arguments)


def test_unusual_but_valid_caller_arguments(db_path):
  assert sql.execute(db_path, 'SELECT 1', timeout_s=1e12).rows == ((1,),)  # poll waits in slices
  assert sql.execute(db_path, 'SELECT 1', timeout_s=fractions.Fraction(1, 2), max_rows=numpy.int64(5)).ok
