"""A grid of `--config.*` overrides × seeds, one `python -m luckystar.main` process per run, one table.

    PYTHONPATH=. python experiments/sweep.py --config=configs/rlvr.py:smoke \
        --grid=rlvr.language_penalty=0,0.5 --seeds=0,1 --root=/tmp/sweep-language-penalty \
        --metrics=train/reward,train/correctness,train/language_mismatch,eval/correctness,eval/language_mismatch \
        --out=experiments/sweeps/language_penalty_smoke

Runs go one after another under ROOT/<key=value,...,seed=s>/ (re-running the sweep resumes or skips
finished runs: `luckystar.main` resumes a workdir). Several `--grid` flags make a product. An `--arm` is a
named set of overrides that go together (e.g. DAPO's options), separated by ';':

    --arm='rloo' --arm='dapo;rlvr.advantage=grpo;rlvr.dynamic_sampling=2;rlvr.reward=correct:1,overlong_soft:1'

Arms × grid points × seeds are run; the arm's name is the table's first column. The table
has one row per run and one per grid point (mean ± std over seeds), with each metric's final value
(its last logged row) and best value (max; min for names matching --minimize) from the run's
metrics.jsonl, the run's seconds per training step (rollouts included) and its wall time (summed over
resumes), written as OUT.csv (every run, final and best) and OUT.md (markdown).
"""

import argparse
import csv
import itertools
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Callable, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MINIMIZE = ('loss', 'language_mismatch', 'overlong', 'kl', 'unscorable')


def parse_grid(specs: Sequence[str]) -> dict[str, list[str]]:
  """['rlvr.language_penalty=0,0.5', ...] → {'rlvr.language_penalty': ['0', '0.5'], ...}."""
  grid = {}
  for spec in specs:
    key, sep, values = spec.partition('=')
    if not sep or not key or not values:
      raise SystemExit(f'error: --grid={spec!r} must look like config.key=v1,v2 (e.g. rlvr.language_penalty=0,0.5)')
    grid[key.removeprefix('config.')] = values.split(',')
  return grid


def grid_points(grid: dict[str, list[str]]) -> list[dict[str, str]]:
  return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def parse_arms(specs: Sequence[str]) -> dict[str, dict[str, str]]:
  """['dapo;rlvr.advantage=grpo;rlvr.clip_high=0.28', 'rloo'] → {'dapo': {'rlvr.advantage': 'grpo', ...},
  'rloo': {}}: a name, then the overrides it sets together (values may hold commas)."""
  arms = {}
  for spec in specs:
    name, *items = spec.split(';')
    overrides = {}
    for item in items:
      key, sep, value = item.partition('=')
      if not sep or not key:
        raise SystemExit(f'error: --arm={spec!r}: {item!r} must look like config.key=value')
      overrides[key.removeprefix('config.')] = value
    if not name or '=' in name or name in arms:
      raise SystemExit(f'error: --arm={spec!r} must start with a new name (e.g. dapo;rlvr.advantage=grpo)')
    arms[name] = overrides
  return arms


def run_points(arms: dict[str, dict[str, str]], grid: dict[str, list[str]]
               ) -> list[tuple[dict[str, str], dict[str, str]]]:
  """(table labels, config overrides) of every arm × grid point; no arms: the grid points alone."""
  if not arms:
    return [(point, point) for point in grid_points(grid)]
  return [({'arm': name} | point, overrides | point) for name, overrides in arms.items()
          for point in grid_points(grid)]


def run_name(point: dict[str, str], seed: int) -> str:
  return ','.join([*(f'{k.split(".")[-1]}={v}' for k, v in point.items()), f'seed={seed}'])


def command(config: str, workdir: pathlib.Path, point: dict[str, str] | None = None, seed: int | None = None
            ) -> list[str]:
  """The user's command, `python -m luckystar.main --config=C --workdir=W [--config.K=V ...]`, as argv."""
  seeded = {} if seed is None else {'seed': seed}
  return [sys.executable, '-m', 'luckystar.main', f'--config={config}', f'--workdir={workdir}',
          *(f'--config.{k}={v}' for k, v in {**(point or {}), **seeded}.items())]


