"""experiments/sweep.py: the grid, the run commands, and the table from each run's metrics.jsonl."""

import csv
import importlib.util
import json
import math
import pathlib

import pytest

pytestmark = pytest.mark.fast

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location('sweep', ROOT / 'experiments' / 'sweep.py')
sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)


def test_grid_is_a_product_and_commands_carry_the_overrides(tmp_path):
  grid = sweep.parse_grid(['rlvr.language_penalty=0,0.5', 'config.learning_rate=1e-5,3e-5'])
  points = sweep.grid_points(grid)
  assert len(points) == 4 and {'rlvr.language_penalty': '0.5', 'learning_rate': '1e-5'} in points
  assert sweep.run_name(points[0], 1) == 'language_penalty=0,learning_rate=1e-5,seed=1'
  cmd = sweep.command('configs/rlvr.py:smoke', tmp_path, points[0], 1)
  assert cmd[1:4] == ['-m', 'luckystar.main', '--config=configs/rlvr.py:smoke']
  assert '--config.rlvr.language_penalty=0' in cmd and '--config.seed=1' in cmd
  with pytest.raises(SystemExit, match='config.key=v1,v2'):
    sweep.parse_grid(['rlvr.language_penalty'])


def _fake_run(workdir: pathlib.Path, rewards, mismatch):
  workdir.mkdir(parents=True)
  rows = [{'step': i + 1, 'train/reward': r, 'perf/steps_per_sec': 0.5} for i, r in enumerate(rewards)]
  rows[0]['eval/language_mismatch'], rows[-1]['eval/language_mismatch'] = mismatch
  rows[1]['train/reward'] = float('nan')   # undefined values are skipped, never "best"
  (workdir / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))


def test_table_has_final_and_best_per_run_and_mean_over_seeds(tmp_path):
  runs = []
  for penalty, seed, rewards, mismatch in [('0', 0, [0.1, 0, 0.5, 0.3], (0.4, 0.2)),
                                           ('0', 1, [0.2, 0, 0.1, 0.5], (0.3, 0.1)),
                                           ('0.5', 0, [0.0, 0, 0.2, 0.2], (0.5, 0.0)),
                                           ('0.5', 1, [0.3, 0, 0.6, 0.4], (0.2, 0.0))]:
    workdir = tmp_path / f'p{penalty}s{seed}'
    _fake_run(workdir, rewards, mismatch)
    runs.append({'point': {'rlvr.language_penalty': penalty}, 'seed': seed, 'workdir': workdir})
  metrics = ['train/reward', 'eval/language_mismatch', 'eval/never_logged']
  records = sweep.collect(runs, metrics)
  assert records[0]['train/reward (final)'] == 0.3 and records[0]['train/reward (best)'] == 0.5
  assert records[0]['eval/language_mismatch (best)'] == 0.2   # lower is better for mismatch
  assert records[0]['steps'] == 4 and math.isnan(records[0]['eval/never_logged (final)'])

  csv_path, md_path = sweep.write_tables(records, ['rlvr.language_penalty'], metrics, tmp_path / 'out' / 'table')
  rows = list(csv.DictReader(csv_path.open()))
  assert len(rows) == 4 and rows[3]['train/reward (final)'] == '0.4' and rows[3]['seed'] == '1'
  markdown = md_path.read_text()
  assert '| 0 | 0 | 4 | 0.300 (0.500) | 0.200 (0.200) | – (–) | 2.000 | – |' in markdown   # 2 s/step
  assert '| 0.5 | 2 | 0.300 ± 0.141 | 0.000 ± 0.000 | – | 2.000 ± 0.000 |' in markdown   # mean ± std over seeds


def test_arms_set_their_overrides_together_and_label_the_table(tmp_path):
  arms = sweep.parse_arms(['rloo', 'dapo;rlvr.advantage=grpo;rlvr.reward=correct:1,overlong_soft:1'])
  assert arms == {'rloo': {}, 'dapo': {'rlvr.advantage': 'grpo', 'rlvr.reward': 'correct:1,overlong_soft:1'}}
  points = sweep.run_points(arms, sweep.parse_grid(['learning_rate=1e-5']))
  assert points[1] == ({'arm': 'dapo', 'learning_rate': '1e-5'},
                       {'rlvr.advantage': 'grpo', 'rlvr.reward': 'correct:1,overlong_soft:1', 'learning_rate': '1e-5'})
  assert sweep.run_name(points[1][0], 0) == 'arm=dapo,learning_rate=1e-5,seed=0'
  assert '--config.rlvr.reward=correct:1,overlong_soft:1' in sweep.command('c.py', tmp_path, points[1][1], 0)
  assert sweep.run_points({}, {'seed': ['1']}) == [({'seed': '1'}, {'seed': '1'})]
  for bad in ('dapo;rlvr.advantage', 'a=b;x=1'):
    with pytest.raises(SystemExit, match='--arm'):
      sweep.parse_arms([bad])
  sweep._add_wall_time(tmp_path, 10.0)
  sweep._add_wall_time(tmp_path, 2.5)   # a resumed run adds its time
  assert sweep._wall_time(tmp_path) == 12.5


def test_a_run_without_metrics_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match='metrics.jsonl'):
    sweep.collect([{'point': {}, 'seed': 0, 'workdir': tmp_path}], ['train/reward'])


def test_a_rewritten_report_keeps_its_hand_written_notes(tmp_path):
  report = tmp_path / 'report.md'
  assert sweep.kept_notes(report) == ''
  report.write_text('# Old numbers\n\n| a |\n\n## Notes\n\nTried X (2026-12-03): 3 of 8.\n')
  assert sweep.kept_notes(report) == '\n## Notes\n\nTried X (2026-12-03): 3 of 8.\n'
  report.write_text('# Old numbers\n\nno notes here; ## Notes inline is not the heading\n')
  assert sweep.kept_notes(report) == ''
