"""The paper in miniature, its report: one section per paper finding from a `pipeline` run's stage outputs.

    python -m luckystar.main --config=configs/pipeline.py --workdir=/tmp/luckystar-paper     # the stages
    python experiments/paper_report.py --workdir=/tmp/luckystar-paper

(with luckystar installed, `pip install -e .`, or PYTHONPATH=. from the repository root)

Reads WORKDIR/config.json (the pipeline's stage order) and the output of each stage that finished
(WORKDIR/<stage>/stage_done.json, with its wall time), and writes WORKDIR/report.md, report.json and
plots/table2_language_mismatch.png: each finding with the paper's claim, our numbers and whether its
direction reproduced. A stage that has not finished (or is left out of the order) leaves its findings
out, so a partial run gets a partial report. Takes seconds; experiments/paper_reproduction.md is one
run's report.
"""

import argparse
import json
import math
import pathlib
from typing import Any, Callable, Sequence

import numpy as np

from luckystar.engine import metrics as metrics_lib
from luckystar.stages import pipeline

REPORT_FILE = 'report.md'
RESULTS_FILE = 'report.json'
SELECTION_FILE = 'prompt_selection.json'   # the rlvr stage's cached prompt selection, in its workdir
DPO_LENGTH_CUT = 30.0   # % shorter concise replies that count as the paper's effect (not noise)


# ---- reading the stages' outputs ---------------------------------------------------------------------


def _eval_ends(rows: list[dict[str, Any]], key: str) -> tuple[float, float]:
  """(first, last) logged value of `key` (NaN where never logged)."""
  values = [row[key] for row in rows if key in row]
  return (values[0], values[-1]) if values else (math.nan, math.nan)


