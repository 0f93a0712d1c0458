"""RLVR with RLOO (docs/rl.md, paper §2.4; Ahmadian et al. 2024): the method's math.

k rollouts per prompt are scored by the verifiers (reward = correctness − penalty·language mismatch).
Overlong rollouts are dropped: out of the baseline and out of the loss. Each survivor's baseline is
the mean reward of the *other* survivors of its prompt; a group with fewer than two survivors has no
baseline and contributes nothing. Other estimators by name: `config.rlvr.advantage`
(`engine.advantages.ESTIMATORS`: rloo, grpo, dr_grpo, reinforce_pp). The loss is the token-level policy
gradient over model-generated tokens, with logits divided by the sampling temperature; optional PPO-style
ratio clipping (for several updates per batch; asymmetric, DAPO's clip-higher, with clip_low / clip_high)
and an optional KL estimate to a reference (k3 by default; `KL_ESTIMATORS`).

    python -m luckystar.main --config=configs/rlvr.py --workdir=runs/rlvr

The stage (`run`): the RL prompt pool (`config.rlvr.sources`: the train split of bundled suites minus the prompts
kept for rejection sampling, `examples.rs_only`, and every record of a file source), prompt selection by the starting policy (pass rate at
k samples within `config.rlvr.select_pass_rate`, cached in `workdir/prompt_selection.json`), a
held-out eval set with the same task/language mix (`eval_split='train'`: reserved out of the pool before
selection, `reserve_eval`), then the shared training loop with rollouts drawn by the current policy at
every step.
"""

import dataclasses
import functools
import pathlib
import time
from typing import Any, Mapping, Sequence

from absl import logging
import grain
import jax
import jax.numpy as jnp
import numpy as np

from luckystar import distributed
from luckystar import errors
from luckystar import model
from luckystar.data import pipeline, sources, suites
from luckystar.data.examples import TASKS, Example, rs_only
from luckystar.engine import advantages as advantages_lib
from luckystar.engine import artifacts, evals, judging, logprobs, loop, optim, prompts, rollouts
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib
from luckystar.model import sharding
from luckystar.rewards import terms
from luckystar.tokenizer import Tokenizer

NORMALIZATIONS = ('tokens', 'sequences')
# What the run shows (`loop.run_training`): the batch's reward and correctness as it trains; held-out
# correctness (greedy, then sampled) and Korean→English mismatch before → after.
PROGRESS_KEYS = ('train/reward', 'train/correctness')
SUMMARY_KEYS = ('eval/correctness', 'eval/language_mismatch', 'eval/sampled/correctness')


def zero_variance_groups(rewards: jax.Array, survived: jax.Array) -> jax.Array:
  """[prompts] bool: groups whose survivors (≥ 2 of them) all earned the same reward — no signal."""
  survived = jnp.asarray(survived, bool)
  rewards = jnp.asarray(rewards, jnp.float32)
  high = jnp.where(survived, rewards, -jnp.inf).max(-1)
  low = jnp.where(survived, rewards, jnp.inf).min(-1)
  return (survived.sum(-1) >= 2) & (high == low)



# How `loss_fn`'s aux entries combine over micro-batches (`step.accumulate_gradients`): token means by their
# tokens, counts summed; the loss by the denominator (`normalize`).
AUX_WEIGHTS = {'kl': 'tokens', 'ratio': 'tokens', 'clip_fraction': 'tokens', 'entropy': 'sampled_tokens',
               'tokens': None, 'sequences': None, 'sampled_tokens': None}


# KL to the reference per token, of log_ratio = log π_ref − log π on tokens sampled from π (Schulman 2020,
# "Approximating KL divergence"): k1 = log π − log π_ref, unbiased; k2 = ½·log_ratio², low variance, biased;
# k3 = e^log_ratio − log_ratio − 1, unbiased, ≥ 0 and low variance (the default; verl's low_var_kl).
KL_ESTIMATORS = {
    'k1': lambda log_ratio: -log_ratio,
    'k2': lambda log_ratio: 0.5 * log_ratio ** 2,
    'k3': lambda log_ratio: jnp.exp(log_ratio) - log_ratio - 1.0,
}


