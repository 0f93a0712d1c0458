"""Execution-match reward: multiset vs ordered rows, numeric tolerance, unscorable golds, the gold cache."""

import itertools
import math
import os
import sqlite3

import hypothesis
from hypothesis import strategies as st
import pytest

from luckystar.rewards import sql as reward
from luckystar.tools import sql as sql_tool

pytestmark = pytest.mark.fast

# Near 1.0, within REL_TOL = 1e-9: MID fits ONE and HIGH, which do not fit each other; LOW fits ONE only,
# BELOW fits LOW only.
ONE, MID, HIGH, LOW, BELOW = 1.0, 1 + 8e-10, 1 + 1.5e-9, 1 - 8e-10, 1 - 1.5e-9


@pytest.fixture(scope='module')
def db_path(tmp_path_factory):
  path = tmp_path_factory.mktemp('db') / 'sales.sqlite'
  conn = sqlite3.connect(path)
  conn.execute('CREATE TABLE sales (id INTEGER PRIMARY KEY, region TEXT, amount REAL, units INTEGER)')
  rows = [(1, '서울', 0.1, 3), (2, '부산', 0.2, 3), (3, '서울', 0.3, 5), (4, '대구', None, 1), (5, '부산', 2.5, 3)]
  conn.executemany('INSERT INTO sales VALUES (?, ?, ?, ?)', rows)
  conn.commit()
  conn.close()
  return path


@pytest.fixture(autouse=True)
def fresh_gold_cache():
  reward.clear_gold_cache()
  yield
  reward.clear_gold_cache()


def _result(*rows, columns=None, truncated=False):
  columns = columns or tuple(f'c{i}' for i in range(len(rows[0]) if rows else 1))
  return sql_tool.SqlResult(ok=True, columns=columns, rows=tuple(rows), truncated=truncated)


def test_multiset_ignores_order_but_counts_duplicates():
  gold = _result((1, 'a'), (1, 'a'), (2, 'b'))
  assert reward.results_match(_result((2, 'b'), (1, 'a'), (1, 'a')), gold, ordered=False)
  assert not reward.results_match(_result((2, 'b'), (2, 'b'), (1, 'a')), gold, ordered=False)
  assert not reward.results_match(_result((1, 'a'), (2, 'b')), gold, ordered=False)  # a set would match


def test_ordered_comparison_needs_the_same_order():
  gold = _result((1,), (2,), (3,))
  assert reward.results_match(_result((1,), (2,), (3,)), gold, ordered=True)
  assert not reward.results_match(_result((3,), (2,), (1,)), gold, ordered=True)
  assert reward.results_match(_result((3,), (2,), (1,)), gold, ordered=False)


@pytest.mark.parametrize('predicted, gold, match', [
    (0.1 + 0.2, 0.3, True),
    (3, 3.0, True),
    (1e-12, 0.0, True),            # abs tolerance
    (1_000_000.0, 1_000_000.0001, True),  # rel tolerance 1e-9
    (1_000_000.0, 1_000_000.5, False),  # AVG(x) vs the integer division SUM(x) / COUNT(x)
    (1.0, 1.001, False),
    (3, 4, False),
    ('3', 3, False),
    (None, 0, False),
    (None, '', False),
    (None, None, True),
    ('서울', '서울', True),
    ('서울 ', '서울', False),
    (b'\x00', '00', False),
])
def test_cell_comparison(predicted, gold, match):
  assert reward.results_match(_result((predicted,)), _result((gold,)), ordered=False) is match


