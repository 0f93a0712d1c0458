"""NL2SQL verifier: a predicted query is correct when it returns the gold query's result.

Both queries run through the sandbox (`luckystar.tools.sql.execute`). The
decisions, in one place:

  * rows are a multiset (order ignored, duplicates counted) unless the gold
    query has a top-level ORDER BY; then order matters too. Ties in the gold's
    sort key are compared in the gold's order (the usual execution-match rule).
    A multiset matches when the rows pair one-to-one into equal rows; since
    the float tolerance is not transitive, that pairing is a true bipartite
    matching, not a greedy or sorted one;
  * column names are ignored, column count and column order matter:
    `SELECT b, a` does not match `SELECT a, b` (the question asked for columns
    in an order, and permuting columns would make almost any pair match);
  * cells: None only equals None, strings, blobs and two integers compare
    exactly (1000001 != 1000002), a number never equals a string ('3' != 3).
    A float and a number compare by value (3 == 3.0) within a slack for
    rounding only (`_numbers_equal`): 0.1 + 0.2 matches 0.3 and AVG matches
    SUM / COUNT, but two numbers a whole unit or more apart never match
    (12345670.0 != 12345678.0, 1000000 != 1000001.0), nor does AVG(x) 1000000.5
    match the integer division SUM(x) / COUNT(x) 1000000. An infinity equals
    only itself, NaN only NaN (SQLite returns NULL for NaN);
  * a truncated result never matches, whatever the other side: a prefix proves
    nothing about the rest. A truncated *gold* is unscorable (None), like a
    failing gold, so the caller counts it instead of rewarding 0.

Gold results are cached per (resolved db path, mtime, size, gold SQL) in a
bounded LRU; timeouts are not cached, so a slow moment does not make a gold
unscorable for the rest of the run.
"""

import collections
import fractions
import itertools
import math
import os
import pathlib
import threading
from typing import Any

import sqlglot
from sqlglot import exp

from luckystar.rewards.function_call import has_perfect_matching
from luckystar.tools import sql as sql_tool

REL_TOL = 1e-9      # rounding from summation order stays below ~n·2e-16 relative; this leaves a wide margin
ABS_TOL = 1e-9      # for results that cancel to ~0 (0.1 + 0.2 - 0.3)
MAX_TOL = 0.5       # the slack never reaches a unit, so no integer digit can differ; above 5e8 it binds
GOLD_CACHE_SIZE = 4096   # curated golds render to ≤ 500 tokens, so entries are small

_gold_cache: collections.OrderedDict = collections.OrderedDict()  # key → (SqlResult, ordered) | None
_gold_cache_lock = threading.Lock()


def is_correct(db_path: str | os.PathLike, predicted_sql: Any, gold_sql: str, *,
               timeout_s: float = 2.0) -> bool | None:
  """True/False for the prediction; None when the gold fails or is truncated (unscorable: count it)."""
  gold = _gold(db_path, gold_sql, timeout_s)
  if gold is None:
    return None
  gold_result, ordered = gold
  predicted = sql_tool.execute(db_path, predicted_sql, timeout_s=timeout_s)
  return results_match(predicted, gold_result, ordered=ordered)


def results_match(predicted: sql_tool.SqlResult, gold: sql_tool.SqlResult, *, ordered: bool) -> bool:
  """Execution match under the rules of the module docstring."""
  if not (predicted.ok and gold.ok) or predicted.truncated or gold.truncated:
    return False
  if len(predicted.columns) != len(gold.columns) or len(predicted.rows) != len(gold.rows):
    return False
  if ordered:
    return all(_rows_equal(p, g) for p, g in zip(predicted.rows, gold.rows))
  return _same_multiset(predicted.rows, gold.rows)


def has_order_by(sql: str) -> bool:
  """Whether the query's outermost SELECT (or compound) has ORDER BY; ones in subqueries, CTEs or OVER() don't count."""
  try:
    statements = [s for s in sqlglot.parse(sql, read='sqlite') if s is not None and not isinstance(s, exp.Semicolon)]
  except sqlglot.errors.SqlglotError:
    statements = []
  if len(statements) != 1:
    return _has_top_level_order_by_token(sql)
  tree = statements[0]
  while tree is not None:
    if tree.args.get('order'):
      return True
    tree = tree.this if isinstance(tree, (exp.Subquery, exp.Paren)) else None
  return False


def clear_gold_cache():
  with _gold_cache_lock:
    _gold_cache.clear()


def _gold(db_path, gold_sql, timeout_s):
  """(gold result, ordered), or None when the gold is unscorable; cached."""
  try:
    path = pathlib.Path(os.fsdecode(db_path)).resolve()
    stat = path.stat()
  except (OSError, TypeError, ValueError):
    return None
  key = (str(path), stat.st_mtime_ns, stat.st_size, gold_sql)
  with _gold_cache_lock:
    if key in _gold_cache:
      _gold_cache.move_to_end(key)
      return _gold_cache[key]
  result = sql_tool.execute(path, gold_sql, timeout_s=timeout_s)
  gold = (result, has_order_by(gold_sql)) if result.ok and not result.truncated else None
  if not (result.error or '').startswith('timeout'):
    with _gold_cache_lock:
      _gold_cache[key] = gold
      while len(_gold_cache) > GOLD_CACHE_SIZE:
        _gold_cache.popitem(last=False)
  return gold