def clip_bounds(clip_epsilon: float, clip_low: float | None = None, clip_high: float | None = None
                ) -> tuple[float | None, float | None]:
  """The ratio's clip range (1 − ε_low, 1 + ε_high); each ε is clip_low / clip_high, or clip_epsilon where that
  is None (unset), and an ε of 0 leaves its side unclipped (None), as clip_epsilon = 0 clips neither."""
  low = clip_epsilon if clip_low is None else clip_low
  high = clip_epsilon if clip_high is None else clip_high
  return (1 - low if low > 0 else None), (1 + high if high > 0 else None)


def loss_fn(params: Any, batch: Mapping[str, jax.Array], rng: jax.Array | None, *, model_config: model.ModelConfig,
            temperature: float = 1.0, clip_epsilon: float = 0.0, clip_low: float | None = None,
            clip_high: float | None = None, kl_beta: float = 0.0, kl_estimator: str = 'k3',
            normalize: str = 'tokens') -> tuple[jax.Array, dict[str, jax.Array]]:
  """The policy-gradient loss over model-generated tokens (docs/rl.md#policy-loss-options).

  batch: tokens, positions, segment_ids, loss_mask [B, T] int (loss_mask 1 on tokens the policy
  generated; prompt and tool-result tokens 0); advantages [B] float; used [B] (0 for dropped rows and
  groups without a baseline); old_logprobs [B, T] float (the sampler's untruncated log-prob of token t,
  at the sampling temperature); ref_logprobs [B, T] when kl_beta > 0; optionally score_columns [B, M]
  (`training_batch` adds them: the same loss, projected onto the vocabulary at generated tokens only).
  Per token: −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A) with ρ = π/π_old (`clip_bounds`: ε = 0 leaves a side
  unclipped; on-policy ρ = 1 and the gradient is A·∇log π), plus kl_beta · KL_ESTIMATORS[kl_estimator].
  normalize: 'tokens' (Σ over every token / token count) or 'sequences' (each row's token mean, then
  the mean over rows). aux[normalize] is the denominator: `step.accumulate_gradients` weights each
  micro-batch by it, so 'tokens' is Σ / token count over the whole global batch however it is split,
  which is DAPO's token-level mean (Yu et al. 2025).
  """
  del rng  # deterministic
  if normalize not in NORMALIZATIONS:
    raise ValueError(f'normalize={normalize!r}; expected one of {NORMALIZATIONS}')
  if kl_estimator not in KL_ESTIMATORS:
    raise ValueError(f'kl_estimator={kl_estimator!r}; expected one of {tuple(KL_ESTIMATORS)}')
  low, high = clip_bounds(clip_epsilon, clip_low, clip_high)
  policy_logprobs, entropy = logprobs.token_logprobs(model_config, params, batch, temperature)
  rows = batch['used'].astype(jnp.float32)                                    # [B]
  generated = logprobs.next_tokens(batch, batch['loss_mask']).astype(jnp.float32)      # every sampled token, used rows or not
  mask = generated * rows[:, None]
  advantages = batch['advantages'].astype(jnp.float32)[:, None]
  ratio = jnp.exp(policy_logprobs - jax.lax.stop_gradient(logprobs.next_tokens(batch, batch['old_logprobs'])))
  objective = ratio * advantages
  if low is not None or high is not None:
    objective = jnp.minimum(objective, jnp.clip(ratio, low, high) * advantages)
  per_token = -objective
  kl = jnp.zeros_like(policy_logprobs)
  if kl_beta > 0:
    log_ratio = logprobs.next_tokens(batch, batch['ref_logprobs']) - policy_logprobs
    kl = KL_ESTIMATORS[kl_estimator](log_ratio)
    per_token = per_token + kl_beta * kl
  tokens = mask.sum()
  sequences = (mask.sum(-1) > 0).sum().astype(jnp.float32)
  if normalize == 'tokens':
    weights = mask / jnp.maximum(tokens, 1.0)
  else:
    weights = mask / jnp.maximum(mask.sum(-1, keepdims=True), 1.0) / jnp.maximum(sequences, 1.0)
  loss = (per_token * weights).sum()
  mean = lambda x: (x * mask).sum() / jnp.maximum(tokens, 1.0)
  clipped = jnp.zeros_like(ratio, bool)   # the ratio outside the clip range, whichever the advantage's sign
  if low is not None:
    clipped = clipped | (ratio < low)
  if high is not None:
    clipped = clipped | (ratio > high)
  aux = {'loss': loss, 'kl': mean(kl), 'entropy': (entropy * generated).sum() / jnp.maximum(generated.sum(), 1.0),
         'ratio': mean(ratio),
         'clip_fraction': mean(clipped.astype(jnp.float32)), 'tokens': tokens, 'sequences': sequences,
         'sampled_tokens': generated.sum()}
  return loss, aux