# Numbers that differ in a significant integer digit, or are otherwise more than rounding apart: never equal.
DIFFERENT_NUMBERS = [
    (12345670.0, 12345678.0),          # a relative slack of 1e-6 would call them equal
    (1_000_000, 1_000_001.0),          # an integer and a float one apart at a million
    (1_000_000, 1_000_000.5),          # SUM(x) / COUNT(x) (integer division) vs AVG(x)
    (1_234_567_890.0, 1_234_567_891.0),  # where a relative slack of 1e-9 would reach a unit
    (999_999_999_999.0, 1_000_000_000_000.0),
    (1e15, 1e15 + 1),
    (2**53 + 1, float(2**53)),         # an exact integer vs the nearest float, which lost its last digit
    (2**63 - 1, 9.223372036854776e18),
    (2.0**60, 2.0**60 + 256),          # adjacent floats far above 2**53
    (5e8, 5e8 + 0.6),                  # past the cap of the slack (0.5)
    (0.1, 0.1 + 1e-8),
    (-3.0, 3),
    (math.inf, 1.7976931348623157e308),
    (math.inf, -math.inf),
    (math.nan, 0.0),
    (math.nan, math.inf),
]
# Numbers equal by value, or apart only by float rounding: always equal.
EQUAL_NUMBERS = [
    (3, 3.0),
    (0.1 + 0.2, 0.3),
    (sum([0.1] * 10), 1.0),            # 0.9999999999999999
    (2.9999999999999996, 3),           # rounding across an integer boundary
    (1e-12, 0.0),                      # cancelled to ~0 (abs tolerance)
    (123456789.12345678, 123456789.12345679),
    (1e15 + 0.125, 1e15),              # one float step at 1e15
    (2**53, float(2**53)),
    (10**20, 1e20),                    # exactly equal: 1e20 is an integer in binary
    (-0.0, 0.0),
    (math.inf, math.inf),
    (math.nan, math.nan),              # only in hand-built results: SQLite returns NULL for NaN
]


@pytest.mark.parametrize('first, second', DIFFERENT_NUMBERS)
def test_numbers_a_digit_apart_never_match(first, second):
  for a, b in ((first, second), (second, first)):
    assert not reward._cells_equal(a, b)
    assert not reward.results_match(_result((a,)), _result((b,)), ordered=True)
    # Unordered, through the sorted pairing and the matching: each pairing leaves one mismatch.
    assert not reward.results_match(_result((a, 'x'), (1.5, 'y')), _result((1.5, 'y'), (b, 'x')), ordered=False)
    assert not reward.results_match(_result((a,), (b,)), _result((b,), (b,)), ordered=False)


@pytest.mark.parametrize('first, second', EQUAL_NUMBERS)
def test_numbers_apart_only_by_rounding_match(first, second):
  for a, b in ((first, second), (second, first)):
    assert reward._cells_equal(a, b)
    assert reward.results_match(_result((a, 'x'), (7, 'y')), _result((7, 'y'), (b, 'x')), ordered=False)
    assert reward.results_match(_result((a, 'x'), (7, 'y')), _result((b, 'x'), (7, 'y')), ordered=True)


def test_cell_keys_never_split_equal_values_or_merge_unequal_exact_ones():
  values = [None, 0, 1, -1, 3, 3.0, 2**53, 2**53 + 1, float(2**53), 2**63 - 1, 1_000_000, 1_000_001.0,
            0.1 + 0.2, 0.3, math.inf, -math.inf, math.nan, '3', '', '서울', b'3', b'', True, False]
  keys = sorted(reward._cell_key(v) for v in values)  # a total order over every type
  assert len(keys) == len(values)
  for a, b in itertools.product(values, repeat=2):
    same_key = reward._cell_key(a) == reward._cell_key(b)
    if reward._cells_equal(a, b) and (not isinstance(a, float) or a == b or a != a):
      assert same_key, (a, b)   # equal by value (3 and 3.0, NaN and NaN): one key
    if not (isinstance(a, float) or isinstance(b, float)):
      assert same_key == reward._cells_equal(a, b), (a, b)


def _reference_multiset_match(predicted, gold):
  """Brute force: some order of the predicted rows equals the gold rows cell by cell."""
  return any(all(reward._rows_equal(p, g) for p, g in zip(order, gold))
             for order in itertools.permutations(predicted))


# Values near each other, so that swapping a cell within its family often still matches and often does not.
_FAMILIES = [(3, 3.0, 4), (ONE, MID, HIGH, LOW, BELOW), (1_000_000, 1_000_000.5, 1_000_001.0),
             (12345670.0, 12345678.0), (2**53, 2**53 + 1, float(2**53)), (0.0, -0.0, 1e-12, 4e-10, -4e-10),
             (math.nan, math.inf, -math.inf), (None, '3', b'3')]
# A result's column draws from one family (the tolerant ones more often: chains and values that sort apart).
_GOLD_ROWS = st.lists(st.sampled_from(_FAMILIES + [_FAMILIES[1], _FAMILIES[5]] * 3), min_size=1, max_size=3).flatmap(
    lambda families: st.lists(st.tuples(*map(st.sampled_from, families)), min_size=1, max_size=5))


