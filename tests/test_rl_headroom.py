"""experiments/rl_headroom.py: the headroom / risk arithmetic and the verdict transitions of its report."""

import importlib.util
import pathlib
import types

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location('rl_headroom', ROOT / 'experiments' / 'rl_headroom.py')
rl_headroom = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rl_headroom)


def test_report_sums_pass_rates_of_greedy_wrong_prompts_and_counts_flips():
  examples = [types.SimpleNamespace(id=i, task=task) for i, task in (('a', 'math'), ('b', 'math'), ('c', 'chat'))]
  results = {'start': {'a': (False, 0.25), 'b': (True, 0.5), 'c': (False, 0.0)},
             'end': {'a': (True, 0.75), 'b': (False, 0.375), 'c': (False, 0.125)}}
  text = rl_headroom.report(examples, results, samples=8, command='cmd')
  rows = {tuple(cell.strip() for cell in line.strip('|').split('|')) for line in text.splitlines()
          if line.startswith('|')}
  assert ('start', 'all', '3', '1 (33.3%)', '25.0%', '1', '0.25', '0.50') in rows
  assert ('end', 'math', '2', '1 (50.0%)', '56.2%', '1', '0.38', '0.25') in rows
  # pass counts out of 8, greedy-wrong / greedy-right: a has 2, b has 4, c has 0
  assert ('math', '0 / 0', '0 / 0', '1 / 0', '0 / 0', '0 / 1', '0 / 0', '0 / 0', '0 / 0', '0 / 0') in rows
  # a turned right (start headroom 0.25), b turned wrong; Σ p over start's greedy-wrong a, c: 0.25 → 0.875
  assert ('all', '1', '1', '0.25', '0.25 → 0.88') in rows