def _has_top_level_order_by_token(sql: str) -> bool:
  """Fallback for SQL sqlglot cannot parse: an ORDER BY token outside every parenthesis."""
  try:
    tokens = sqlglot.tokenize(sql, read='sqlite')
  except sqlglot.errors.SqlglotError:
    return False
  depth = 0
  for token in tokens:
    depth += {sqlglot.TokenType.L_PAREN: 1, sqlglot.TokenType.R_PAREN: -1}.get(token.token_type, 0)
    if depth == 0 and token.token_type == sqlglot.TokenType.ORDER_BY:
      return True
  return False


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cells_equal(a, b) -> bool:
  if a is None or b is None:
    return a is None and b is None
  if _is_number(a) and _is_number(b):
    return _numbers_equal(a, b)
  return type(a) is type(b) and a == b


def _numbers_equal(a, b) -> bool:
  """Equal by value (int == float is exact in Python), else within min(max(ABS_TOL, REL_TOL·|larger|), MAX_TOL).

  The slack is for rounding in float arithmetic, which is relative; capping it below one unit keeps
  a relative slack from bridging integer digits at large magnitudes (where it would let AVG match integer
  division). Beyond 2**53 floats are spaced ≥ 2 apart, so there only exact equality matches.
  """
  if a == b:
    return True
  if isinstance(a, int) and isinstance(b, int):
    return False
  if any(isinstance(x, float) and not math.isfinite(x) for x in (a, b)):
    return a != a and b != b  # NaN matches NaN; an infinity matched only itself above
  if any(isinstance(x, int) and abs(x) > 2**53 for x in (a, b)):
    difference = abs(fractions.Fraction(a) - fractions.Fraction(b))  # a - b would round the int to a float first
  else:
    difference = abs(a - b)
  scale = max(abs(a), abs(b))
  return difference <= (MAX_TOL if scale >= MAX_TOL / REL_TOL else max(ABS_TOL, REL_TOL * scale))


def _rows_equal(a: tuple, b: tuple) -> bool:
  return len(a) == len(b) and all(_cells_equal(x, y) for x, y in zip(a, b))


def _cell_key(value) -> tuple:
  """Orders cells of mixed types: None, numbers by exact value (NaN last), strings, blobs, anything else.

  Two cells that involve no float have equal keys iff `_cells_equal`; equal numbers have equal keys when they
  are equal by value (3 and 3.0), while ones equal only within the slack may not, which `_same_multiset` handles.
  """
  if value is None:
    return (0,)
  if _is_number(value):
    return (1, 1) if value != value else (1, 0, value)
  if isinstance(value, str):
    return (2, value)
  if isinstance(value, bytes):
    return (3, value)
  return (4, type(value).__qualname__, repr(value))  # not from SQLite (bool, ...): compared by type and value


def _row_key(row: tuple) -> tuple:
  return tuple(_cell_key(value) for value in row)


def _same_multiset(predicted_rows: tuple, gold_rows: tuple) -> bool:
  """Whether the rows pair one-to-one into equal rows (`_rows_equal`), in any order; the row counts are equal.

  Without floats every cell compares exactly, an equivalence, so rows sorted by exact value pair up position by
  position or not at all. Floats within tolerance can sort apart (-4e-10 vs 4e-10) or chain (1 + 8e-10 fits 1
  and 1 + 1.5e-9, which do not fit each other), so with a float present a failed sorted pairing is rechecked
  exactly: rows are grouped by their cells in float-free columns (exact there) and by which cells of the other
  columns are numbers; each group needs as many predicted as gold rows and a perfect bipartite matching. Work
  is quadratic in a group's rows plus the matching's augmenting paths; `is_correct` results hold ≤ 200 rows.
  """
  if all(_rows_equal(p, g) for p, g in zip(sorted(predicted_rows, key=_row_key), sorted(gold_rows, key=_row_key))):
    return True
  tolerant_columns = {column for row in itertools.chain(predicted_rows, gold_rows)
                      for column, value in enumerate(row) if isinstance(value, float)}
  if not tolerant_columns:
    return False
  groups = collections.defaultdict(lambda: ([], []))  # exact part of a row → (predicted rows, gold rows)
  for side, rows in enumerate((predicted_rows, gold_rows)):
    for row in rows:
      exact_part = tuple((1,) if column in tolerant_columns and _is_number(value) else _cell_key(value)
                         for column, value in enumerate(row))
      groups[exact_part][side].append(row)
  if any(len(predicted) != len(gold) for predicted, gold in groups.values()):
    return False
  return all(has_perfect_matching([[_rows_equal(p, g) for g in gold] for p in predicted])
             for predicted, gold in groups.values())