# ---- rollouts, scoring and the training batch ---------------------------------------------------


def training_batch(prompts: Sequence[Sequence[int]], groups: Sequence[Sequence[rollouts.Scored]], *,
                   length_multiple: int, score_multiple: int = logprobs.SCORE_COLUMN_MULTIPLE,
                   advantage: str = 'rloo') -> tuple[dict[str, np.ndarray], np.ndarray]:
  """The update's batch: one row per rollout, prompt + continuation, right-padded to a multiple of
  `length_multiple`, with score_columns at the generated tokens (their width rounded up to
  `score_multiple`: the sampling budget gives one width for every batch, so fewer compiles), and advantages
  by the estimator `advantages.ESTIMATORS[advantage]` over the whole batch's groups.
  Returns (batch, zero_variance [prompts]). See `loss_fn` for the fields."""
  rewards = np.array([[s.verdict.reward if s.survived else 0.0 for s in group] for group in groups], np.float32)
  survived = np.array([[s.survived for s in group] for group in groups])
  advantages, used = jax.device_get(advantages_lib.ESTIMATORS[advantage](rewards, survived))
  rows = [(prompts[g], s.rollout) for g, group in enumerate(groups) for s in group]
  length = -(-max(len(p) + len(r.token_ids) for p, r in rows) // length_multiple) * length_multiple
  batch = {name: np.zeros((len(rows), length), dtype) for name, dtype in (
      ('tokens', np.int32), ('positions', np.int32), ('segment_ids', np.int32), ('loss_mask', np.int32),
      ('old_logprobs', np.float32))}
  for b, (prompt, rollout) in enumerate(rows):
    n, total = len(prompt), len(prompt) + len(rollout.token_ids)
    batch['tokens'][b, :total] = np.concatenate([prompt, rollout.token_ids])
    batch['positions'][b, :total] = np.arange(total)
    batch['segment_ids'][b, :total] = 1
    batch['loss_mask'][b, n:total] = rollout.loss_mask
    batch['old_logprobs'][b, n:total] = rollout.untruncated_logprobs
  batch['advantages'] = np.asarray(advantages, np.float32).reshape(-1)
  batch['used'] = np.asarray(used, np.int32).reshape(-1)
  return logprobs.with_score_columns(batch, score_multiple), np.asarray(jax.device_get(zero_variance_groups(rewards, survived)))


def rollout_metrics(groups: Sequence[Sequence[rollouts.Scored]], zero_variance: np.ndarray, prefix: str = 'train'
                    ) -> dict:
  """docs/training.md's RL batch figures: reward, correctness, pass rate, Korean→English mismatch, response
  length, overlong fraction, zero-variance groups, unscorable rollouts."""
  flat = [s for group in groups for s in group]
  mean = evals.mean
  return {
      f'{prefix}/reward': mean([s.verdict.reward for s in flat if s.survived]),
      f'{prefix}/correctness': mean([bool(s.verdict.correct) for s in flat]),
      f'{prefix}/pass_rate': mean([mean([bool(s.verdict.correct) for s in group]) for group in groups]),
      f'{prefix}/language_mismatch': evals.korean_mismatch_rate([(s.example, s.rollout, s.verdict)
                                                                      for s in flat]),
      f'{prefix}/response_length': mean([int(s.rollout.loss_mask.sum()) for s in flat]),
      f'{prefix}/overlong_fraction': mean([s.rollout.overlong for s in flat]),
      f'{prefix}/zero_variance_groups': mean(zero_variance),
      f'{prefix}/unscorable': float(sum(s.verdict.correct is None for s in flat)),
  }


# ---- prompts --------------------------------------------------------------------------------------

SELECTION_FILE = 'prompt_selection.json'
SAMPLED_PREFIX = 'eval/sampled/'  # held-out figures of `eval_samples` draws per prompt at the sampling temperature


SOURCES_KEY = 'config.rlvr.sources'


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


def rollout_options(config, judge=None) -> dict[str, Any]:
  """`rollouts.generate_and_score`'s settings from the config; `judge` (`engine.judging.make`) decides what the
  rules cannot."""
  settings = config.rlvr
  return dict(sampling_settings=config.sampling, max_tool_turns=settings.max_tool_turns,
              max_tool_result_tokens=settings.max_tool_result_tokens, reward=reward_of(config), judge=judge)


def reward_of(config) -> terms.Reward:
  """The built reward (docs/rl.md#reward-terms): `config.rlvr.reward` with its `language_penalty` alias, the
  overlong drop, and the rollout budget `config.sampling.max_new_tokens` as overlong_soft's L_max."""
  settings = config.rlvr
  return terms.build(settings.reward, budget=config.sampling.max_new_tokens,
                     language_penalty=settings.get('language_penalty'), overlong_cache=settings.get('overlong_cache'),
                     drop_overlong=settings.drop_overlong)


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
  rng = np.random.default_rng([seed, 17])
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
               examples: Sequence[Example], samples: int, rng: jax.Array, desc: str = 'pass rates', judge=None
               ) -> dict[str, float]:
  """Example id → fraction of `samples` rollouts at the RL settings (`rollout_options`) whose verdict is
  correct, in batches of about `config.rlvr.selection_batch` rollouts."""
  groups = rollouts.sample_groups(model_config, params, tokenizer, examples, rng, batch_rows=config.rlvr.selection_batch,
                                  samples_per_prompt=samples, desc=desc, **rollout_options(config, judge))
  return {e.id: float(np.mean([bool(s.verdict.correct) for s in group])) for e, _, group in groups}


