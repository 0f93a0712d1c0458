"""The NL2SQL cold start (paper §2.3, issue 5): RLOO from the base model gets no reward signal; after
rejection-sampled SFT it does, and held-out NL2SQL improves.

    python experiments/cold_start.py                                  # ~115 min on 2 CPU cores
    python experiments/cold_start.py --workdir=/tmp/cold-start --override=pipeline.stages.nl2sql_from_sft.total_steps=64

(with luckystar installed, `pip install -e .`, or PYTHONPATH=. from the repository root)

Runs the user's command, `python -m luckystar.main --config=experiments/cold_start_pipeline.py --workdir=W`
(re-running resumes the first unfinished stage): a copy phase (`tiny-base` on the quoted copy drill,
`experiments/cold_start_pipeline.py:copy`) → a tiny teacher started from it, trained on its own databases
(`nl2sql.teacher_suite`: mixed schema wordings and the training wording with rows of their own, never a student
prompt) → best-of-8 from it on the student's RS-only NL2SQL prompts → `tiny-sft` given the same copy phase, then
the drill in the traces' form (SFT data `copy_named`), then that drill behind a training database's schema
(`copy_schema`), fine-tuned with the kept traces in its hybrid mixture (the schema drill kept up at 20%) → RLOO
on NL2SQL from that SFT (the held-out set reserved first; prompt selection: pass rate in [1/8, 7/8] at k = 8 over
all 216 prompts left; 32 steps, overlong rollouts scored as wrong, held-out eval every 16), then from `tiny-base` and
from `tiny-sft` (no traces; every candidate kept, 8 steps). Then reads the stages' outputs and writes
experiments/cold_start.md: the teacher's pass@1/pass@8, per arm the zero-variance fraction of prompt selection's
candidates (the comparable "signal" figure: every arm measures its own starting policy at k = 8) and of its RL
groups, RL-batch correctness, held-out NL2SQL (new questions over the training databases,
`engine.curriculum.reserve_eval`;
greedy, and for the SFT's arm also pass@1 of 2 samples) at step 0 and at the end (the SFT's arm: every 16
steps), and the unseen held-out databases after RL. experiments/cold_start_probe.py reads the same run and
says which held-out questions RL's reward can reach (per template, and by whether RL's prompts name its values).
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import paper_report  # noqa: E402  (experiments/paper_report.py: a pipeline run's findings)
import sweep  # noqa: E402  (experiments/sweep.py)

ROOT = pathlib.Path(__file__).resolve().parents[1]
REPORT = ROOT / 'experiments' / 'cold_start.md'
CONFIG = 'experiments/cold_start_pipeline.py'
ARMS = ('nl2sql_from_base', 'nl2sql_from_tiny_sft', 'nl2sql_from_sft')


def _per_step(workdir: pathlib.Path, arm: str) -> list[str]:
  rows = sweep.read_metrics(workdir / arm)
  train = [r for r in rows if 'train/zero_variance_groups' in r]
  return [f'{100 * r["train/correctness"]:.0f}/{100 * r["train/zero_variance_groups"]:.0f}' for r in train]


def _selection(workdir: pathlib.Path, arm: str) -> str:
  """What the arm's prompt selection kept, and its held-out figures at every eval step (greedy, and sampled
  pass@1 where it logged them)."""
  selection = json.loads((workdir / arm / 'prompt_selection.json').read_text())
  low, high = selection['fingerprint']['pass_rate']
  text = (f'{len(selection["kept"])} of {len(selection["pass_rates"])} candidates kept (pass rate in '
          f'[{low:g}, {high:g}]), {sum(r > 0 for r in selection["pass_rates"].values())} with a correct rollout')
  rows = [r for r in sweep.read_metrics(workdir / arm) if 'eval/correctness' in r]
  text += '; held-out greedy ' + ' → '.join(f'{100 * r["eval/correctness"]:.1f}% (step {r["step"]})' for r in rows)
  sampled = [r['eval/sampled/correctness'] for r in rows if 'eval/sampled/correctness' in r]
  if sampled:
    text += '; sampled pass@1 ' + ' → '.join(f'{100 * v:.1f}%' for v in sampled)
  return text


def report(workdir: pathlib.Path, overrides: list[str], seconds: float) -> str:
  results = paper_report.from_workdir(workdir)
  finding = next(f for f in results['findings'] if f['title'].startswith('Cold start'))
  stats = json.loads((workdir / 'rejection_sampling' / 'rs_stats.json').read_text())
  pct = lambda v: f'{100 * v:.1f}'
  lines = [
      '# Cold start: RLOO on NL2SQL from the base model vs after rejection-sampled SFT', '',
      f'Written by `python experiments/cold_start.py{"".join(" --override=" + o for o in overrides)}`: '
      f'`{CONFIG}`, seed {results.get("seed", 0)}; {seconds / 60:.1f} min on this machine (this invocation; '
      f'about 0 if it only re-read a finished run), {results["total_wall_s"] / 60:.1f} min of stage wall time.', '',
      '## The teacher\'s best-of-8 on the student\'s RS-only NL2SQL prompts', '',
      f'| group | prompts | pass@1 % | pass@{stats["fingerprint"]["samples_per_prompt"]} % | prompts with a kept trace | '
      'kept traces |', '|---|---|---|---|---|---|']
  lines += [f'| {key} | {g["prompts"]} | {pct(g["pass@1"])} | {pct(g["pass@N"])} | {g["prompts_with_kept_trace"]} | '
            f'{g["kept_traces"]} |' for key, g in stats['groups'].items()]
  lines += ['', '## RLOO on NL2SQL, three starting policies', '',
            '| ' + ' | '.join(finding['header']) + ' |', '|' + '---|' * len(finding['header'])]
  lines += ['| ' + ' | '.join(f'{v:.1f}' if isinstance(v, float) else str(v) for v in row) + ' |'
            for row in finding['rows']]
  lines += ['', 'RL-batch correctness / zero-variance groups (%) per step:', '']
  lines += [f'- `{arm}`: {" · ".join(_per_step(workdir, arm))}' for arm in ARMS if (workdir / arm).is_dir()]
  lines += ['', 'Prompt selection (k = 8 by the starting policy) and held-out NL2SQL at each eval step:', '']
  lines += [f'- `{arm}`: {_selection(workdir, arm)}' for arm in ARMS if (workdir / arm / 'stage_done.json').is_file()]
  lines += ['', f'Reproduced: **{"yes" if finding["reproduced"] else "no"}**. {finding["verdict"]}.', '']
  return '\n'.join(lines)


def main() -> None:
  sweep.run_and_report(__doc__, CONFIG, '/tmp/luckystar-cold-start', REPORT, report)


if __name__ == '__main__':
  main()
