"""RLVR's curriculum: which prompts RL trains on and which it is evaluated on (docs/rl.md#prompt-selection).

The RL prompt pool (`config.rlvr.sources`: a bundled suite's train split minus the rejection-sampling prompts,
every record of a file source), prompt selection by the starting policy (pass rate at k samples within
`config.rlvr.select_pass_rate`, cached in `workdir/prompt_selection.json`), and the held-out eval set with the
RL prompts' task/language mix (`eval_split='train'`: reserved out of the pool before selection). The stage
(`stages.rlvr`) is the method; it calls these with its own rollout options.
"""

import pathlib
from typing import Any, Mapping, Sequence

from absl import logging
import jax
import numpy as np

from luckystar import errors
from luckystar import model
from luckystar.data import sources, suites
from luckystar.data.examples import Example, rs_only
from luckystar.engine import artifacts, prompts, rollouts, streams
from luckystar.tasks import TASKS
from luckystar.tokenizer import Tokenizer

SELECTION_FILE = 'prompt_selection.json'
SOURCES_KEY = 'config.rlvr.sources'
EVAL_SPLITS = ('heldout', 'train')


def eval_split(config) -> str:
  """`config.rlvr.eval_split`, or a config error naming the key."""
  value = config.rlvr.eval_split
  if value not in EVAL_SPLITS:
    raise errors.UserError(f'config.rlvr.eval_split={value!r}; expected one of {EVAL_SPLITS}')
  return value


def prompts_and_eval_set(config, workdir: pathlib.Path, model_config: model.ModelConfig, params: Any,
                         tokenizer: Tokenizer, options: Mapping[str, Any]) -> tuple[list[Example], list[Example]]:
  """(the RL prompts, the held-out eval set) of a run, with `workdir/data_report.json` written. The eval sources
  are read, and `eval_prompts` capped at what they hold, before any rollout; `options` are the stage's rollout
  settings, reward and judge, which prompt selection samples with."""
  settings = config.rlvr
  pool, reports = prompt_pool(settings, 'train', tokenizer, seed=config.seed)
  heldout = None
  if eval_split(config) == 'train':
    heldout, pool = reserve_eval(config, tokenizer, pool)
  else:
    candidates = eval_pool(config, tokenizer, pool)
    count = eval_size(config, settings.eval_prompts, pool, candidates)
  selected = select_prompts(config, workdir, model_config, params, tokenizer, pool, options)
  if heldout is None:  # the held-out split: the RL prompts' (task, language) mix
    count = eval_size(config, count, selected, candidates)   # selection may have kept fewer groups
    heldout = eval_examples(selected, candidates, count, config.seed)
  artifacts.write_data_report(workdir, reports, train=[e.prompt for e in pool], evaluated=[e.prompt for e in heldout])
  return selected, heldout


# ---- the RL prompts --------------------------------------------------------------------------------------

def tasks(settings: Any) -> list[str]:
  """The tasks of the bundled suites among `settings.sources`, in order."""
  return [s.location for s in sources.parse(settings.sources, key=SOURCES_KEY, formats=sources.PROMPT_FORMATS)
          if s.format == 'bundled' and s.location in TASKS]


def prompt_pool(settings: Any, split: str, tokenizer: Tokenizer, *, seed: int
                ) -> tuple[list[Example], list[sources.Report]]:
  """RL prompts of `settings.sources` in `split` (`prompts.from_sources`) whose reasoning-mode prompt fits
  `settings.max_prompt_tokens`, with a report per source. Train: a bundled suite's train split minus the
  rejection-sampling prompts (`rs_only`), a registered prompt set, every record of a file. Held-out: the sources
  of `settings.eval_sources` when set, else the held-out split of the bundled suites."""
  spec, key = settings.sources, SOURCES_KEY
  if split != 'train':
    spec, key = settings.get('eval_sources') or ','.join(f'bundled:{task}' for task in tasks(settings)), \
        'config.rlvr.eval_sources'
  keep = (lambda e: not rs_only(e, seed)) if split == 'train' else None
  return prompts.from_sources(spec, key=key, split=split, seed=seed, tokenizer=tokenizer, where=keep,
                              max_prompt_tokens=settings.max_prompt_tokens)


def _fingerprint(config, tokenizer: Tokenizer) -> dict:
  """What prompt selection depends on; a cached selection with another fingerprint is stale."""
  settings = config.rlvr
  fingerprint = {'init_from': config.init_from, 'tokenizer': tokenizer.fingerprint, 'seed': config.seed,
                 'sources': sources.fingerprint(sources.parse(settings.sources, key=SOURCES_KEY)),
                 'max_prompt_tokens': settings.max_prompt_tokens,
                 'selection_prompts': artifacts.plain(settings.selection_prompts),
                 'selection_samples': settings.selection_samples, 'pass_rate': list(settings.select_pass_rate),
                 'sampling': dict(config.sampling)}
  if settings.eval_split == 'train':  # the eval set is reserved out of the pool first (`reserve_eval`)
    fingerprint |= {'eval_split': 'train', 'eval_prompts': settings.eval_prompts}
  return fingerprint


