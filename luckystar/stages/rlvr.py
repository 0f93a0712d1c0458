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

The stage (`run`): the RL prompts and the held-out eval set (`engine.curriculum`: the prompt pool, prompt
selection by the starting policy, the eval set with the RL prompts' task/language mix), then the shared training
loop with rollouts drawn by the current policy at every step (`prepare_step`; DAPO's dynamic sampling with
`config.rlvr.dynamic_sampling`).
"""

import dataclasses
import functools
import pathlib
import time
from typing import Any, Callable, Mapping, Sequence

import grain
import jax
import jax.numpy as jnp
import numpy as np

from luckystar import distributed
from luckystar import errors
from luckystar import model
from luckystar.data import pipeline
from luckystar.data.examples import Example
from luckystar.engine import advantages as advantages_lib
from luckystar.engine import curriculum, evals, judging, logprobs, loop, optim, rollouts
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib
from luckystar.engine import streams
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
  rewards = np.array([[s.reward if s.survived else 0.0 for s in group] for group in groups], np.float32)
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
      f'{prefix}/reward': mean([s.reward for s in flat if s.survived]),
      f'{prefix}/correctness': mean([bool(s.verdict.correct) for s in flat]),
      f'{prefix}/pass_rate': mean([mean([bool(s.verdict.correct) for s in group]) for group in groups]),
      f'{prefix}/language_mismatch': evals.korean_mismatch_rate([(s.example, s.rollout, s.verdict)
                                                                      for s in flat]),
      f'{prefix}/response_length': mean([int(s.rollout.loss_mask.sum()) for s in flat]),
      f'{prefix}/overlong_fraction': mean([s.rollout.overlong for s in flat]),
      f'{prefix}/zero_variance_groups': mean(zero_variance),
      f'{prefix}/unscorable': float(sum(s.verdict.correct is None for s in flat)),
  }


# ---- each step's batch ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StepContext:
  """What a step's rollouts need besides the state: the run's settings, the RL prompts (`examples`, rendered
  as `prompts`), the rollout options built once (`rollout_options`: settings, reward, judge), the judge, and
  `reference(batch)` → reference log-probs (None when kl_beta = 0)."""
  config: Any
  workdir: pathlib.Path
  model_config: model.ModelConfig
  mesh: jax.sharding.Mesh
  tokenizer: Tokenizer
  examples: Sequence[Example]
  prompts: Sequence[Sequence[int]]
  options: Mapping[str, Any]
  judge: Any
  reference: Callable[[Mapping[str, np.ndarray]], np.ndarray] | None


def reference_fn(config, model_config: model.ModelConfig, params: Any
                 ) -> Callable[[Mapping[str, np.ndarray]], np.ndarray] | None:
  """The KL term's reference: the starting params' log-probs of a batch ([B, T], like its per-token fields), on
  a copy of the params (the state's own are donated each step); None at kl_beta = 0, which holds no copy."""
  if config.rlvr.kl_beta <= 0:
    return None
  reference_params = jax.tree.map(jnp.copy, params)
  scores = jax.jit(lambda params, batch: logprobs.token_logprobs(model_config, params, batch,
                                                                 config.sampling.temperature)[0])
  return lambda batch: distributed.to_host(scores(reference_params, batch))


def informative_groups(groups: Sequence[Sequence[rollouts.Scored]]) -> np.ndarray:
  """[prompts] bool: groups whose survivors did not all earn the same reward (fewer than two survivors: not
  informative), the groups DAPO's dynamic sampling keeps."""
  survivors = [[s.reward for s in group if s.survived] for group in groups]
  return np.array([len(set(rewards)) > 1 for rewards in survivors], bool)


def dynamic_groups(draw: Callable[[np.ndarray, jax.Array], list], indices: np.ndarray, rng: jax.Array, *,
                   pool_size: int, rounds: int) -> tuple[np.ndarray, list, dict]:
  """DAPO's dynamic sampling (Yu et al. 2025, eq. 11): `draw(indices, rng)` → scored groups of those prompts;
  groups without reward spread (`informative_groups`) are dropped and replaced by informative groups of up to
  `rounds` further draws of len(indices) prompts (seeded by `rng`, with replacement only when the pool is
  smaller). When the rounds run out, dropped groups of the first draw fill the rest, so the batch keeps its
  shape. Returns (prompt indices, groups, `train/dynamic/*` metrics); rounds = 0 is one draw."""
  groups = draw(indices, rng)
  if not rounds:
    return indices, groups, {}
  wanted, informative = len(indices), informative_groups(groups)
  kept = [(i, g) for i, g, keep in zip(indices, groups, informative) if keep]
  drawn, used, uninformative = 0, 0, int((~informative).sum())
  while len(kept) < wanted and used < rounds:
    used += 1
    round_rng = jax.random.fold_in(rng, streams.RLVR_DYNAMIC + used)
    more = np.asarray(jax.random.choice(round_rng, pool_size, (wanted,), replace=pool_size < wanted))
    more_groups = draw(more, round_rng)
    drawn += sum(len(group) for group in more_groups)
    more_informative = informative_groups(more_groups)
    uninformative += int((~more_informative).sum())
    kept += [(i, g) for i, g, keep in zip(more, more_groups, more_informative) if keep]
  short = max(0, wanted - len(kept))
  kept = kept[:wanted] + [(i, g) for i, g, keep in zip(indices, groups, informative) if not keep][:short]
  metrics = {'train/dynamic/extra_rollouts': float(drawn), 'train/dynamic/rounds': float(used),
             'train/dynamic/dropped_groups': float(uninformative - short),
             'train/dynamic/uninformative_kept': float(short)}
  return np.array([i for i, _ in kept]), [g for _, g in kept], metrics


def prepare_step(context: StepContext, update_fn: Any, state: Any, indices: np.ndarray, rng: jax.Array
                 ) -> tuple[dict[str, np.ndarray], dict]:
  """One step's update batch (this process's rows) and its metrics, from the global batch of prompt `indices`:
  k rollouts of each prompt by the current policy (`rng`: their draws), scored (`rollouts.generate_and_score`),
  with dynamic sampling's refills when `config.rlvr.dynamic_sampling` > 0, then advantages (`training_batch`)
  and, with a KL term, the reference's log-probs."""
  start, config, settings = time.perf_counter(), context.config, context.config.rlvr

  def draw(chosen, key):
    with sharding.activate(context.mesh):
      return rollouts.generate_and_score(
          context.model_config, state.params, context.tokenizer, [context.examples[int(i)] for i in chosen],
          [context.prompts[int(i)] for i in chosen], key, samples_per_prompt=settings.samples_per_prompt,
          **context.options)

  indices, groups, dynamic = dynamic_groups(draw, np.asarray(indices), rng, pool_size=len(context.examples),
                                            rounds=settings.get('dynamic_sampling', 0))
  batch, zero_variance = training_batch([context.prompts[int(i)] for i in indices], groups,
                                        length_multiple=settings.length_multiple,
                                        score_multiple=config.sampling.max_new_tokens, advantage=settings.advantage)
  if context.reference is not None:
    full = {k: v for k, v in batch.items() if k != 'score_columns'}  # [B, T] like the other per-token fields
    with sharding.activate(context.mesh):
      batch['ref_logprobs'] = np.pad(context.reference(full), ((0, 0), (1, 0)))
  metrics = rollout_metrics(groups, zero_variance) | dynamic
  generated = sum(int(s.rollout.loss_mask.sum()) for group in groups for s in group)
  metrics['perf/rollout_tokens_per_sec'] = generated / (time.perf_counter() - start)
  judging.save(context.judge, context.workdir)
  return update_fn.local_rows(batch), metrics | judging.metrics(context.judge)


# ---- settings ------------------------------------------------------------------------------------

SAMPLED_PREFIX = 'eval/sampled/'  # held-out figures of `eval_samples` draws per prompt at the sampling temperature


def rollout_options(config, judge=None) -> dict[str, Any]:
  """`rollouts.generate_and_score`'s settings from the config; `judge` (`engine.judging.make`) decides what the
  rules cannot."""
  return dict(settings=rollouts.rollout_settings(config, 'rlvr'), reward=reward_of(config), judge=judge)


def reward_of(config) -> terms.Reward:
  """The built reward (docs/rl.md#reward-terms): `config.rlvr.reward` with its `language_penalty` alias, the
  overlong drop, and the rollout budget `config.sampling.max_new_tokens` as overlong_soft's L_max."""
  settings = config.rlvr
  return terms.build(settings.reward, budget=config.sampling.max_new_tokens,
                     language_penalty=settings.get('language_penalty'), overlong_cache=settings.get('overlong_cache'),
                     drop_overlong=settings.drop_overlong)


def eval_settings(config) -> evals.Settings:
  """The held-out evaluation's settings: greedy, in `config.rlvr.eval_modes`, with the RL tool limits."""
  settings = config.rlvr
  return evals.Settings(modes=tuple(settings.eval_modes), max_new_tokens=config.sampling.max_new_tokens,
                             max_tool_turns=settings.max_tool_turns,
                             max_tool_result_tokens=settings.max_tool_result_tokens,
                             batch_size=settings.eval_batch_size, seed=config.seed)


# The keys that name a choice, and their choices (numeric keys: `luckystar.config.DOMAINS`).
# The registries themselves, not copies, so that an estimator registered after import is a valid choice.
CHOICES = {'advantage': advantages_lib.ESTIMATORS, 'normalize': NORMALIZATIONS, 'kl_estimator': KL_ESTIMATORS}


def check_choice(config, key: str) -> str:
  """`config.rlvr.<key>` of a CHOICES key, or a config error naming the key."""
  value = config.rlvr[key]
  if value not in CHOICES[key]:
    raise errors.UserError(f'config.rlvr.{key}={value!r}; expected one of {tuple(CHOICES[key])}')
  return value


def check_config(config) -> None:
  """The config errors `run` would otherwise meet only after prompt selection (minutes of rollouts)."""
  for key in CHOICES:
    check_choice(config, key)
  curriculum.eval_split(config)
  reward_of(config)   # an unknown term, a bad weight, a language_penalty conflict
  if not config.sampling.temperature > 0:   # the loss divides logits by it: 0 would make every update NaN (skipped)
    raise errors.UserError(f'config.sampling.temperature={config.sampling.temperature}: RLVR samples its '
                           'rollouts and scores them at this temperature, so it must be > 0')
  step_lib.check_rows(config.batch_size * config.rlvr.samples_per_prompt, sharding.make_mesh(dict(config.mesh)),
                      f'config.batch_size={config.batch_size} prompts × config.rlvr.samples_per_prompt='
                      f'{config.rlvr.samples_per_prompt} rollouts')


# ---- the stage --------------------------------------------------------------------------------------


def make_eval_fn(config, model_config: model.ModelConfig, tokenizer: Tokenizer, mesh: jax.sharding.Mesh,
                 heldout: Sequence[Example], judge=None) -> Callable[[Any, int], dict]:
  """`eval_fn(params, step)` → the held-out figures: greedy (`eval/*`), and with `config.rlvr.eval_samples`
  the pass@1 of that many draws at the sampling temperature (`eval/sampled/*`, what RL optimises)."""
  greedy = eval_settings(config)
  sampled = dataclasses.replace(greedy, temperature=config.sampling.temperature, samples=config.rlvr.eval_samples)

  def eval_fn(params, step):
    del step
    with sharding.activate(mesh):   # the params stay sharded; the held-out rollouts split over the mesh
      metrics = evals.evaluate(model_config, params, tokenizer, greedy, examples=heldout, judge=judge)
      if config.rlvr.eval_samples:
        drawn = evals.evaluate(model_config, params, tokenizer, sampled, examples=heldout, judge=judge)
        metrics |= {SAMPLED_PREFIX + key.removeprefix('eval/'): value for key, value in drawn.items()
                    if key.startswith(('eval/correctness', 'eval/language_mismatch', 'eval/response_length'))}
    return metrics
  return eval_fn



def run(config, workdir: str) -> None:
  if loop.is_finished(config, workdir):
    loop.finish_without_training(config, workdir, progress_keys=PROGRESS_KEYS, summary_keys=SUMMARY_KEYS)
    return
  check_config(config)
  workdir = pathlib.Path(workdir)
  settings = config.rlvr
  model_config, mesh, optimizer, state, tokenizer = state_lib.start(
      config, workdir, updates_per_step=settings.updates_per_batch)

  judge = judging.make(config, workdir)   # None unless config.judge names one
  options = rollout_options(config, judge)
  with sharding.activate(mesh):  # selection's rollouts and their KV cache split over the mesh's batch devices
    selected, heldout = curriculum.prompts_and_eval_set(config, workdir, model_config, state.params, tokenizer,
                                                        options)
  judging.save(judge, workdir)
  eval_fn = make_eval_fn(config, model_config, tokenizer, mesh, heldout, judge)

  prompt_batches = iter(grain.MapDataset.range(len(selected)).shuffle(seed=config.seed).repeat()
                        .batch(config.batch_size).to_iter_dataset(pipeline.ON_DEMAND))
  # Every process draws the same global batch of prompts and samples all of its rollouts together (`sampling.rollout`
  # over processes); each then feeds its own rows of the update's batch, so a run does not depend on the process count.
  context = StepContext(config=config, workdir=workdir, model_config=model_config, mesh=mesh, tokenizer=tokenizer,
                        examples=selected, prompts=[rollouts.render_prompt(tokenizer, e) for e in selected],
                        options=options, judge=judge, reference=reference_fn(config, model_config, state.params))

  loss = functools.partial(loss_fn, model_config=model_config, temperature=config.sampling.temperature,
                           clip_epsilon=settings.clip_epsilon, clip_low=settings.clip_low,
                           clip_high=settings.clip_high, kl_beta=settings.kl_beta,
                           kl_estimator=settings.kl_estimator, normalize=settings.normalize)
  update_fn = step_lib.make_update_fn(
      loss, optimizer, step_lib.state_shardings_of(state), mesh=mesh,
      learning_rate=optim.learning_rate_schedule(config, settings.updates_per_batch),
      grad_accum_steps=config.grad_accum_steps, denominator=settings.normalize,
      updates_per_batch=settings.updates_per_batch, aux_weights=AUX_WEIGHTS)
  prepare = functools.partial(prepare_step, context, update_fn)
  loop.run_training(config, workdir, state=state, update_fn=update_fn, batches=prompt_batches, eval_fn=eval_fn,
                    model_config=model_config, prepare=prepare, progress_keys=PROGRESS_KEYS,
                    summary_keys=SUMMARY_KEYS)