def select_prompts(config, workdir: pathlib.Path, model_config: model.ModelConfig, params: Any,
                   tokenizer: Tokenizer, pool: Sequence[Example], judge=None) -> list[Example]:
  """Prompts whose pass rate under the starting policy lies in `config.rlvr.select_pass_rate`
  ([1/8, 7/8] at k = 8, docs/rl.md), measured once on a seeded sample of the pool
  (`selection_candidates`) and kept in `workdir/prompt_selection.json`."""
  settings = config.rlvr
  by_id = {e.id: e for e in pool}
  low, high = settings.select_pass_rate

  def build():
    candidates = selection_candidates(pool, settings.selection_prompts, config.seed)
    rates = pass_rates(config, model_config, params, tokenizer, candidates, settings.selection_samples,
                       jax.random.key(config.seed), desc='prompt selection', judge=judge)
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


def eval_settings(config) -> evals.Settings:
  """The held-out evaluation's settings: greedy, in `config.rlvr.eval_modes`, with the RL tool limits."""
  settings = config.rlvr
  return evals.Settings(modes=tuple(settings.eval_modes), max_new_tokens=config.sampling.max_new_tokens,
                             max_tool_turns=settings.max_tool_turns,
                             max_tool_result_tokens=settings.max_tool_result_tokens,
                             batch_size=settings.eval_batch_size, seed=config.seed)


EVAL_SPLITS = ('heldout', 'train')
# The keys that name a choice, and their choices (numeric keys: `luckystar.config.DOMAINS`).
CHOICES = {'advantage': tuple(advantages_lib.ESTIMATORS), 'normalize': NORMALIZATIONS,
           'kl_estimator': tuple(KL_ESTIMATORS), 'eval_split': EVAL_SPLITS}