def selection_candidates(pool: Sequence[Example], selection_prompts: int | Mapping[str, int], seed: int
                         ) -> list[Example]:
  """The seeded sample of the pool that prompt selection measures, in pool order: `selection_prompts`
  prompts of the whole pool, or, when it maps task → count, that many of each task (a task whose
  pass rates are rarely in range costs rollouts and keeps few prompts, so the budget is set per task).
  A task of the dict that the pool lacks is skipped (one log line): one dict serves any choice of sources."""
  rng = np.random.default_rng([seed, streams.RLVR_SELECTION])
  if not hasattr(selection_prompts, 'items'):
    return [pool[i] for i in sorted(rng.permutation(len(pool))[:selection_prompts])]
  present = {e.task for e in pool}
  if not present & set(selection_prompts):
    raise errors.UserError(
        f'config.rlvr.selection_prompts names tasks {sorted(selection_prompts)}, but the prompts of '
        f'config.rlvr.sources (those that fit max_prompt_tokens) are of tasks {sorted(present)} only; give one of '
        f'them a count in the config file\'s selection_prompts (task → candidates, docs/data.md)')
  if absent := sorted(set(selection_prompts) - present):
    measured = {task: count for task, count in sorted(selection_prompts.items()) if task in present}
    logging.info('prompt selection: config.rlvr.selection_prompts names tasks %s that config.rlvr.sources does '
                 'not have; measuring %s', absent, measured)
  chosen = []
  for task, count in sorted(selection_prompts.items()):
    if task not in present:
      continue
    members = [i for i, e in enumerate(pool) if e.task == task]
    chosen += [members[j] for j in rng.permutation(len(members))[:count]]
  return [pool[i] for i in sorted(chosen)]


def pass_rates(config, model_config: model.ModelConfig, params: Any, tokenizer: Tokenizer,
               examples: Sequence[Example], samples: int, rng: jax.Array, *, options: Mapping[str, Any],
               desc: str = 'pass rates'
               ) -> dict[str, float]:
  """Example id → fraction of `samples` rollouts drawn with `options` (`generate_and_score`'s settings, reward
  and judge: the stage's) whose verdict is correct, in batches of about `config.rlvr.selection_batch` rollouts."""
  groups = rollouts.sample_groups(model_config, params, tokenizer, examples, rng,
                                  batch_rows=config.rlvr.selection_batch,
                                  samples_per_prompt=samples, desc=desc, **options)
  return {e.id: float(np.mean([bool(s.verdict.correct) for s in group])) for e, _, group in groups}


def select_prompts(config, workdir: pathlib.Path, model_config: model.ModelConfig, params: Any,
                   tokenizer: Tokenizer, pool: Sequence[Example], options: Mapping[str, Any]) -> list[Example]:
  """Prompts whose pass rate under the starting policy lies in `config.rlvr.select_pass_rate`
  ([1/8, 7/8] at k = 8, docs/rl.md), measured once on a seeded sample of the pool
  (`selection_candidates`) with the stage's rollout `options`, and kept in `workdir/prompt_selection.json`."""
  settings = config.rlvr
  by_id = {e.id: e for e in pool}
  low, high = settings.select_pass_rate

  def build():
    candidates = selection_candidates(pool, settings.selection_prompts, config.seed)
    rates = pass_rates(config, model_config, params, tokenizer, candidates, settings.selection_samples,
                       jax.random.key(config.seed), options=options, desc='prompt selection')
    kept = [e.id for e in candidates if low <= rates[e.id] <= high]
    summary = {f'{task}/{lang}': {'candidates': sum(1 for e in candidates if (e.task, e.language) == (task, lang)),
                                  'kept': sum(1 for i in kept if (by_id[i].task, by_id[i].language) == (task, lang))}
               for task, lang in sorted({(e.task, e.language) for e in candidates})}
    logging.info('prompt selection: kept %d of %d prompts with pass rate in [%g, %g]: %s', len(kept),
                 len(candidates), low, high, summary)
    return {'pass_rates': rates, 'kept': kept, 'summary': summary}, {}

  record = artifacts.load_or_build(workdir, SELECTION_FILE, _fingerprint(config, tokenizer), build,
                                   what='prompt selection')
  if not record['kept']:
    raise errors.UserError(
        f'prompt selection kept no prompt: none of {len(record["pass_rates"])} had a pass rate in [{low}, {high}] '
        f'under {config.init_from!r} (see {workdir / SELECTION_FILE}); start from a stronger policy '
        f'(config.init_from), widen config.rlvr.select_pass_rate, or choose other config.rlvr.sources')
  return [by_id[i] for i in record['kept']]


# ---- the held-out eval set ------------------------------------------------------------------------------

