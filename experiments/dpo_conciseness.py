"""Offline DPO for conciseness on the post-RL policy (paper §2.5): how much shorter, at what correctness.

    python experiments/dpo_conciseness.py                          # the default configs/dpo.py (from tiny-rlvr)
    python experiments/dpo_conciseness.py --workdir=/tmp/dpo-conciseness --override=dpo.beta=0.2

(with luckystar installed, `pip install -e .`, or PYTHONPATH=. from the repository root)

Runs the user's command, `python -m luckystar.main --config=configs/dpo.py --workdir=W [--config.K=V ...]`
(re-running resumes, and reuses the built pairs and cached reference log-probs), then reads the run's
`metrics.jsonl`: the held-out eval the stage logs at step 0 (the starting policy) and at the end, both
modes (greedy; Korean MC, chat, short math), and the pair statistics in `dpo_pairs.json`. The claim
checked (issue 6): mean concise-mode response length falls by ≥ 30% while held-out correctness stays
within 2 points in both modes. Writes `experiments/dpo_conciseness.md` and prints it.

The length cut is measured where the paper and the issue place it: on the concise-style prompts, the
pair tasks (`config.dpo.tasks`: Korean MC and chat, pooled over their held-out prompts). Concise math
is not one (its replies are as short as the reasoning mode's final answer and right 1% of the time:
the policy cannot do arithmetic without thinking); its rows and the all-task means are reported, and
correctness must hold over all eval tasks as well as over the concise-style ones.
"""

import json
import pathlib
import sys

from luckystar.engine import evals

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sweep  # noqa: E402  (experiments/sweep.py)

ROOT = pathlib.Path(__file__).resolve().parents[1]
REPORT = ROOT / 'experiments' / 'dpo_conciseness.md'
LENGTH_CUT = 0.30        # the claim: concise replies ≥ 30% shorter ...
CORRECTNESS_SLACK = 0.02  # ... with correctness within 2 points in both modes
MODES = ('concise', 'reasoning')


def eval_rows(workdir: pathlib.Path) -> tuple[dict, dict]:
  """(first, last) metrics rows with eval/* figures: the starting policy and the trained one."""
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines() if line.strip()]
  evals = [row for row in rows if any(key.startswith('eval/') for key in row)]
  if len(evals) < 2 or evals[0]['step'] != 0:
    raise SystemExit(f'{workdir}/metrics.jsonl has no step-0 and final eval; has the run finished?')
  return evals[0], evals[-1]