def check_choice(config, key: str) -> str:
  """`config.rlvr.<key>` of a CHOICES key, or a config error naming the key."""
  value = config.rlvr[key]
  if value not in CHOICES[key]:
    raise errors.UserError(f'config.rlvr.{key}={value!r}; expected one of {CHOICES[key]}')
  return value


def check_config(config) -> None:
  """The config errors `run` would otherwise meet only after prompt selection (minutes of rollouts)."""
  for key in CHOICES:
    check_choice(config, key)
  reward_of(config)   # an unknown term, a bad weight, a language_penalty conflict
  if not config.sampling.temperature > 0:   # the loss divides logits by it: 0 would make every update NaN (skipped)
    raise errors.UserError(f'config.sampling.temperature={config.sampling.temperature}: RLVR samples its '
                           'rollouts and scores them at this temperature, so it must be > 0')
  step_lib.check_rows(config.batch_size * config.rlvr.samples_per_prompt, sharding.make_mesh(dict(config.mesh)),
                      f'config.batch_size={config.batch_size} prompts × config.rlvr.samples_per_prompt='
                      f'{config.rlvr.samples_per_prompt} rollouts')


def eval_pool(config, tokenizer: Tokenizer, pool: Sequence[Example]) -> list[Example]:
  """Where the held-out eval draws from (`config.rlvr.eval_split`). 'heldout': the held-out split (for
  NL2SQL, databases no training split has). 'train': new questions over the training databases, i.e.
  bundled suites' train prompts (`pool`, RS prompts already out) whose gold answer no RS prompt has (the
  three training databases per domain share one wording, so a question text repeats over them with the same
  gold SQL); `reserve_eval` draws the eval set from them before prompt selection and takes it out of RL's pool."""
  settings = config.rlvr
  if check_choice(config, 'eval_split') == 'heldout':
    return prompt_pool(settings, 'heldout', tokenizer, seed=config.seed)[0]
  rs = prompts.prompt_set(tasks(settings), 'train', seed=config.seed, where=lambda e: rs_only(e, config.seed),
                          tokenizer=tokenizer)
  rs_answers = {(e.task, e.answer) for e in rs}
  bundled = {e.id for task in tasks(settings) for e in suites.load(task, 'train', seed=config.seed, tokenizer=tokenizer)}
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
  if check_choice(config, 'eval_split') == 'train':
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
  rng = np.random.default_rng([seed, 29])
  chosen = []
  for key in sorted(groups):
    members = groups[key]
    chosen += [members[i] for i in sorted(rng.permutation(len(members))[:counts[key]])]
  return chosen


# ---- the stage --------------------------------------------------------------------------------------