def _series(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
  return [(row['step'], row[key]) for row in rows if key in row and math.isfinite(row[key])]


def _mean(values) -> float:
  values = [v for v in values if math.isfinite(v)]
  return float(np.mean(values)) if values else math.nan


def _suite(results: dict[str, Any] | None, suite: str, mode: str, key: str = 'correctness') -> float:
  if not results:
    return math.nan
  return results['suites'].get(suite, {}).get(mode, {}).get(key, math.nan)


def _json(path: pathlib.Path) -> dict[str, Any] | None:
  return json.loads(path.read_text()) if path.is_file() else None


# ---- the findings ------------------------------------------------------------------------------------


def _finding(title: str, paper: str, rows: list[list[Any]], header: list[str], reproduced: bool | None,
             verdict: str) -> dict[str, Any]:
  return {'title': title, 'paper': paper, 'header': header, 'rows': rows,
          'reproduced': reproduced, 'verdict': verdict}


def _table1(workdir, have) -> dict[str, Any] | None:
  if not have('eval_sft', 'eval_sft_korean_thinking'):
    return None
  english, korean = (_json(workdir / name / 'results.json') for name in ('eval_sft', 'eval_sft_korean_thinking'))
  rows = [[label, 100 * _suite(r, 'math', 'reasoning', 'correctness/ko'), 100 * _suite(r, 'korean_mc', 'reasoning'),
           100 * _suite(r, 'math', 'reasoning', 'correctness/en')]
          for label, r in (('English thinking (`sft`)', english), ('Korean thinking (`sft_korean_thinking`)', korean))]
  gap = rows[0][1] - rows[1][1]   # only math has Korean traces: the other columns show the runs' noise
  return _finding('Table 1: English vs Korean thinking for Korean prompts',
                  'English reasoning beats Korean reasoning on Korean prompts.',
                  rows, ['SFT traces', 'Korean math pass@1 %', 'Korean MC %', 'English math pass@1 %'],
                  gap > 0, f'Korean math pass@1, English − Korean thinking: {gap:+.1f} points '
                  f'({english["suites"]["math"]["reasoning"]["examples"] // 2} Korean prompts)')


def _table2(workdir, have) -> dict[str, Any] | None:
  if not have('rlvr', 'rlvr_no_penalty'):
    return None
  runs = {f'penalty {label} (`{name}`)': metrics_lib.read(workdir / name)
          for label, name in (('1.0', 'rlvr'), ('0', 'rlvr_no_penalty'))}
  rows = []
  for label, metric_rows in runs.items():
    train = [v for _, v in _series(metric_rows, 'train/language_mismatch')]
    half = len(train) // 2
    start, end = _eval_ends(metric_rows, 'eval/language_mismatch')
    rows.append([label, 100 * _mean(train[:half]), 100 * _mean(train[half:]), 100 * start, 100 * end,
                 100 * _eval_ends(metric_rows, 'eval/correctness')[1]])
  penalised, free = rows
  return _finding('Table 2: Korean→English response mismatch during RLVR',
                  'The language-consistency penalty reduces Korean-to-English answer drift during RLVR.',
                  rows, ['run', 'train mismatch %, first half', 'train mismatch %, second half',
                         'held-out mismatch % at step 0', 'held-out mismatch % at the end',
                         'held-out correctness % at the end'],
                  penalised[4] < free[4] or (penalised[4] == free[4] and penalised[2] < free[2]),
                  f'held-out mismatch at the end: {penalised[4]:.1f}% with the penalty vs {free[4]:.1f}% without '
                  f'(train, second half: {penalised[2]:.1f}% vs {free[2]:.1f}%)')


def _zero_variance_candidates(stage_dir: pathlib.Path) -> float:
  """% of the prompts an RLOO stage's prompt selection measured (k rollouts each by its starting policy) whose
  rollouts were all wrong or all right: groups that would give RLOO no signal."""
  selection = _json(stage_dir / SELECTION_FILE)
  rates = list(selection['pass_rates'].values()) if selection else []
  return 100 * _mean(float(rate in (0.0, 1.0)) for rate in rates)


def _cold_start(workdir, have) -> dict[str, Any] | None:
  if not have('nl2sql_from_base', 'nl2sql_from_sft'):
    return None
  rows = []
  for name in ('nl2sql_from_base', 'nl2sql_from_tiny_sft', 'nl2sql_from_sft'):
    if not have(name):  # the control from `tiny-sft` (no RS traces) runs in experiments/cold_start_pipeline.py
      continue
    metric_rows = metrics_lib.read(workdir / name)
    start, end = _eval_ends(metric_rows, 'eval/correctness')
    rows.append([f'`{name}`', _zero_variance_candidates(workdir / name),
                 100 * _mean(v for _, v in _series(metric_rows, 'train/zero_variance_groups')),
                 100 * _mean(v for _, v in _series(metric_rows, 'train/correctness')), 100 * start, 100 * end])
  stats = _json(workdir / 'rejection_sampling' / 'rs_stats.json')
  notes = ''
  if stats:
    nl2sql = stats['groups'].get('nl2sql', {})
    notes = (f'; the teacher\'s NL2SQL pass@1 {100 * nl2sql.get("pass@1", math.nan):.1f}%, pass@N '
             f'{100 * nl2sql.get("pass@N", math.nan):.1f}%, {nl2sql.get("kept_traces", 0)} traces kept')
  if have('eval_nl2sql_unseen'):
    unseen = _json(workdir / 'eval_nl2sql_unseen' / 'results.json')
    notes += (f'; on the held-out split\'s unseen databases after RL: '
              f'{100 * _suite(unseen, "nl2sql", "reasoning"):.1f}% '
              f'({unseen["suites"]["nl2sql"]["reasoning"]["examples"]} '
              'prompts)')
  base, sft = rows[0], rows[-1]
  # "Almost no signal" is read off prompt selection, which every arm runs on its own starting policy; the RL
  # batches' figures are not comparable when the SFT's arm trains on selected prompts only.
  return _finding('Cold start: RLOO on NL2SQL from the base model vs after rejection-sampled SFT',
                  'From the base model RLOO on NL2SQL gets almost no reward signal; rejection-sampled SFT first '
                  'makes RL work.',
                  rows, ['RLOO run', 'zero-variance candidates % (selection, k = 8)', 'zero-variance RL groups %',
                         'RL-batch correctness %', 'held-out NL2SQL % at step 0', 'held-out NL2SQL % at the end'],
                  base[1] >= 95.0 and sft[1] < base[1] and sft[5] > sft[4],
                  f'zero-variance candidates at k = 8 {base[1]:.1f}% from tiny-base vs {sft[1]:.1f}% from the SFT '
                  f'(RL-batch correctness {base[3]:.1f}% vs {sft[3]:.1f}%); held-out NL2SQL (new questions over the '
                  f'training databases) after SFT {sft[4]:.1f}% → {sft[5]:.1f}% over RL{notes}')


def _dpo(workdir, have) -> dict[str, Any] | None:
  if not have('dpo'):
    return None
  metric_rows = metrics_lib.read(workdir / 'dpo')
  rows = [[key.split('/')[1] + ' ' + key.split('/')[2].replace('_', ' ')] +
          [(100 if 'correctness' in key else 1) * v for v in _eval_ends(metric_rows, key)]
          for key in ('eval/concise/response_length', 'eval/concise/correctness', 'eval/reasoning/response_length',
                      'eval/reasoning/correctness')]
  pairs = (_json(workdir / 'dpo' / 'dpo_pairs.json') or {}).get('pairs', {}).get('all', {}).get('pairs', 0)
  cut = 100 * (1 - rows[0][2] / rows[0][1]) if rows[0][1] else math.nan
  drops = [rows[i][1] - rows[i][2] for i in (1, 3)]
  return _finding('DPO for conciseness', 'Low-LR offline DPO shortens concise-mode answers without losing correctness.',
                  rows, ['held-out metric', 'before DPO', 'after DPO'],
                  cut >= DPO_LENGTH_CUT and max(drops) <= 2.0,
                  f'{pairs} pairs; concise length cut {cut:.1f}% (≥ {DPO_LENGTH_CUT:.0f}% counts); '
                  f'correctness change concise {-drops[0]:+.1f}, reasoning {-drops[1]:+.1f} points')


def _tables34(workdir, have) -> list[dict[str, Any]]:
  evals = {name: _json(workdir / name / 'results.json') for name in ('eval_base', 'eval_final', 'eval_int4')
           if have(name)}
  if not evals:
    return []
  suites = sorted({suite for results in evals.values() for suite in results['suites']})
  rows = []
  for suite in suites:
    for mode in ('reasoning', 'concise'):
      values = [100 * _suite(evals.get(name), suite, mode) for name in ('eval_base', 'eval_final', 'eval_int4')]
      if any(math.isfinite(v) for v in values):
        rows.append([suite, mode, *values])
  findings = []
  reasoning = [r for r in rows if r[1] == 'reasoning' and r[0] in ('math', 'champ', 'nl2sql', 'bfcl')]
  if have('eval_base', 'eval_final'):
    gain = _mean(r[3] - r[2] for r in reasoning)
    findings.append(_finding('Table 3: reasoning and tool use, base vs final', 'The recipe improves math, function '
                             'calling and enterprise tool use over the base model.', rows,
                             ['suite', 'mode', 'tiny-base %', 'final (DPO) %', 'final int4 %'], gain > 0,
                             f'mean reasoning-mode gain over math, CHAMP, NL2SQL, BFCL: {gain:+.1f} points'))
    general = [r for r in rows if r[0] in ('chat', 'instruction_following', 'korean_mc') and r[1] == 'concise']
    change = _mean(r[3] - r[2] for r in general)
    findings.append(_finding('Table 4: general quality preserved', 'Specialised reasoning training keeps general '
                             'instruction following and multilingual quality.', general,
                             ['suite', 'mode', 'tiny-base %', 'final (DPO) %', 'final int4 %'], change >= -2.0,
                             f'mean concise-mode change over chat, instruction following, Korean MC: {change:+.1f} '
                             f'points (preserved: ≥ −2)'))
  if have('eval_final', 'eval_int4'):
    diffs = [abs(r[4] - r[3]) for r in rows if math.isfinite(r[3]) and math.isfinite(r[4])]
    quant = [row for row in metrics_lib.read(workdir / 'quantize') if 'quant/linear_bytes_ratio' in row]
    ratio = quant[-1]['quant/linear_bytes_ratio'] if quant else math.nan
    findings.append(_finding('int4 vs full precision', 'int4 weights (single-GPU serving) keep the scores.',
                             [[r[0], r[1], r[3], r[4]] for r in rows], ['suite', 'mode', 'final %', 'final int4 %'],
                             _mean(diffs) <= 2.0, f'mean abs(int4 − float) {_mean(diffs):.1f} points over '
                             f'{len(diffs)} suite/mode cells; linear layers at {100 * ratio:.0f}% of bf16 bytes'))
  return findings


def report(workdir: pathlib.Path, order: tuple[str, ...], wall: dict[str, float]) -> dict[str, Any]:
  """The findings of the stages in `order` that finished in `workdir`, with the stages' wall times."""
  finished = {name for name in order if (workdir / name / pipeline.DONE_FILE).is_file()}
  have: Callable[..., bool] = lambda *names: all(name in finished for name in names)
  findings = [f for f in (_table1(workdir, have), _table2(workdir, have), _cold_start(workdir, have),
                          _dpo(workdir, have)) if f] + _tables34(workdir, have)
  main_job = None
  if have('rlvr'):
    rows = metrics_lib.read(workdir / 'rlvr')
    main_job = {key: _eval_ends(rows, key) for key in ('eval/correctness', 'eval/language_mismatch')}
  return {'stages': list(order), 'wall_s': wall, 'total_wall_s': sum(wall.values()), 'rlvr': main_job,
          'findings': findings}


def _cell(value: Any) -> str:
  if isinstance(value, float):
    return '–' if not math.isfinite(value) else f'{value:.1f}'
  return str(value)


def report_markdown(results: dict[str, Any]) -> str:
  lines = ['# The paper in miniature', '',
           f'Stages: {", ".join(results["stages"])}; {results["total_wall_s"] / 60:.1f} min of stage wall time '
           f'(per stage below). Directions are judged by the rule in each verdict; at this scale most gaps '
           f'are a few prompts, so read the numbers, not only the verdict.', '']
  if results['rlvr']:
    (c0, c1), (m0, m1) = results['rlvr']['eval/correctness'], results['rlvr']['eval/language_mismatch']
    lines += [f'RLVR (`rlvr`): held-out correctness {100 * c0:.1f}% → {100 * c1:.1f}%, Korean→English mismatch '
              f'{100 * m0:.1f}% → {100 * m1:.1f}%.', '']
  lines += ['| finding | reproduced | numbers |', '|---|---|---|']
  for f in results['findings']:
    mark = {True: 'yes', False: '**no**', None: '–'}[f['reproduced']]
    lines.append(f'| {f["title"]} | {mark} | {f["verdict"]} |')
  for f in results['findings']:
    lines += ['', f'## {f["title"]}', '', f'Paper: {f["paper"]}', '', '| ' + ' | '.join(f['header']) + ' |',
              '|' + '---|' * len(f['header'])]
    lines += ['| ' + ' | '.join(_cell(v) for v in row) + ' |' for row in f['rows']]
    lines += ['', f'Reproduced: {"yes" if f["reproduced"] else "no"}. {f["verdict"]}.']
  lines += ['', '## Stage wall times', '', '| stage | minutes |', '|---|---|']
  lines += [f'| {name} | {seconds / 60:.1f} |' for name, seconds in results['wall_s'].items()]
  return '\n'.join(lines) + '\n'


def plot_table2(workdir: pathlib.Path) -> pathlib.Path | None:
  """Train-batch Korean→English mismatch over RLVR steps, with and without the penalty."""
  runs = {label: _series(metrics_lib.read(workdir / name), 'train/language_mismatch')
          for label, name in (('penalty 1.0', 'rlvr'), ('penalty 0', 'rlvr_no_penalty'))}
  if not all(runs.values()):
    return None
  fig, ax = metrics_lib.pyplot().subplots(figsize=(5, 3.2), dpi=100)
  for label, points in runs.items():
    steps, values = zip(*points)
    ax.plot(steps, [100 * v for v in values], marker='.', label=label)
  ax.set(title='Korean→English mismatch during RLVR (train batches)', xlabel='step', ylabel='%')
  ax.grid(alpha=0.3)
  ax.legend()
  return metrics_lib.save_figure(fig, workdir / metrics_lib.PLOTS_DIR / 'table2_language_mismatch.png')


def write(workdir: pathlib.Path, results: dict[str, Any]) -> None:
  (workdir / RESULTS_FILE).write_text(json.dumps(results, indent=2, ensure_ascii=False, allow_nan=True) + '\n')
  (workdir / REPORT_FILE).write_text(report_markdown(results))
  plot_table2(workdir)


def from_workdir(workdir: pathlib.Path) -> dict[str, Any]:
  """`report` of `workdir`: the stage order its config.json holds, each finished stage's recorded wall time."""
  config_path = workdir / 'config.json'
  if not config_path.is_file():
    raise SystemExit(f'{config_path}: not found; run `python -m luckystar.main --config=configs/pipeline.py '
                     f'--workdir={workdir}` first')
  order = tuple(json.loads(config_path.read_text()).get('pipeline', {}).get('order', ()))
  if not order:
    raise SystemExit(f'{config_path}: no pipeline.order; is {workdir} a pipeline run?')
  wall = {name: json.loads(done.read_text())['wall_s'] for name in order
          if (done := workdir / name / pipeline.DONE_FILE).is_file()}
  return report(workdir, order, wall)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--workdir', required=True, help='a `pipeline` run (finished or not)')
  args = parser.parse_args(argv)
  workdir = pathlib.Path(args.workdir)
  found = from_workdir(workdir)
  write(workdir, found)
  print(f'{len(found["findings"])} findings from {len(found["wall_s"])} of {len(found["stages"])} stages; '
        f'report: {workdir / REPORT_FILE}')


if __name__ == '__main__':
  main()
