"""Execution-match reward: multiset vs ordered rows, numeric tolerance, unscorable golds, the gold cache."""

import os
import sqlite3

import pytest

from luckystar.rewards import sql as reward
from luckystar.tools import sql as sql_tool

pytestmark = pytest.mark.fast


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
    (1_000_000.0, 1_000_000.5, True),  # rel tolerance 1e-6
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
  gold = _result((1000001, 0.5, 0.5), (1000002, 1.0000008, 1.0000008), (1000002, 1.0000008, 1.0))
  assert reward.results_match(_result((1000002, 1.0000008, 1.0000008), (1000001, 0.5 + 1e-12, 0.5),
                                      (1000002, 1.0, 1.0000015)), gold, ordered=False)
  assert not reward.results_match(_result((1000002, 1.0000008, 1.0000008), (1000002, 0.5, 0.5),
                                          (1000001, 1.0, 1.0000015)), gold, ordered=False)


def test_tolerance_chains_need_a_real_matching_not_a_greedy_or_sorted_pairing():
  # Each row fits its partner within tolerance, but tolerance is not transitive: 1.0000008 fits both 1.0 and
  # 1.0000015, which do not fit each other. Pairing the identical rows first, or by sorted order, strands a row.
  gold = _result((1.0000008, 1.0000008), (1.0000008, 1.0))
  predicted = _result((1.0000008, 1.0000008), (1.0, 1.0000015))
  assert reward.results_match(predicted, gold, ordered=False)
  assert not reward.results_match(_result((1.0000008, 1.0000008), (0.9999992, 1.0000015)), gold, ordered=False)
  assert reward.results_match(_result((1.0000008,), (1.0,)), _result((1.0,), (1.0000015,)), ordered=False)
  assert not reward.results_match(_result((1.0000008,), (0.9999985,)), _result((1.0,), (1.0000015,)),
                                  ordered=False)


def test_matching_at_the_row_cap():
  gold = _result(*[(1.0000008, 1.0000008), (1.0000008, 1.0)] * 100)
  predicted = [(1.0000008, 1.0000008), (1.0, 1.0000015)] * 100
  assert reward.results_match(_result(*predicted), gold, ordered=False)
  predicted[-1] = (0.9999992, 1.0000015)
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