def run(config, workdir: str) -> None:
  if loop.is_finished(config, workdir):
    loop.finish_without_training(config, workdir, progress_keys=PROGRESS_KEYS, summary_keys=SUMMARY_KEYS)
    return
  check_config(config)
  workdir = pathlib.Path(workdir)
  settings = config.rlvr
  model_config, mesh, optimizer, state, tokenizer = state_lib.start(
      config, workdir, updates_per_step=settings.updates_per_batch)

  pool, reports = prompt_pool(settings, 'train', tokenizer, seed=config.seed)
  judge = judging.make(config, workdir)   # None unless config.judge names one
  heldout = None
  if settings.eval_split == 'train':
    heldout, pool = reserve_eval(config, tokenizer, pool)
  else:  # the eval sources are read, and eval_prompts capped at what they hold, before any rollout
    candidates = eval_pool(config, tokenizer, pool)
    eval_count = eval_size(config, settings.eval_prompts, pool, candidates)
  with sharding.activate(mesh):  # rollouts and their KV cache split over the mesh's batch devices
    selected = select_prompts(config, workdir, model_config, state.params, tokenizer, pool, judge)
  judging.save(judge, workdir)
  if heldout is None:  # the held-out split: the RL prompts' (task, language) mix
    eval_count = eval_size(config, eval_count, selected, candidates)   # selection may have kept fewer groups
    heldout = eval_examples(selected, candidates, eval_count, config.seed)
  artifacts.write_data_report(workdir, reports, train=[e.prompt for e in pool], evaluated=[e.prompt for e in heldout])
  greedy_settings = eval_settings(config)

  sampled_settings = dataclasses.replace(greedy_settings, temperature=config.sampling.temperature,
                                         samples=settings.eval_samples)

  def eval_fn(params, step):
    del step
    with sharding.activate(mesh):   # the params stay sharded; the held-out rollouts split over the mesh
      metrics = evals.evaluate(model_config, params, tokenizer, greedy_settings, examples=heldout, judge=judge)
      if settings.eval_samples:  # what RL optimises: pass@1 of the policy as it samples
        sampled = evals.evaluate(model_config, params, tokenizer, sampled_settings, examples=heldout, judge=judge)
        metrics |= {SAMPLED_PREFIX + key.removeprefix('eval/'): value for key, value in sampled.items()
                    if key.startswith(('eval/correctness', 'eval/language_mismatch', 'eval/response_length'))}
    return metrics

  rendered = [rollouts.render_prompt(tokenizer, e) for e in selected]
  # Every process draws the same global batch of prompts and samples all of its rollouts together (`sampling.rollout`
  # over processes); each then feeds its own rows of the update's batch, so a run does not depend on the process count.
  prompt_batches = iter(grain.MapDataset.range(len(selected)).shuffle(seed=config.seed).repeat()
                        .batch(config.batch_size).to_iter_dataset(pipeline.ON_DEMAND))

  reference = reference_params = None
  if settings.kl_beta > 0:  # β = 0 holds no reference params at all
    reference_params = jax.tree.map(jnp.copy, state.params)  # the state's own params are donated each step
    reference = jax.jit(lambda params, batch: logprobs.token_logprobs(model_config, params, batch,
                                                             config.sampling.temperature)[0])

  def prepare(state, indices, rng):
    start = time.perf_counter()
    examples = [selected[int(i)] for i in indices]
    with sharding.activate(mesh):
      groups = rollouts.generate_and_score(model_config, state.params, tokenizer, examples,
                                           [rendered[int(i)] for i in indices], rng,
                                           samples_per_prompt=settings.samples_per_prompt,
                                           **rollout_options(config, judge))
    batch, zero_variance = training_batch([rendered[int(i)] for i in indices], groups,
                                          length_multiple=settings.length_multiple,
                                          score_multiple=config.sampling.max_new_tokens,
                                          advantage=settings.advantage)
    if reference is not None:
      full = {k: v for k, v in batch.items() if k != 'score_columns'}  # [B, T] like the other per-token fields
      with sharding.activate(mesh):
        batch['ref_logprobs'] = np.pad(distributed.to_host(reference(reference_params, full)), ((0, 0), (1, 0)))
    metrics = rollout_metrics(groups, zero_variance)
    generated = sum(int(s.rollout.loss_mask.sum()) for group in groups for s in group)
    metrics['perf/rollout_tokens_per_sec'] = generated / (time.perf_counter() - start)
    judging.save(judge, workdir)
    return update_fn.local_rows(batch), metrics | judging.metrics(judge)

  loss = functools.partial(loss_fn, model_config=model_config, temperature=config.sampling.temperature,
                           clip_epsilon=settings.clip_epsilon, clip_low=settings.clip_low,
                           clip_high=settings.clip_high, kl_beta=settings.kl_beta,
                           kl_estimator=settings.kl_estimator, normalize=settings.normalize)
  update_fn = step_lib.make_update_fn(
      loss, optimizer, step_lib.state_shardings_of(state), mesh=mesh,
      learning_rate=optim.learning_rate_schedule(config, settings.updates_per_batch),
      grad_accum_steps=config.grad_accum_steps, denominator=settings.normalize,
      updates_per_batch=settings.updates_per_batch, aux_weights=AUX_WEIGHTS)
  loop.run_training(config, workdir, state=state, update_fn=update_fn, batches=prompt_batches, eval_fn=eval_fn,
                    model_config=model_config, prepare=prepare, progress_keys=PROGRESS_KEYS,
                    summary_keys=SUMMARY_KEYS)
