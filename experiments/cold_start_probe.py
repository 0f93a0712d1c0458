"""Why RLOO after rejection-sampled SFT does not move held-out NL2SQL (issue 5, experiments/cold_start.md).

    python experiments/cold_start_probe.py --workdir=/tmp/luckystar-cold-start    # ~12 min on 2 CPU cores
    python experiments/cold_start_probe.py --workdir=W --policies=sft,nl2sql_from_sft,my_arm --samples=0

(with luckystar installed, `pip install -e .`, or PYTHONPATH=. from the repository root)

Reads a cold-start run (`experiments/cold_start_pipeline.py`, experiments/cold_start.py): the RLOO arm's config,
its held-out set (`engine.curriculum.reserve_eval`, drawn again from the same config) and its prompt selection
(`prompt_selection.json`). For each policy (a stage directory of the run) it prints, on the held-out set:
greedy correctness and format per question template, and greedy correctness split by *value coverage*:
whether every value the question names (a city, a category, a person) also occurs in one of the prompts RL
trains on. RL's reward can only reinforce a value some rollout writes; a held-out question naming a value
no RL prompt names needs the student to copy it out of the question. With `--samples=k` > 0 it also prints
the pass rate over k samples (at the run's sampling temperature) of the held-out questions of the templates
RL trains on, the figure RL optimises, which greedy decoding can hide.
"""

import argparse
import collections
import json
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import ml_collections

import luckystar
from luckystar import errors
from luckystar import tokenizer as tokenizer_lib
from luckystar.data.examples import Example
from luckystar.engine import evals as core
from luckystar.engine import curriculum
from luckystar.stages import rlvr

import cold_start_data  # noqa: F401  (registers the prompt sources a run's config.rlvr.sources may name)

ARM = 'nl2sql_from_sft'


def template(example: Example) -> str:
  """'<domain> <template index>', e.g. 'sales 3' (nl2sql.TEMPLATES, counted within the domain)."""
  return f'{example.meta["db_id"].rsplit("_", 1)[0]} {example.meta["template"]}'


def covered(example: Example, rl_values: set[str]) -> bool:
  """Whether every value `example` names is named by some RL prompt too."""
  return all(value in rl_values for value in example.meta['values'])


COVERAGE = {True: 'values named by an RL prompt', False: 'a value no RL prompt names'}   # `covered` → row label


def table(rows: Iterable[tuple[str, Sequence[bool], Sequence[bool]]]) -> list[str]:
  """Markdown rows 'group | questions | correct | format_ok' from (group, corrects, format_oks)."""
  return [f'| {group} | {len(right)} | {sum(right)} | {sum(ok)} |' for group, right, ok in rows]


def grouped(pairs: Iterable[tuple[str, Any]]) -> dict[str, tuple[list[bool], list[bool]]]:
  """(group, verdict) pairs → group → (corrects, format_oks)."""
  groups = collections.defaultdict(lambda: ([], []))
  for key, verdict in pairs:
    groups[key][0].append(bool(verdict.correct))
    groups[key][1].append(bool(verdict.format_ok))
  return groups


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--workdir', required=True, help='an experiments/cold_start_pipeline.py run')
  parser.add_argument('--policies', default=f'sft,{ARM}', help='stage directories of the run, comma-separated')
  parser.add_argument('--samples', type=int, default=16, help='samples per question for the pass rate; 0: skip')
  args = parser.parse_args()
  workdir = pathlib.Path(args.workdir)
  config_path, selection_path = workdir / ARM / 'config.json', workdir / ARM / curriculum.SELECTION_FILE
  for path in (config_path, selection_path):
    if not path.is_file():
      raise SystemExit(f'{path}: not found; run experiments/cold_start.py --workdir={workdir} first')
  config = ml_collections.ConfigDict(json.loads(config_path.read_text()))
  if 'sources' not in config.rlvr:   # a run from before the key: its tasks' bundled suites
    config.rlvr.sources = ','.join(f'bundled:{task}' for task in config.rlvr.tasks)
  if config.rlvr.eval_split != 'train':
    raise SystemExit(f'{config_path}: config.rlvr.eval_split={config.rlvr.eval_split!r}; this probe reads the '
                     "cold start's reserved held-out set (eval_split='train')")
  tokenizer = tokenizer_lib.default()
  heldout, pool = curriculum.reserve_eval(config, tokenizer, curriculum.prompt_pool(config.rlvr, 'train', tokenizer,
                                                                        seed=config.seed)[0])
  kept = set(json.loads(selection_path.read_text())['kept'])
  selected = [e for e in pool if e.id in kept]
  rl_values = {value for e in selected for value in e.meta['values']}
  rl_templates = {template(e) for e in selected}
  print(f'{len(heldout)} held-out questions; RL trains on {len(selected)} prompts of templates '
        f'{sorted(rl_templates)}, naming {len(rl_values)} distinct values')
  questions = [e for e in heldout if template(e) in rl_templates]       # the held-out questions RL could reach
  coverage = {e.id: COVERAGE[covered(e, rl_values)] for e in questions}
  greedy = rlvr.eval_settings(config)
  for name in args.policies.split(','):
    policy = luckystar.load(str(workdir / name))
    results = core.run_examples(policy.config, policy.params, tokenizer, heldout, 'reasoning', greedy)
    by_template = grouped((template(e), v) for e, _, v in results)
    by_coverage = grouped((coverage[e.id], v) for e, _, v in results if e.id in coverage)
    print(f'\n### {name}: greedy, {sum(bool(v.correct) for _, _, v in results)} of {len(results)} correct\n')
    print('| template (* RL trains on it) | questions | correct | format_ok |\n|---|---|---|---|')
    print('\n'.join(table((f'{key}{" *" if key in rl_templates else ""}', *groups)
                          for key, groups in sorted(by_template.items()))))
    print('\n| held-out questions of RL\'s templates | questions | correct | format_ok |\n|---|---|---|---|')
    print('\n'.join(table((key, *by_coverage[key]) for key in COVERAGE.values())))
    if args.samples:
      rates = curriculum.pass_rates(config, policy.config, policy.params, tokenizer, questions, args.samples,
                                    jax.random.key(config.seed + 1), options=rlvr.rollout_options(config),
                                    desc=f'{name}: pass rates')
      print(f'\npass rate at k = {args.samples}, temperature {config.sampling.temperature}, held-out questions of '
            'RL\'s templates:\n\n| held-out questions of RL\'s templates | questions | mean pass rate % | '
            'with a correct sample |\n|---|---|---|---|')
      for key in COVERAGE.values():
        values = [rates[e.id] for e in questions if coverage[e.id] == key]
        print(f'| {key} | {len(values)} | {100 * sum(values) / max(len(values), 1):.1f} | '
              f'{sum(v > 0 for v in values)} |')


if __name__ == '__main__':
  try:
    main()
  except errors.UserError as error:
    raise SystemExit(f'error: {error}') from None