def eval_pool(config, tokenizer: Tokenizer, pool: Sequence[Example]) -> list[Example]:
  """Where the held-out eval draws from (`config.rlvr.eval_split`). 'heldout': the held-out split (for
  NL2SQL, databases no training split has). 'train': new questions over the training databases, i.e.
  bundled suites' train prompts (`pool`, RS prompts already out) whose gold answer no RS prompt has (the
  three training databases per domain share one wording, so a question text repeats over them with the same
  gold SQL); `reserve_eval` draws the eval set from them before prompt selection and takes it out of RL's pool."""
  settings = config.rlvr
  if eval_split(config) == 'heldout':
    return prompt_pool(settings, 'heldout', tokenizer, seed=config.seed)[0]
  rs = prompts.prompt_set(tasks(settings), 'train', seed=config.seed, where=lambda e: rs_only(e, config.seed),
                          tokenizer=tokenizer)
  rs_answers = {(e.task, e.answer) for e in rs}
  bundled = {e.id for task in tasks(settings)
             for e in suites.load(task, 'train', seed=config.seed, tokenizer=tokenizer)}
  return [e for e in pool if (e.task, e.answer) not in rs_answers and e.id in bundled]


def reserve_eval(config, tokenizer: Tokenizer, pool: Sequence[Example]
                 ) -> tuple[list[Example], list[Example]]:
  """eval_split='train': (the eval set, RL's pool without it). The eval set is drawn first, with the pool's
  (task, language) mix (`eval_examples`), and every pool prompt that shares a gold answer with it leaves the
  pool; prompt selection can then measure all the rest (drawn after selection, the eval set would take prompts
  selection could have measured)."""
  candidates = eval_pool(config, tokenizer, pool)
  count = eval_size(config, config.rlvr.eval_prompts, pool, candidates)
  heldout = eval_examples(pool, candidates, count, config.seed)
  taken = {(e.task, e.answer) for e in heldout}
  return heldout, [e for e in pool if (e.task, e.answer) not in taken]


def eval_size(config, count: int, rl_prompts: Sequence[Example], heldout: Sequence[Example]) -> int:
  """`count` held-out prompts, or as many as `heldout` holds of `rl_prompts`' (task, language) groups when that
  is fewer (one log line; none is a config error). `run` asks before prompt selection with the whole RL pool,
  so that a short eval source costs no rollouts, and again with the selected prompts (`eval_examples`)."""
  groups = {(e.task, e.language) for e in rl_prompts}
  available = sum((e.task, e.language) in groups for e in heldout)
  if eval_split(config) == 'train':
    where = "eval_split='train' (the bundled train questions no RS prompt shares)"
  else:
    where = f'config.rlvr.eval_sources={config.rlvr.eval_sources!r}' if config.rlvr.get('eval_sources') else \
        'the held-out split of the bundled suites'
  if not available:
    raise errors.UserError(f'config.rlvr.eval_prompts: {where} has no prompt of the RL prompts\' tasks and languages '
                           f'{sorted(groups)}; name eval sources of those tasks in config.rlvr.eval_sources')
  if available < count:
    logging.warning('config.rlvr.eval_prompts: %d held-out prompts wanted, but %s has %d of the RL prompts\' '
                    'tasks and languages: evaluating on those %d', count, where, available, available)
  return min(count, available)


def eval_examples(selected: Sequence[Example], heldout: Sequence[Example], count: int, seed: int) -> list[Example]:
  """`count` held-out prompts with the (task, language) mix of `selected` (`allocate`: a group with too
  few held-out prompts gives its share to the others), fixed by `seed`; disjoint from RL and RS prompts,
  which come from the train split."""
  groups = {}
  for example in heldout:
    groups.setdefault((example.task, example.language), []).append(example)
  mix = {key: sum(1 for e in selected if (e.task, e.language) == key) for key in groups}
  available = sum(len(groups[key]) for key, n in mix.items() if n)
  if available < count:
    raise errors.UserError(f'config.rlvr.eval_prompts={count}, but the held-out split has only {available} '
                           'prompts of the selected prompts\' tasks and languages')
  counts = allocate(count, mix, {key: len(members) for key, members in groups.items()})
  rng = np.random.default_rng([seed, streams.RLVR_EVAL])
  chosen = []
  for key in sorted(groups):
    members = groups[key]
    chosen += [members[i] for i in sorted(rng.permutation(len(members))[:counts[key]])]
  return chosen


def allocate(count: int, weights: Mapping[Any, float], capacity: Mapping[Any, int]) -> dict[Any, int]:
  """Integer counts summing to `count`, proportional to `weights` but at most `capacity` each: a group
  that would get more than it holds gets all of it and the rest is shared out again among the others
  in proportion (then largest remainder; ties go to the earlier key). Groups of weight 0 get none."""
  open_keys = [key for key, weight in weights.items() if weight > 0]
  fixed, quotas = {}, {}
  while open_keys:
    left, total = count - sum(fixed.values()), sum(weights[key] for key in open_keys)
    quotas = {key: left * weights[key] / total for key in open_keys}
    full = [key for key in open_keys if quotas[key] >= capacity[key]]
    if not full:
      break
    fixed.update({key: capacity[key] for key in full})
    open_keys = [key for key in open_keys if key not in full]
    quotas = {}
  counts = {key: 0 for key in weights} | fixed | {key: int(q) for key, q in quotas.items()}
  for key in sorted(quotas, key=lambda k: counts[k] - quotas[k])[:count - sum(counts.values())]:
    counts[key] += 1
  return counts
