"""What RLVR could sharpen: per-prompt pass rates of the starting policy on the main job's held-out set.

    PYTHONPATH=. python experiments/rl_headroom.py --workdir=/tmp/luckystar-rlvr          # tiny-sft, tiny-rlvr
    PYTHONPATH=. python experiments/rl_headroom.py --workdir=DIR --models=tiny-sft,DIR

RL on verifiable rewards mostly sharpens: it moves probability towards answers the policy already
samples. A held-out prompt that greedy decoding gets wrong can only turn right after a short run if
some of its samples are right. So for each model this measures, on the main job's held-out set (the
same 200 prompts `configs/rlvr.py` evaluates: its cached prompt selection in WORKDIR, then
`engine.curriculum.eval_examples`), the greedy verdict and the pass rate over `--samples` draws at the RL sampling
settings, and reports per task: the histogram of pass counts among greedy-wrong and greedy-right
prompts, the *headroom* (expected correct answers among the greedy-wrong prompts, Σ pass rate) and
the *risk* (expected wrong answers among the greedy-right ones, Σ (1 − pass rate)), and how greedy
verdicts moved from the first model to the last. Writes experiments/rl_headroom.md and prints it.
About 3 minutes per model on 2 CPU cores.
"""

import argparse
import collections
import dataclasses
import pathlib
import sys

import jax
import numpy as np

from luckystar import api
from luckystar import config as config_lib
from luckystar.engine import evals
from luckystar.engine import curriculum
from luckystar.stages import rlvr

REPORT = pathlib.Path(__file__).resolve().parent / 'rl_headroom.md'


def heldout_set(config, workdir: pathlib.Path, start: api.Model) -> list:
  """The main job's held-out prompts: its prompt selection (cached in `workdir`, made there if absent)
  fixes the task/language mix."""
  settings = config.rlvr
  pool, _ = curriculum.prompt_pool(settings, 'train', start.tokenizer, seed=config.seed)
  selected = curriculum.select_prompts(config, workdir, start.config, start.params, start.tokenizer, pool,
                                       rlvr.rollout_options(config))
  heldout = curriculum.prompt_pool(settings, 'heldout', start.tokenizer, seed=config.seed)[0]
  return curriculum.eval_examples(selected, heldout, settings.eval_prompts, config.seed)


def measure(config, model: api.Model, examples: list, samples: int, seed: int) -> dict[str, tuple[bool, float]]:
  """example id → (greedy correct, pass rate over `samples` draws at `config.sampling`)."""
  greedy = evals.run_examples(model.config, model.params, model.tokenizer, examples, 'reasoning',
                                   dataclasses.replace(rlvr.eval_settings(config), seed=seed))
  rates = curriculum.pass_rates(config, model.config, model.params, model.tokenizer, examples, samples,
                                jax.random.key(seed), options=rlvr.rollout_options(config))
  return {example.id: (bool(verdict.correct), rates[example.id]) for example, _, verdict in greedy}


def headroom(verdicts) -> float:
  """Expected right answers among the greedy-wrong prompts: Σ pass rate over (greedy correct, rate) pairs."""
  return sum(rate for correct, rate in verdicts if not correct)


def report(examples: list, results: dict[str, dict], samples: int, command: str) -> str:
  names = list(results)
  groups = {'all': examples} | {task: [e for e in examples if e.task == task]
                                for task in sorted({e.task for e in examples})}
  lines = ['# RL headroom: what the starting policy already samples on the held-out set', '',
           f'Written by `{command}`: {len(examples)} held-out prompts of the main job (`configs/rlvr.py`), '
           f'reasoning mode; greedy verdicts, and pass rates over {samples} draws at the RL sampling settings.', '',
           '| model | task | prompts | greedy correct | sampled pass@1 | greedy-wrong with a right sample | '
           'headroom Σ p (greedy-wrong) | risk Σ (1 − p) (greedy-right) |', '|---|---|---|---|---|---|---|---|']
  for name in names:
    for task, members in groups.items():
      verdicts = [results[name][e.id] for e in members]
      right = sum(g for g, _ in verdicts)
      reachable = sum(1 for g, p in verdicts if not g and p > 0)
      lines.append(f'| {name} | {task} | {len(members)} | {right} ({100 * right / len(members):.1f}%) | '
                   f'{100 * np.mean([p for _, p in verdicts]):.1f}% | {reachable} | {headroom(verdicts):.2f} | '
                   f'{sum(1 - p for g, p in verdicts if g):.2f} |')
  first = names[0]
  lines += ['', f'**{first}: prompts by right samples out of {samples}**, greedy-wrong / greedy-right:', '',
            '| task | ' + ' | '.join(str(k) for k in range(samples + 1)) + ' |', '|---|' + '---|' * (samples + 1)]
  for task, members in groups.items():
    counts = collections.Counter((results[first][e.id][0], round(results[first][e.id][1] * samples)) for e in members)
    lines.append(f'| {task} | ' + ' | '.join(f'{counts[False, k]} / {counts[True, k]}' for k in range(samples + 1))
                 + ' |')
  if len(names) > 1:
    last = names[-1]
    lines += ['', f'**Greedy verdicts, {first} → {last}**:', '',
              f'| task | wrong → right | right → wrong | {first}\'s headroom of the prompts that turned right | '
              f'Σ p over {first}\'s greedy-wrong prompts, {first} → {last} |', '|---|---|---|---|---|']
    for task, members in groups.items():
      wrong = [e for e in members if not results[first][e.id][0]]
      turned = [e for e in wrong if results[last][e.id][0]]
      lost = sum(1 for e in members if results[first][e.id][0] and not results[last][e.id][0])
      before = headroom(results[first][e.id] for e in wrong)
      after = sum(results[last][e.id][1] for e in wrong)
      lines.append(f'| {task} | {len(turned)} | {lost} | {headroom(results[first][e.id] for e in turned):.2f} | '
                   f'{before:.2f} → {after:.2f} |')
  lines += ['', 'Reading: RL that sharpens the starting policy can turn a greedy-wrong prompt right only where its '
            'samples are sometimes right, so the headroom bounds what sharpening alone adds to greedy correctness '
            '(in expected prompts), and the risk is what it can lose; a gain beyond the headroom needs the policy '
            'to learn answers it does not sample yet.']
  return '\n'.join(lines) + '\n'


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--config', default='configs/rlvr.py')
  parser.add_argument('--workdir', default='/tmp/luckystar-rlvr', help="an RLVR run's workdir (its prompt selection)")
  parser.add_argument('--models', default='tiny-sft,tiny-rlvr', help='bundled names or checkpoint paths; the first '
                      'is the starting policy')
  parser.add_argument('--samples', type=int, default=8)
  parser.add_argument('--seed', type=int, default=1)
  args = parser.parse_args()
  config = config_lib.from_file(args.config)
  names = args.models.split(',')
  models = {name: api.load(name) for name in names}
  examples = heldout_set(config, pathlib.Path(args.workdir), models[names[0]])
  results = {name: measure(config, model, examples, args.samples, args.seed) for name, model in models.items()}
  text = report(examples, results, args.samples, 'python experiments/rl_headroom.py ' + ' '.join(sys.argv[1:]))
  REPORT.write_text(text)
  print(text)


if __name__ == '__main__':
  main()