def run_and_report(description: str, config: str, default_workdir: str, report_path: pathlib.Path,
                   report: Callable[[pathlib.Path, list[str], float], str]) -> None:
  """An experiment script's main: runs the user's command for `config` on `--workdir` with its
  `--override KEY=VALUE`s (re-running resumes), then writes `report(workdir, overrides, seconds)` to
  `report_path`, followed by the old report's hand-written `## Notes` section if it had one, and prints it."""
  parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--workdir', default=default_workdir)
  parser.add_argument('--override', action='append', default=[], help='a config override KEY=VALUE (repeatable)')
  args = parser.parse_args()
  workdir = pathlib.Path(args.workdir)
  argv = command(config, workdir, dict(o.split('=', 1) for o in args.override))
  print('$', ' '.join(argv), flush=True)
  start = time.perf_counter()
  subprocess.run(argv, cwd=ROOT, check=True)
  text = report(workdir, args.override, time.perf_counter() - start)
  report_path.write_text(text + kept_notes(report_path))
  print(text)


NOTES = '## Notes'   # a report's hand-written tail, from this heading on: kept when the script rewrites the report


def kept_notes(report_path: pathlib.Path) -> str:
  """The existing report's hand-written tail (from the `NOTES` heading to the end), or ''."""
  text = report_path.read_text() if report_path.is_file() else ''
  start = text.find('\n' + NOTES + '\n')
  return '' if start < 0 else text[start:]


def read_metrics(workdir: pathlib.Path) -> list[dict]:
  path = workdir / 'metrics.jsonl'
  if not path.is_file():
    raise FileNotFoundError(f'{path}: the run wrote no metrics.jsonl (did it fail? see {workdir}/sweep.log)')
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def final_and_best(rows: Sequence[dict], metric: str, minimize: Sequence[str] = DEFAULT_MINIMIZE
                   ) -> tuple[float, float]:
  """The metric's value in its last logged row, and its best over the run (NaN where never logged)."""
  values = [float(r[metric]) for r in rows if metric in r and r[metric] is not None]
  values = [v for v in values if math.isfinite(v)]
  if not values:
    return math.nan, math.nan
  lower_is_better = any(part in metric for part in minimize)
  return values[-1], (min(values) if lower_is_better else max(values))


def collect(runs: Sequence[dict], metrics: Sequence[str], minimize: Sequence[str] = DEFAULT_MINIMIZE
            ) -> list[dict]:
  """runs: {'point': {...}, 'seed': s, 'workdir': path} → one record per run with final/best values."""
  records = []
  for run in runs:
    rows = read_metrics(pathlib.Path(run['workdir']))
    record = {**run['point'], 'seed': run['seed'], 'steps': max((r['step'] for r in rows), default=0)}
    rates = [r['perf/steps_per_sec'] for r in rows if r.get('perf/steps_per_sec')]
    record['sec/step'] = statistics.mean(1 / r for r in rates) if rates else math.nan
    record['wall_s'] = _wall_time(pathlib.Path(run['workdir']))
    for metric in metrics:
      record[f'{metric} (final)'], record[f'{metric} (best)'] = final_and_best(rows, metric, minimize)
    records.append(record)
  return records


WALL_FILE = 'sweep_wall.json'   # a run's wall time, summed over the sweep's invocations (resumes)


def _wall_time(workdir: pathlib.Path) -> float:
  path = workdir / WALL_FILE
  return json.loads(path.read_text())['seconds'] if path.is_file() else math.nan


def _add_wall_time(workdir: pathlib.Path, seconds: float) -> None:
  previous = _wall_time(workdir)
  (workdir / WALL_FILE).write_text(json.dumps({'seconds': seconds + (0 if math.isnan(previous) else previous)}))


def _mean_std(values: Sequence[float]) -> str:
  values = [v for v in values if math.isfinite(v)]
  if not values:
    return '–'
  if len(values) == 1:
    return f'{values[0]:.3f}'
  return f'{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}'


COST_COLUMNS = ('sec/step', 'wall_s')