def _family(cell):
  return next(f for f in _FAMILIES if any(x is cell or (type(x) is type(cell) and x == cell) for x in f))


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(gold=_GOLD_ROWS, data=st.data())
def test_multiset_match_agrees_with_brute_force(gold, data):
  # Predicted: the gold rows shuffled, some cells swapped within their family; the multiset comparison must
  # say exactly what trying every row order says.
  predicted = [tuple(data.draw(st.sampled_from(_family(cell)) | st.just(cell)) for cell in row)
               for row in data.draw(st.permutations(gold))]
  expected = _reference_multiset_match(predicted, gold)
  assert reward.results_match(_result(*predicted), _result(*gold), ordered=False) is expected


def test_near_equal_floats_that_sort_apart_still_pair_up():
  # -4e-10 ≈ 4e-10 within abs 1e-9, but they sort apart, so sorted pairing alone would fail.
  gold = _result((4e-10, 'a'), (-4e-10, 'b'))
  assert reward.results_match(_result((-4e-10, 'a'), (4e-10, 'b')), gold, ordered=False)
  assert not reward.results_match(_result((-4e-10, 'a'), (4e-10, 'c')), gold, ordered=False)


@pytest.mark.parametrize('first, second', [
    (1000002, 1000003),          # ids sharing their leading digits
    (1700000000, 1700000050),    # unix timestamps
    (2**62, 2**62 + 1),          # beyond float precision
])
def test_distinct_integers_in_another_order_match_and_never_within_tolerance(first, second):
  gold = _result((first,), (second,))
  assert reward.results_match(_result((second,), (first,)), gold, ordered=False)
  assert reward.results_match(_result((second, 'x'), (first, 'x')), _result((first, 'x'), (second, 'x')),
                              ordered=False)
  assert not reward.results_match(_result((first,), (first,)), gold, ordered=False)
  assert not reward.results_match(_result((second,), (second + 1,)), gold, ordered=False)


def test_integers_beside_float_columns_pair_by_exact_value():
  gold = _result((1000001, 0.5, 0.5), (1000002, MID, MID), (1000002, MID, ONE))
  assert reward.results_match(_result((1000002, MID, MID), (1000001, 0.5 + 1e-12, 0.5),
                                      (1000002, ONE, HIGH)), gold, ordered=False)
  assert not reward.results_match(_result((1000002, MID, MID), (1000002, 0.5, 0.5),
                                          (1000001, ONE, HIGH)), gold, ordered=False)


def test_tolerance_chains_need_a_real_matching_not_a_greedy_or_sorted_pairing():
  # Each row fits its partner within tolerance, but tolerance is not transitive: MID fits both ONE and
  # HIGH, which do not fit each other. Pairing the identical rows first, or by sorted order, strands a row.
  assert reward._cells_equal(MID, ONE) and reward._cells_equal(MID, HIGH) and not reward._cells_equal(ONE, HIGH)
  gold = _result((MID, MID), (MID, ONE))
  predicted = _result((MID, MID), (ONE, HIGH))
  assert reward.results_match(predicted, gold, ordered=False)
  assert not reward.results_match(_result((MID, MID), (LOW, HIGH)), gold, ordered=False)
  assert reward.results_match(_result((MID,), (ONE,)), _result((ONE,), (HIGH,)), ordered=False)
  assert not reward.results_match(_result((MID,), (BELOW,)), _result((ONE,), (HIGH,)), ordered=False)


def test_matching_at_the_row_cap():
  gold = _result(*[(MID, MID), (MID, ONE)] * 100)
  predicted = [(MID, MID), (ONE, HIGH)] * 100
  assert reward.results_match(_result(*predicted), gold, ordered=False)
  predicted[-1] = (LOW, HIGH)
  assert not reward.results_match(_result(*predicted), gold, ordered=False)


def test_columns_count_and_order_matter_but_names_do_not():
  gold = _result((1, 'a'), columns=('id', 'name'))
  assert reward.results_match(_result((1, 'a'), columns=('x', 'y')), gold, ordered=False)
  assert not reward.results_match(_result(('a', 1)), gold, ordered=False)
  assert not reward.results_match(_result((1,)), gold, ordered=False)
  assert not reward.results_match(_result((1, 'a', None)), gold, ordered=False)