def report(workdir: pathlib.Path, overrides: list[str], seconds: float) -> str:
  start, end = eval_rows(workdir)
  config = json.loads((workdir / 'config.json').read_text())
  pairs_file = config['dpo']['pairs_file']  # pairs built by another run: its summary sits beside them
  pairs = json.loads(((pathlib.Path(pairs_file).parent if pairs_file else workdir) / 'dpo_pairs.json').read_text())
  tasks = config['dpo']['task_eval']['tasks']
  pct = lambda v: f'{100 * v:.1f}'
  lines = [
      '# Offline DPO for conciseness', '',
      f'Written by `python experiments/dpo_conciseness.py{"".join(" --override=" + o for o in overrides)}`: '
      f'`configs/dpo.py` from `{config["init_from"]}`, {config["total_steps"]} steps of {config["batch_size"]} pairs, '
      f'{config["dpo"]["loss_type"]} loss, β = {config["dpo"]["beta"]}, learning rate {config["learning_rate"]}, '
      f'seed {config["seed"]}; {seconds / 60:.1f} min on this machine (this invocation; 0 if it only re-read a '
      'finished run). Held-out eval: greedy, the first '
      f'{config["dpo"]["task_eval"]["per_task_language"]} held-out prompts per task and language of '
      f'{", ".join(tasks)}.', '',
      '| metric | before (step 0) | after DPO | change |', '|---|---|---|---|']

  def rows(mode, name, label, value, change, unit=''):
    """The `eval/<mode>/<name>` row (before, after, change + `unit`), then one row per eval task."""
    head = f'eval/{mode}/{name}'
    out = [f'| {mode}: {label} | {value(start[head])} | {value(end[head])} | {change(start[head], end[head])}{unit} |']
    out += [f'| … {task} | {value(start[key])} | {value(end[key])} | {change(start[key], end[key])} |'
            for task in tasks if (key := f'{head}/{task}') in start and key in end]
    return out

  # The concise claim over the concise-style prompts (the pair tasks), pooled by held-out prompt count.
  settings = evals.Settings.from_config(config['dpo']['task_eval'])
  counts = {task: sum(e.task == task for e in evals.select(settings)) for task in tasks}
  style = [task for task in config['dpo']['tasks'] if task in counts]

  def pooled(row, name):
    return sum(counts[t] * row[f'eval/concise/{name}/{t}'] for t in style) / sum(counts[t] for t in style)

  checks = []
  length0, length1 = pooled(start, 'response_length'), pooled(end, 'response_length')
  correct0, correct1 = pooled(start, 'correctness'), pooled(end, 'correctness')
  label = ' + '.join(f'{t} ({counts[t]})' for t in style)
  lines += [f'| concise, concise-style prompts ({label}): mean response length (tokens) | {length0:.1f} | '
            f'{length1:.1f} | {100 * (length1 - length0) / length0:+.1f}% |',
            f'| concise, concise-style prompts: correctness (%) | {pct(correct0)} | {pct(correct1)} | '
            f'{100 * (correct1 - correct0):+.1f} points |']
  checks += [(f'concise replies to concise-style prompts ≥ {100 * LENGTH_CUT:.0f}% shorter',
              length1 <= (1 - LENGTH_CUT) * length0),
             (f'concise correctness on concise-style prompts within {100 * CORRECTNESS_SLACK:.0f} points',
              correct1 >= correct0 - CORRECTNESS_SLACK - 1e-9)]
  for mode in MODES:
    correct0, correct1 = start[f'eval/{mode}/correctness'], end[f'eval/{mode}/correctness']
    lines += rows(mode, 'response_length', 'mean response length, all eval tasks (tokens)', lambda v: f'{v:.1f}',
                  lambda a, b: f'{100 * (b - a) / a:+.1f}%')
    lines += rows(mode, 'correctness', 'correctness, all eval tasks (%)', pct, lambda a, b: f'{100 * (b - a):+.1f}',
                  ' points')
    checks.append((f'{mode} correctness over all eval tasks within {100 * CORRECTNESS_SLACK:.0f} points',
                   correct1 >= correct0 - CORRECTNESS_SLACK - 1e-9))
  summary = pairs['pairs'].get('all', {})
  anchors = pairs['pairs'].get('anchor', {}).get('pairs', 0)
  lines += ['', f'Pairs: {summary.get("pairs", 0)} from {pairs["prompts"]} prompts '
            f'(chosen {summary.get("chosen_length", float("nan")):.1f} tokens, rejected '
            f'{summary.get("rejected_length", float("nan")):.1f} tokens on average; the rejected reply was correct in '
            f'{pct(summary.get("rejected_correct", float("nan")))}% of pairs); anchor rows (the policy\'s own '
            f'correct replies in {", ".join(config["dpo"]["anchor_modes"]) or "no"} mode, weight '
            f'{config["dpo"]["anchor_weight"]}): {anchors}.', '',
            '| pair kind / task / language | pairs | chosen length | rejected length |', '|---|---|---|---|']
  lines += [f'| {key} | {value["pairs"]} | {value["chosen_length"]:.1f} | {value["rejected_length"]:.1f} |'
            for key, value in pairs['pairs'].items() if key != 'all']
  lines += ['', *[f'- {"met" if ok else "NOT met"}: {name}' for name, ok in checks], '']
  return '\n'.join(lines)


def main() -> None:
  sweep.run_and_report(__doc__, 'configs/dpo.py', '/tmp/luckystar-dpo-conciseness', REPORT, report)


if __name__ == '__main__':
  main()