def write_tables(records: Sequence[dict], keys: Sequence[str], metrics: Sequence[str], out: str | pathlib.Path,
                 title: str = 'Sweep') -> tuple[pathlib.Path, pathlib.Path]:
  """OUT.csv (one row per run) and OUT.md (per run, then mean ± std over seeds per grid point)."""
  out = pathlib.Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  columns = [*keys, 'seed', 'steps', *(f'{m} ({kind})' for m in metrics for kind in ('final', 'best')),
             *COST_COLUMNS]
  csv_path, md_path = out.with_suffix('.csv'), out.with_suffix('.md')
  with csv_path.open('w', newline='') as f:
    writer = csv.DictWriter(f, columns)
    writer.writeheader()
    writer.writerows({c: r.get(c) for c in columns} for r in records)

  fmt = lambda v: '–' if isinstance(v, float) and not math.isfinite(v) else (f'{v:.3f}' if isinstance(v, float) else str(v))
  lines = [f'# {title}', '', '## Per run (final value, best in parentheses)', '',
           '| ' + ' | '.join([*keys, 'seed', 'steps', *metrics, *COST_COLUMNS]) + ' |',
           '|' + '---|' * (len(keys) + 2 + len(metrics) + len(COST_COLUMNS))]
  for r in records:
    cells = [str(r[k]) for k in keys] + [str(r['seed']), str(r['steps'])]
    cells += [f'{fmt(r[f"{m} (final)"])} ({fmt(r[f"{m} (best)"])})' for m in metrics]
    cells += [fmt(r.get(c, math.nan)) for c in COST_COLUMNS]
    lines.append('| ' + ' | '.join(cells) + ' |')
  lines += ['', '## Per grid point (final value, mean ± std over seeds)', '',
            '| ' + ' | '.join([*keys, 'seeds', *metrics, COST_COLUMNS[0]]) + ' |',
            '|' + '---|' * (len(keys) + 2 + len(metrics))]
  groups: dict[tuple, list[dict]] = {}
  for r in records:
    groups.setdefault(tuple(r[k] for k in keys), []).append(r)
  for point, group in groups.items():
    cells = [*map(str, point), str(len(group))]
    cells += [_mean_std([g[f'{m} (final)'] for g in group]) for m in metrics]
    cells.append(_mean_std([g.get(COST_COLUMNS[0], math.nan) for g in group]))
    lines.append('| ' + ' | '.join(cells) + ' |')
  md_path.write_text('\n'.join(lines) + '\n')
  return csv_path, md_path


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', required=True, help='config file[:variant], as for luckystar.main')
  parser.add_argument('--grid', action='append', default=[], help='config.key=v1,v2 (repeatable: a product)')
  parser.add_argument('--arm', action='append', default=[],
                      help="name;config.key=value;... overrides set together (repeatable: one arm each)")
  parser.add_argument('--seeds', default='0', help='comma-separated seeds')
  parser.add_argument('--metrics', required=True, help='comma-separated metric names from metrics.jsonl')
  parser.add_argument('--minimize', default=','.join(DEFAULT_MINIMIZE),
                      help='metrics whose name contains one of these are better lower')
  parser.add_argument('--root', required=True, help='folder for the run directories')
  parser.add_argument('--out', required=True, help='table path without suffix: writes OUT.csv and OUT.md')
  args = parser.parse_args(argv)

  grid, arms, seeds = parse_grid(args.grid), parse_arms(args.arm), [int(s) for s in args.seeds.split(',')]
  metrics, minimize = args.metrics.split(','), [m for m in args.minimize.split(',') if m]
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}   # one CPU device per run
  env['PYTHONPATH'] = os.pathsep.join(p for p in (str(ROOT), env.get('PYTHONPATH')) if p)  # this checkout's luckystar
  env.setdefault('JAX_COMPILATION_CACHE_DIR', str(pathlib.Path(args.root) / 'jax_cache'))  # runs share compiles
  runs, points = [], run_points(arms, grid)
  for index, ((point, overrides), seed) in enumerate(itertools.product(points, seeds), 1):
    workdir = pathlib.Path(args.root) / run_name(point, seed)
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with (workdir / 'sweep.log').open('w') as log:
      result = subprocess.run(command(args.config, workdir, overrides, seed), stdout=log, stderr=subprocess.STDOUT,
                              env=env)
    _add_wall_time(workdir, time.time() - start)
    print(f'[{index}/{len(points) * len(seeds)}] {workdir.name}: exit {result.returncode}, '
          f'{time.time() - start:.0f} s', flush=True)
    if result.returncode != 0:
      raise SystemExit(f'error: run {workdir} failed (exit {result.returncode}); its output is in {workdir}/sweep.log')
    runs.append({'point': point, 'seed': seed, 'workdir': workdir})
  title = f'Sweep of {args.config}: ' + ' × '.join([*([f'arms {{{", ".join(arms)}}}'] if arms else []),
                                                    *(f'{k} ∈ {{{", ".join(v)}}}' for k, v in grid.items())])
  title += f' × seeds {{{", ".join(map(str, seeds))}}}'
  keys = ['arm'] * bool(arms) + list(grid)
  csv_path, md_path = write_tables(collect(runs, metrics, minimize), keys, metrics, args.out, title)
  print(f'wrote {csv_path} and {md_path}')


if __name__ == '__main__':
  main()