def test_truncated_or_failed_results_never_match():
  gold = _result((1,), (2,))
  assert not reward.results_match(_result((1,), (2,), truncated=True), gold, ordered=False)
  assert not reward.results_match(gold, _result((1,), (2,), truncated=True), ordered=False)
  failed = sql_tool.SqlResult(ok=False, error='sql error: x')
  assert not reward.results_match(failed, gold, ordered=False)
  assert not reward.results_match(failed, failed, ordered=False)


@pytest.mark.parametrize('query, ordered', [
    ('SELECT a FROM t ORDER BY a', True),
    ('SELECT a FROM t ORDER BY a DESC LIMIT 3', True),
    ('SELECT a FROM t UNION SELECT b FROM u ORDER BY 1', True),
    ('WITH c AS (SELECT a FROM t) SELECT a FROM c ORDER BY a', True),
    ('(SELECT a FROM t ORDER BY a)', True),
    ('SELECT a FROM (SELECT a FROM t ORDER BY a)', False),
    ('WITH c AS (SELECT a FROM t ORDER BY a) SELECT a FROM c', False),
    ('SELECT a FROM t WHERE a IN (SELECT b FROM u ORDER BY b LIMIT 1)', False),
    ('SELECT a, row_number() OVER (ORDER BY a) FROM t', False),
    ("SELECT 'ORDER BY a' FROM t -- ORDER BY a", False),
    ('SELECT a FROM t LIMIT 3', False),
    ('SELECT a FROM t ORDER BY a; -- a trailing comment', True),
    ('SELECT a FROM t ORDER BY a COLLATE NOCASE;', True),
])
def test_has_order_by(query, ordered):
  assert reward.has_order_by(query) is ordered


def test_order_by_token_fallback_for_sql_sqlglot_cannot_parse():
  assert reward._has_top_level_order_by_token('SELECT a FROM (SELECT a FROM t ORDER BY a) ORDER BY a')
  assert not reward._has_top_level_order_by_token('SELECT a, row_number() OVER (ORDER BY a) FROM t')
  assert not reward._has_top_level_order_by_token("SELECT 'ORDER BY' -- ORDER BY")


def test_is_correct_end_to_end(db_path):
  gold = 'SELECT region, SUM(amount) FROM sales GROUP BY region'
  assert reward.is_correct(db_path, 'SELECT region, SUM(amount) FROM sales GROUP BY region ORDER BY 2', gold)
  assert reward.is_correct(db_path, 'SELECT region, TOTAL(amount) FROM sales WHERE amount IS NOT NULL '
                           "GROUP BY region UNION ALL SELECT '대구', NULL", gold)
  assert reward.is_correct(db_path, 'SELECT region, SUM(units) FROM sales GROUP BY region', gold) is False
  assert reward.is_correct(db_path, 'SELECT SUM(amount), region FROM sales GROUP BY region', gold) is False
  # AVG vs a float computed another way: equal within tolerance, not bit for bit.
  assert reward.is_correct(db_path, 'SELECT SUM(amount) * 1.0 / COUNT(amount) FROM sales',
                           'SELECT AVG(amount) FROM sales')


def test_unordered_gold_of_large_integers_matches_them_in_any_order(db_path):
  gold = 'SELECT 1700000000 UNION ALL SELECT 1700000050 UNION ALL SELECT 1000002'
  assert reward.is_correct(db_path, 'SELECT 1000002 UNION ALL SELECT 1700000050 UNION ALL SELECT 1700000000', gold)
  assert reward.is_correct(db_path, 'SELECT 1000002 UNION ALL SELECT 1700000050 UNION ALL SELECT 1700000001',
                           gold) is False


@pytest.mark.parametrize('predicted, gold, match', [
    ('SELECT SUM(x) / COUNT(x) FROM (SELECT 1000000 AS x UNION ALL SELECT 1000001)',   # integer division
     'SELECT AVG(x) FROM (SELECT 1000000 AS x UNION ALL SELECT 1000001)', False),
    ('SELECT SUM(x) * 1.0 / COUNT(x) FROM (SELECT 1000000 AS x UNION ALL SELECT 1000001)',
     'SELECT AVG(x) FROM (SELECT 1000000 AS x UNION ALL SELECT 1000001)', True),
    ('SELECT 12345670.0', 'SELECT 12345678.0', False),
    ('SELECT 1000000', 'SELECT 1000001.0', False),
    ('SELECT CAST(9007199254740993 AS REAL)', 'SELECT 9007199254740993', False),
    ('SELECT 1e999', 'SELECT 1e999', True),            # SQLite's infinity
    ('SELECT 0.0 / 0', 'SELECT NULL', True),           # SQLite has no NaN: it returns NULL
    ('SELECT 3.0', 'SELECT 3', True),
    ('SELECT TRUE', 'SELECT 1', True),                 # SQLite's booleans are integers
    ("SELECT '3'", 'SELECT 3', False),
    ('SELECT 0.1 + 0.2 UNION ALL SELECT 7', 'SELECT 7 UNION ALL SELECT 0.3', True),
    ('SELECT 1000000 UNION ALL SELECT 7', 'SELECT 7 UNION ALL SELECT 1000000.5', False),
])
def test_numbers_end_to_end(db_path, predicted, gold, match):
  assert reward.is_correct(db_path, predicted, gold) is match


def test_order_by_in_gold_makes_order_count(db_path):
  gold = 'SELECT id FROM sales ORDER BY id DESC'
  assert reward.is_correct(db_path, 'SELECT id FROM sales ORDER BY -id', gold)
  assert reward.is_correct(db_path, 'SELECT id FROM sales ORDER BY id', gold) is False


def test_order_by_inside_a_subquery_does_not_make_order_count(db_path):
  gold = 'SELECT id FROM (SELECT id FROM sales ORDER BY id DESC LIMIT 3)'
  assert reward.is_correct(db_path, 'SELECT id FROM sales WHERE id >= 3 ORDER BY id', gold)


def test_failing_or_truncated_gold_is_unscorable(db_path, monkeypatch):
  assert reward.is_correct(db_path, 'SELECT 1', 'SELEC 1') is None
  assert reward.is_correct(db_path, 'SELECT 1', 'SELECT * FROM no_such_table') is None
  assert reward.is_correct(db_path, 'SELECT 1', 'DELETE FROM sales') is None
  assert reward.is_correct(db_path.parent / 'missing.sqlite', 'SELECT 1', 'SELECT 1') is None
  monkeypatch.setattr(sql_tool, 'execute', _with_max_rows(sql_tool.execute, 2))
  assert reward.is_correct(db_path, 'SELECT id FROM sales', 'SELECT id FROM sales') is None


def test_bad_predictions_score_false(db_path):
  gold = 'SELECT COUNT(*) FROM sales'
  for predicted in ['DELETE FROM sales', 'SELECT COUNT(*) FROM sales; DROP TABLE sales', 'SELEC 1', '', None,
                    b'\xff', 'WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r']:
    assert reward.is_correct(db_path, predicted, gold, timeout_s=0.3) is False, predicted
  assert reward.is_correct(db_path, 'SELECT 5', gold) is True


def test_gold_is_executed_once_and_again_after_the_file_changes(db_path, monkeypatch):
  executed = []

  def counting_execute(path, query, **kwargs):
    executed.append(query)
    return real_execute(path, query, **kwargs)

  real_execute = sql_tool.execute
  monkeypatch.setattr(sql_tool, 'execute', counting_execute)
  gold = 'SELECT MAX(units) FROM sales'
  for predicted in ['SELECT 5', 'SELECT 4', 'SELECT MAX(units) FROM sales']:
    reward.is_correct(db_path, predicted, gold)
  assert executed.count(gold) == 2  # once as gold, once as the third prediction
  stat = db_path.stat()
  os.utime(db_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
  reward.is_correct(db_path, 'SELECT 5', gold)
  assert executed.count(gold) == 3


def test_gold_cache_is_bounded(db_path, monkeypatch):
  monkeypatch.setattr(reward, 'GOLD_CACHE_SIZE', 3)
  for n in range(6):
    reward.is_correct(db_path, 'SELECT 1', f'SELECT {n}')
  assert len(reward._gold_cache) == 3


def _with_max_rows(execute, max_rows):
  return lambda path, query, **kwargs: execute(path, query, max_rows=max_rows, **kwargs)
