"""Offline DPO for conciseness and language (docs/rl.md, paper §2.5; Rafailov et al. 2023).

    python -m luckystar.main --config=configs/dpo.py --workdir=runs/dpo

The loss reads like the papers. With h = (log π(y_c) − log π_ref(y_c)) − (log π(y_r) − log π_ref(y_r)),
each log-prob summed over the response tokens of the chosen (c) and rejected (r) reply:

    sigmoid  −log σ(β·h)                                      DPO (Rafailov et al. 2023)
             with label_smoothing ε: −(1−ε)·log σ(β·h) − ε·log σ(−β·h)
                                                               cDPO (Mitchell 2023; TRL's `label_smoothing`)
    robust   (−(1−ε)·log σ(β·h) + ε·log σ(−β·h)) / (1 − 2ε)   rDPO (Chowdhury et al. 2024): unbiased
                                                               when labels are flipped with probability ε
    ipo      (h − 1/(2β))²                                     IPO (Azar et al. 2023), on summed log-probs
                                                               (TRL's IPO averages them per token instead)
    hinge    max(0, 1 − β·h)                                   SLiC (Zhao et al. 2023; TRL's `hinge`)

With `ld_alpha` α < 1 (LD-DPO, Liu et al. 2024; TRL's `ld_alpha`), the policy's log π(y) in h counts a reply's
first l_p = min(|y_c|, |y_r|) response tokens at weight 1 and the rest at α, so the longer reply's extra tokens
weigh less (the reference log-probs stay whole sums, as in TRL); α = 1 is DPO.

plus, with `sft_weight` w > 0, w · (−log π(y_c) / |y_c|): the chosen reply's per-token NLL (RPO,
Pang et al. 2024; TRL's `rpo_alpha`). Anchor rows (kind 'anchor', `anchor_modes`) hold one of the
starting policy's own verified-correct replies y_a instead of a pair and add anchor_weight ·
(−log π(y_a) / |y_a|) and no preference term: on samples of the reference that is, up to a constant,
a Monte Carlo estimate of KL(π_ref ‖ π) on those prompts (restricted to its correct replies), a
regulariser that needs no reference model in memory. It keeps the other mode where it was while the
pairs move this one (experiments/sweeps/dpo_anchors.md). Each term is a mean over rows (pairs and anchors), so the loss is
Σ over rows / rows and gradient accumulation stays exact (`step.accumulate_gradients`, denominator
'pairs'). Only response tokens count (`loss_mask`, as `Tokenizer.render` and the sampler lay it out):
prompt and tool-result tokens have weight 0 in every log-prob here.

The stage (`run`):
  1. Pairs (`build_pairs`): `pair_prompts` seeded train prompts of `config.dpo.tasks` (math up to
     `math_max_difficulty`: short math) are sampled `samples_per_prompt` times by the starting policy
     in each of `config.dpo.modes` (default concise) at `config.sampling`, the policy's normal settings.
     chosen = a direct correct answer (`config.dpo.chosen='direct'`, `direct_response`: the answer
     alone, '를 정답: C' rather than the filled-in sentence and then the letter; 'reference': the example's
     reference reply), rendered in that mode (`conversations.render_example`), kept only if the task's
     verifier scores it correct and in the prompt's language. rejected = one
     of the policy's own samples: kind 'language' when its response is in the wrong language
     (`Verdict.language_mismatch`), else kind 'concise' (concise mode only) when its reply is at least
     `verbose_min_ratio` × and `verbose_min_extra` tokens longer than the chosen one. At most
     `pairs_per_prompt` pairs per prompt, mode and kind: the first qualifying samples, correct ones
     first (such a pair differs in length, not in the answer). Written to
     `workdir/dpo_pairs.jsonl` (one pair per line with its provenance: example id, task, language,
     kind, mode, policy, sampling settings, sample index, lengths, whether the rejected reply was
     correct, its stop reason and text) and `workdir/dpo_pairs.json` (the config fingerprint and
     counts; written last). A re-run reuses them; a changed config fingerprint is an error.
     `config.dpo.sources` reads preference data instead (`luckystar.data.sources`: TRL's preference_jsonl, or
     dpo_pairs files this stage wrote elsewhere), mixed by their weights. Anchors: `pair_prompts` train
     prompts of `config.dpo.anchor_tasks` are sampled the same way in each of `config.dpo.anchor_modes`
     (default reasoning), and each prompt's first sample that is correct, in the prompt's language and
     finished becomes an anchor row. Sampling runs the tool loop (`max_tool_turns`): reasoning mode
     calls the calculator.
  2. Reference log-probs (`reference_logps`): summed response log-probs of every pair under the
     starting params, computed once before training and kept in `workdir/dpo_reference.npy` under a
     fingerprint of the params (every leaf's bytes), the model config and the pairs' tokens and masks;
     a run with the same model and data reuses them, another model or data recomputes them. No
     reference params are held during training.
  3. The shared loop (`loop.run_training`) on shuffled batches of pairs; `eval/*` (greedy held-out
     correctness and response length in both modes, `engine.evals`) at step 0 and at the end. The same
     command on the same workdir resumes.

Batches: tokens, positions, segment_ids, loss_mask [B, 2, T] int (axis 1: chosen, rejected; rows
right-padded with segment 0), score_columns [B, 2, M] int (`logprobs.with_score_columns`: the columns
whose next token is a response token, padded with -1; the vocabulary projection runs only there),
anchor [B] int (1: an anchor row, its reply in both halves) and reference_logps [B, 2] float. Keeping a
pair in one row keeps it together when `accumulate_gradients` splits rows into micro-batches.
"""

import collections
import dataclasses
import functools
import hashlib
import io
import json
import pathlib
from typing import Any, Callable, Mapping, Sequence

from absl import logging
import grain
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from luckystar import distributed
from luckystar import errors
from luckystar import files
from luckystar import model
from luckystar.data import conversations, pipeline, sources
from luckystar.data.examples import Example
from luckystar.engine import artifacts, evals, logprobs, loop, optim, prompts, rollouts
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib
from luckystar.model import sharding
from luckystar.rewards import choice
from luckystar.rewards import reward as reward_lib
from luckystar.rewards import terms
from luckystar.tokenizer import Tokenizer

LOSS_TYPES = ('sigmoid', 'robust', 'ipo', 'hinge')
CHOSEN_STYLES = ('direct', 'reference')
DIRECT_TASKS = ('korean_mc', 'chat', 'math')
DIRECT_FORMAT = 2                     # direct_response's format: 1 the MC letter alone, 2 the option then the letter
PAIRS_FILE = 'dpo_pairs.jsonl'
PAIRS_SUMMARY = 'dpo_pairs.json'      # fingerprint and counts; written last: the pairs are complete
REFERENCE_FILE = 'dpo_reference.npy'  # [pairs, 2] float32
REFERENCE_RECORD = 'dpo_reference.json'  # its fingerprint
FEATURES = ('tokens', 'loss_mask')
SIDES = ('chosen', 'rejected')
ANCHOR = 'anchor'                     # the kind of a row that holds one of the policy's own replies twice
ANCHOR_STREAM = 1000                  # anchor sampling's RNG stream: fold_in(key(seed), ANCHOR_STREAM + mode index)
# What the run shows (`loop.run_training`): how often the chosen reply wins and by how much as it trains;
# concise replies' length, correctness and language, and reasoning correctness, before → after.
PROGRESS_KEYS = ('train/rewards/accuracies', 'train/rewards/margins')
SUMMARY_KEYS = ('eval/concise/response_length', 'eval/concise/correctness', 'eval/concise/language_mismatch',
                'eval/reasoning/correctness')


# ---- the loss ------------------------------------------------------------------------------------

# How `loss_fn`'s aux entries combine over micro-batches (`step.accumulate_gradients`): means over the
# preference rows or the anchor rows by those rows, counts summed; the loss by 'pairs', the denominator.
AUX_WEIGHTS = {**dict.fromkeys(('rewards/chosen', 'rewards/rejected', 'rewards/margins', 'rewards/accuracies',
                                'logps/chosen', 'logps/rejected', 'response_length/chosen', 'response_length/rejected',
                                'sft_loss'), 'preference_rows'),
               'anchor_loss': 'anchor_rows', 'anchor_rows': None, 'preference_rows': None}


def sequence_logps(token_logps: jax.Array, rows: Mapping[str, jax.Array]) -> jax.Array:
  """Σ_t log π(token t+1 | ≤ t) over response tokens → [N]: token_logps [N, T-1], or [N, M] at
  rows['score_columns'] (`logprobs.token_logprobs` of `rows`). Column t is weighted by loss_mask[t+1],
  the mask of the token it predicts, so prompt and tool tokens (and padding columns) never count."""
  return (token_logps * logprobs.next_tokens(rows, rows['loss_mask']).astype(token_logps.dtype)).sum(-1)


def preference_losses(chosen_logratios: jax.Array, rejected_logratios: jax.Array, *, beta: float,
                      loss_type: str = 'sigmoid', label_smoothing: float = 0.0) -> jax.Array:
  """Per-pair loss [B] from log π − log π_ref of the chosen and rejected replies [B] (formulas in the
  module docstring)."""
  if loss_type not in LOSS_TYPES:
    raise ValueError(f'config.dpo.loss_type={loss_type!r}; expected one of {LOSS_TYPES}')
  if not 0.0 <= label_smoothing < 0.5:
    raise ValueError(f'config.dpo.label_smoothing={label_smoothing}; expected 0 <= ε < 0.5')
  h = chosen_logratios - rejected_logratios
  if loss_type == 'ipo':
    return (h - 1.0 / (2.0 * beta)) ** 2
  if loss_type == 'hinge':
    return jax.nn.relu(1.0 - beta * h)
  agree, disagree = -jax.nn.log_sigmoid(beta * h), -jax.nn.log_sigmoid(-beta * h)
  if loss_type == 'robust':
    return ((1.0 - label_smoothing) * agree - label_smoothing * disagree) / (1.0 - 2.0 * label_smoothing)
  return (1.0 - label_smoothing) * agree + label_smoothing * disagree


def flatten_pairs(batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """[B, 2, T] pair rows → [2B, T] model rows: the B chosen rows, then the B rejected rows (score_columns,
  where present, [B, 2, M] → [2B, M])."""
  return {k: jnp.concatenate([batch[k][:, 0], batch[k][:, 1]])
          for k in ('tokens', 'positions', 'segment_ids', 'loss_mask', 'score_columns') if k in batch}


def desensitized_logps(token_logps: jax.Array, rows: Mapping[str, jax.Array], ld_alpha: float) -> jax.Array:
  """LD-DPO's log π [B, 2] (chosen, rejected) from `pair_token_logps`: a reply's first l_p = min(|y_c|, |y_r|)
  response tokens at weight 1, the rest at ld_alpha (tokens counted by loss_mask: tool tokens neither count
  nor weigh)."""
  mask = logprobs.next_tokens(rows, rows['loss_mask']).astype(token_logps.dtype)   # [2B, columns]
  public = jnp.tile(mask.sum(-1).reshape(2, -1).min(0), 2)[:, None]                 # [2B, 1]: its pair's l_p
  weights = mask * jnp.where(jnp.cumsum(mask, -1) <= public, 1.0, ld_alpha)
  return (token_logps * weights).sum(-1).reshape(2, -1).T


def pair_token_logps(model_config: model.ModelConfig, params: Any, batch: Mapping[str, jax.Array]
                     ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(log π(token t+1 | ≤ t) at temperature 1 [2B, T-1], or [2B, M] at score_columns; the `flatten_pairs`
  rows they are of)."""
  rows = flatten_pairs(batch)
  token_logps, _ = logprobs.token_logprobs(model_config, params, rows, temperature=1.0)
  return token_logps, rows


def pair_logps(model_config: model.ModelConfig, params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
  """Summed response log-probs [B, 2] (chosen, rejected) of each pair under `params`, at temperature 1;
  with the batch's score_columns (`pair_batch`), the vocabulary projection runs only at response tokens."""
  token_logps, rows = pair_token_logps(model_config, params, batch)
  return sequence_logps(token_logps, rows).reshape(2, -1).T


_jitted_pair_logps = jax.jit(pair_logps, static_argnums=0)


def loss_fn(params: Any, batch: Mapping[str, jax.Array], rng: jax.Array | None, *, model_config: model.ModelConfig,
            beta: float = 0.1, loss_type: str = 'sigmoid', label_smoothing: float = 0.0, ld_alpha: float = 1.0,
            sft_weight: float = 0.0, anchor_weight: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean over rows of `preference_losses` + sft_weight · the chosen reply's per-token NLL on preference
  rows, and of anchor_weight · the anchor reply's per-token NLL on anchor rows. ld_alpha < 1: the preference
  term's policy log-probs are LD-DPO's (`desensitized_logps`); the NLL terms and logps/* stay whole sums.

  batch: tokens, positions, segment_ids, loss_mask [B, 2, T]; reference_logps [B, 2]; optionally
  score_columns [B, 2, M] (`pair_batch`; the same loss, fewer FLOPs) and anchor [B] (1: an anchor row,
  its reply in both halves; see the module docstring). aux over the
  preference rows, named as TRL names them: rewards/chosen and rewards/rejected (β·(log π − log π_ref)),
  rewards/margins (their difference), rewards/accuracies (chosen reward > rejected reward),
  logps/chosen, logps/rejected (summed response log-probs), response_length/chosen and /rejected
  (response tokens), sft_loss (the NLL term before its weight); anchor_loss (the anchors' NLL),
  anchor_rows and preference_rows; loss, and pairs (the denominator: rows). AUX_WEIGHTS says how they
  combine over micro-batches.
  """
  del rng  # deterministic
  token_logps, rows = pair_token_logps(model_config, params, batch)
  logps = sequence_logps(token_logps, rows).reshape(2, -1).T            # [B, 2]
  policy = logps if ld_alpha == 1.0 else desensitized_logps(token_logps, rows, ld_alpha)   # 1: DPO, unsplit
  logratios = policy - jax.lax.stop_gradient(batch['reference_logps'])  # [B, 2]
  losses = preference_losses(logratios[:, 0], logratios[:, 1], beta=beta, loss_type=loss_type,
                             label_smoothing=label_smoothing)
  lengths = batch['loss_mask'][:, :, 1:].sum(-1).astype(jnp.float32)   # [B, 2]: scored response tokens
  nll = -logps[:, 0] / jnp.maximum(lengths[:, 0], 1.0)                  # [B]: the chosen reply's per-token NLL
  anchor = batch['anchor'].astype(jnp.float32) if 'anchor' in batch else jnp.zeros_like(nll)   # [B]
  preference = 1.0 - anchor
  # Every row's term over all rows: the denominator stays the row count, so accumulation is exact.
  loss = (preference * (losses + sft_weight * nll) + anchor_weight * anchor * nll).mean()

  def over(weights, values):  # the mean of `values` over the rows `weights` selects (0 for none)
    return (weights * values).sum() / jnp.maximum(weights.sum(), 1.0)

  rewards = beta * jax.lax.stop_gradient(logratios)
  aux = {'loss': loss, 'rewards/chosen': over(preference, rewards[:, 0]),
         'rewards/rejected': over(preference, rewards[:, 1]),
         'rewards/margins': over(preference, rewards[:, 0] - rewards[:, 1]),
         'rewards/accuracies': over(preference, (rewards[:, 0] > rewards[:, 1]).astype(jnp.float32)),
         'logps/chosen': over(preference, logps[:, 0]), 'logps/rejected': over(preference, logps[:, 1]),
         'response_length/chosen': over(preference, lengths[:, 0]),
         'response_length/rejected': over(preference, lengths[:, 1]),
         'sft_loss': over(preference, nll), 'anchor_loss': over(anchor, nll), 'anchor_rows': anchor.sum(),
         'preference_rows': preference.sum(), 'pairs': jnp.asarray(logps.shape[0], jnp.float32)}
  return loss, aux


# ---- batches ---------------------------------------------------------------------------------------


def pair_batch(pairs: Sequence[Mapping[str, Any]], indices: Sequence[int], reference: np.ndarray | None = None, *,
               length_multiple: int) -> dict[str, np.ndarray]:
  """Pairs `indices` as a batch (module docstring), padded to a multiple of `length_multiple` tokens
  (a few batch shapes, each compiled once), with score_columns [B, 2, M] at the response tokens
  (`logprobs.with_score_columns`). reference: [pairs, 2] log-probs, or None (no field)."""
  rows = [pairs[int(i)] for i in indices]
  longest = max(len(row[f'{side}_tokens']) for row in rows for side in SIDES)
  length = -(-longest // length_multiple) * length_multiple
  batch = {name: np.zeros((len(rows), 2, length), np.int32)
           for name in ('tokens', 'positions', 'segment_ids', 'loss_mask')}
  for b, row in enumerate(rows):
    for s, side in enumerate(SIDES):
      n = len(row[f'{side}_tokens'])
      batch['tokens'][b, s, :n] = row[f'{side}_tokens']
      batch['loss_mask'][b, s, :n] = row[f'{side}_loss_mask']
      batch['positions'][b, s, :n] = np.arange(n)
      batch['segment_ids'][b, s, :n] = 1
  batch['anchor'] = np.asarray([row.get('kind') == ANCHOR for row in rows], np.int32)
  if reference is not None:
    batch['reference_logps'] = np.asarray(reference, np.float32)[np.asarray(indices, np.int64)]
  # Replies are a fraction of a pair's tokens: logits only where a response token is predicted.
  return logprobs.with_score_columns(batch)


def training_batches(pairs: Sequence[Mapping[str, Any]], reference: np.ndarray, *, batch_size: int, seed: int,
                     length_multiple: int, weights: Mapping[str, float] | None = None,
                     local_rows: Callable[[dict], dict] = lambda batch: batch) -> grain.DatasetIterator:
  """A checkpointable iterator of shuffled batches of `batch_size` pairs, epoch after epoch; with `weights`
  (source label → weight, pairs carrying their `source`), drawn from the sources in those proportions. Every
  process builds the same global batches and keeps `local_rows` of each (`MeshFunction.local_rows`), so the
  batches, and the loss curve, do not depend on the number of processes."""
  if len(pairs) < batch_size:
    raise errors.UserError(f'{len(pairs)} DPO pairs, fewer than the {batch_size} a batch needs '
                           f'(config.batch_size); build more pairs (config.dpo.pair_prompts) or lower it')
  if weights and len(weights) > 1:
    by_source = {label: [i for i, pair in enumerate(pairs) if pair['source'] == label] for label in weights}
    stream = pipeline.mixture(by_source, weights, seed=seed, process_index=0, process_count=1)
  else:
    stream = grain.MapDataset.range(len(pairs)).shuffle(seed=seed).repeat()
  return iter(stream.batch(batch_size, drop_remainder=True)
              .map(lambda chunk: local_rows(pair_batch(pairs, chunk, reference, length_multiple=length_multiple)))
              .to_iter_dataset(pipeline.ON_DEMAND))


# ---- pairs --------------------------------------------------------------------------------------------


def pair_prompts(settings: Any, tokenizer: Tokenizer, *, seed: int, tasks: Sequence[str] | None = None,
                 modes: Sequence[str] | None = None) -> list[Example]:
  """`settings.pair_prompts` seeded train prompts of `tasks` (default `settings.tasks`; math up to
  `settings.math_max_difficulty`) whose prompt fits `settings.max_prompt_tokens` in every one of `modes`
  (default `settings.modes`)."""
  modes = settings.modes if modes is None else modes
  pool = prompts.prompt_set(settings.tasks if tasks is None else tasks, 'train', seed=seed, tokenizer=tokenizer,
                            where=lambda e: e.task != 'math' or e.difficulty <= settings.math_max_difficulty,
                            max_prompt_tokens=settings.max_prompt_tokens, modes=modes)
  order = np.random.default_rng([seed, 31]).permutation(len(pool))[:settings.pair_prompts]
  return [pool[i] for i in sorted(order)]


def direct_response(example: Example) -> str:
  """The answer alone, in the prompt's language: 'chosen = a direct correct answer' (paper §2.5). For
  multiple choice, the chosen option's text and its letter without the filled-in sentence ('를 정답: C';
  the letter alone where the example does not list its options), the short reference of a chat question
  or the final answer of a math problem ('Berlin.', '베를린입니다.', '34.', '34입니다.').

  The option's text stays because the small policy finds the letter through it (experiments/sweeps/dpo_anchors.md)."""
  if example.task == 'korean_mc':
    options = example.meta.get('options')
    if options is None:
      return f'정답: {example.answer}'
    return f'{options[choice.option_letters(len(options)).index(example.answer)]} 정답: {example.answer}'
  if example.task in DIRECT_TASKS:  # chat, math
    return f'{example.answer}입니다.' if example.language == 'ko' else f'{example.answer}.'
  raise errors.UserError(f"config.dpo.chosen='direct' has no direct answer for task {example.task!r}; "
                         f"use tasks from {DIRECT_TASKS} or config.dpo.chosen='reference'")


def chosen_reply(tokenizer: Tokenizer, example: Example, mode: str, style: str = 'direct') -> dict[str, Any] | None:
  """The chosen reply rendered in `mode` ({'tokens', 'loss_mask', 'text'}): the example's reference reply
  ('reference') or its answer alone (`direct_response`, 'direct'), with the reference thinking in
  reasoning mode; None when the task's verifier does not score its response correct and in the
  prompt's language."""
  if style not in CHOSEN_STYLES:
    raise errors.UserError(f'config.dpo.chosen={style!r}; expected one of {CHOSEN_STYLES}')
  if style == 'direct':
    example = dataclasses.replace(example, response=direct_response(example))
  rendered = conversations.render_example(tokenizer, example, mode)
  prompt_length = len(rollouts.render_prompt(tokenizer, example, mode))
  turn = tokenizer.parse_assistant(rendered['tokens'][prompt_length:].tolist())
  verdict = reward_lib.score(example, turn)
  if not verdict.correct or verdict.language_mismatch:
    return None
  return {**rendered, 'text': turn.response}


def pair_kind(mode: str, chosen_length: int, scored: rollouts.Scored, settings: Any) -> str | None:
  """Which pair a sample makes against the chosen reply of `chosen_length` response tokens: 'language'
  (its response is in the wrong language), 'concise' (concise mode, and at least `verbose_min_ratio`
  × and `verbose_min_extra` tokens longer), or None."""
  if scored.verdict.language_mismatch:
    return 'language'
  length = int(scored.rollout.loss_mask.sum())
  if mode == 'concise' and length >= max(settings.verbose_min_ratio * chosen_length,
                                         chosen_length + settings.verbose_min_extra):
    return 'concise'
  return None


def pairs_fingerprint(config, tokenizer: Tokenizer) -> dict[str, Any]:
  """What the built pairs depend on; pairs built under another fingerprint are stale."""
  settings = config.dpo
  return {
      'init_from': config.init_from, 'tokenizer': tokenizer.fingerprint, 'seed': config.seed,
      'sampling': dict(config.sampling),
      'direct_format': DIRECT_FORMAT,
      **({'model_overrides': dict(config.model_overrides)} if config.model_overrides else {}),  # another policy
      **{key: settings[key] for key in ('chosen', 'tasks', 'modes', 'anchor_modes', 'anchor_tasks',
                                        'math_max_difficulty', 'max_prompt_tokens', 'pair_prompts',
                                        'samples_per_prompt', 'pairs_per_prompt', 'verbose_min_ratio',
                                        'verbose_min_extra', 'max_tool_turns', 'max_tool_result_tokens',
                                        'sampling_batch')}}


def record(config, example: Example, *, kind: str, mode: str, index: int, prompt: Sequence[int],
           scored: rollouts.Scored, chosen: Mapping[str, Any] | None, tokenizer: Tokenizer) -> dict[str, Any]:
  """One row of the pair file with its provenance: the `chosen` reply ({tokens, loss_mask, length,
  text}) against the sample `scored`, or for an anchor row (chosen None) the sample twice."""
  rollout = scored.rollout
  sample = {'tokens': [*prompt, *rollout.token_ids.tolist()],
            'loss_mask': [0] * len(prompt) + rollout.loss_mask.tolist(), 'length': int(rollout.loss_mask.sum()),
            'text': tokenizer.decode(rollout.token_ids[rollout.loss_mask > 0])}
  chosen = sample if chosen is None else chosen
  return {
      'example_id': example.id, 'task': example.task, 'language': example.language, 'kind': kind, 'mode': mode,
      'policy': config.init_from, 'tokenizer': tokenizer.fingerprint, 'sampling': dict(config.sampling),
      'sample_index': index,
      'prompt_length': len(prompt), 'chosen_length': chosen['length'], 'rejected_length': sample['length'],
      'rejected_correct': scored.verdict.correct, 'rejected_stop_reason': rollout.stop_reason,
      'chosen_text': chosen['text'], 'rejected_text': sample['text'],
      'chosen_tokens': list(chosen['tokens']), 'chosen_loss_mask': list(chosen['loss_mask']),
      'rejected_tokens': sample['tokens'], 'rejected_loss_mask': sample['loss_mask']}


def sampled(config, model_config: model.ModelConfig, params: Any, tokenizer: Tokenizer, examples: Sequence[Example],
            mode: str, rng: jax.Array, desc: str):
  """(example, prompt, [samples_per_prompt scored rollouts]) for each of `examples` in `mode`, sampled by
  the policy `params` at `config.sampling` with the tool loop, `config.dpo.sampling_batch` rows a call."""
  settings = config.dpo
  return rollouts.sample_groups(
      model_config, params, tokenizer, examples, rng, batch_rows=settings.sampling_batch,
      samples_per_prompt=settings.samples_per_prompt, mode=mode, desc=desc, sampling_settings=config.sampling,
      max_tool_turns=settings.max_tool_turns, max_tool_result_tokens=settings.max_tool_result_tokens,
      reward=terms.correctness(config.sampling.max_new_tokens))


def build_pairs(config, model_config: model.ModelConfig, params: Any, tokenizer: Tokenizer,
                examples: Sequence[Example], anchor_examples: Sequence[Example] = ()
                ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """(pair records, counts) from samples of the policy `params` (module docstring, step 1): preference
  pairs on `examples`, anchor rows on `anchor_examples`."""
  settings = config.dpo
  pairs, counts = [], collections.Counter()
  rng = jax.random.key(config.seed)
  for mode_index, mode in enumerate(settings.modes):
    chosen = {e.id: chosen_reply(tokenizer, e, mode, settings.chosen) for e in examples}
    counts[f'{mode}/chosen_unverified'] += sum(c is None for c in chosen.values())
    usable = [e for e in examples if chosen[e.id] is not None]
    for example, prompt, group in sampled(config, model_config, params, tokenizer, usable, mode,
                                          jax.random.fold_in(rng, mode_index), f'DPO pairs ({mode})'):
      counts[f'{mode}/samples'] += len(group)
      reply = chosen[example.id]
      if reply['tokens'][:len(prompt)].tolist() != prompt:  # one chat template for both replies
        raise ValueError(f'example {example.id}: the rendered reference reply does not start with its prompt')
      reply = {'tokens': reply['tokens'].tolist(), 'loss_mask': reply['loss_mask'].tolist(),
               'length': int(reply['loss_mask'].sum()), 'text': reply['text']}
      made = collections.Counter()
      # A correct verbose reply first: then the pair differs in length and not in the answer.
      for index in sorted(range(len(group)), key=lambda i: not group[i].verdict.correct):
        kind = pair_kind(mode, reply['length'], group[index], settings)
        if kind is None or made[kind] >= settings.pairs_per_prompt:
          continue
        made[kind] += 1
        counts[f'{mode}/{kind}'] += 1
        pairs.append(record(config, example, kind=kind, mode=mode, index=index, prompt=prompt, scored=group[index],
                            chosen=reply, tokenizer=tokenizer))
  for mode_index, mode in enumerate(settings.anchor_modes):
    for example, prompt, group in sampled(config, model_config, params, tokenizer, anchor_examples, mode,
                                          jax.random.fold_in(rng, ANCHOR_STREAM + mode_index), f'DPO anchors ({mode})'):
      counts[f'{mode}/anchor_samples'] += len(group)
      # The first correct, finished reply in the prompt's language.
      index = next((i for i, s in enumerate(group) if s.verdict.correct and not s.verdict.language_mismatch
                    and s.rollout.finished), None)
      if index is not None:
        counts[f'{mode}/{ANCHOR}'] += 1
        pairs.append(record(config, example, kind=ANCHOR, mode=mode, index=index, prompt=prompt, scored=group[index],
                            chosen=None, tokenizer=tokenizer))
  return pairs, summarize_pairs(pairs, counts, len(examples))


def summarize_pairs(pairs: Sequence[Mapping[str, Any]], counts: Mapping[str, int], prompts: int) -> dict[str, Any]:
  """Counts per kind, task and language, mean lengths, and how often the rejected reply was correct;
  'all' counts the preference pairs (anchor rows are kind 'anchor')."""
  groups = collections.defaultdict(list)
  for pair in pairs:
    keys = [pair['kind'], f'{pair["kind"]}/{pair["task"]}/{pair["language"]}'] + ['all'] * (pair['kind'] != ANCHOR)
    for key in keys:
      groups[key].append(pair)
  return {'prompts': prompts, 'sampling': dict(counts), 'pairs': {key: {
      'pairs': len(members),
      'chosen_length': evals.mean(p['chosen_length'] for p in members),
      'rejected_length': evals.mean(p['rejected_length'] for p in members),
      'rejected_correct': evals.mean(bool(p['rejected_correct']) for p in members)}
      for key, members in sorted(groups.items())}}


def read_pairs(path: pathlib.Path, tokenizer: Tokenizer) -> list[dict[str, Any]]:
  """A pair file (one JSON object per line with chosen_/rejected_ tokens and loss_mask); a malformed
  line, or one of another tokenizer (its `tokenizer` fingerprint, `Tokenizer.made`), is a UserError
  naming file:line."""
  try:
    text = files.read_text(path, what='DPO pair file')
  except errors.MissingFile:
    raise errors.MissingFile(f'{path}: no such DPO pair file ({SOURCES_KEY}); set it to "" to build '
                             'pairs from the policy') from None
  pairs = []
  for number, line in enumerate(text.split('\n'), start=1):   # not splitlines(): U+2028 may sit inside a string
    if not line.strip():
      continue
    record = files.loads(line, f'{path}:{number}')
    try:
      for side in SIDES:
        tokens, mask = record[f'{side}_tokens'], record[f'{side}_loss_mask']
        if (not isinstance(tokens, list) or not isinstance(mask, list) or len(tokens) != len(mask) or len(tokens) < 2
            or not all(type(t) is int and t >= 0 for t in tokens) or not all(m in (0, 1) for m in mask)
            or not any(mask[1:])):
          raise ValueError(f'{side}_tokens must be token ids and {side}_loss_mask as many 0/1 values with a 1 '
                           'after the first token')
        if max(tokens) >= tokenizer.vocab_size:
          raise ValueError(f'{side}_tokens holds ids at or above the tokenizer\'s {tokenizer.vocab_size}')
      if not tokenizer.made(record.get('tokenizer')):
        raise ValueError(f'its tokens are of tokenizer {record.get("tokenizer")}, not of config.init_from\'s '
                         f'({tokenizer.fingerprint}); build the pairs again with this tokenizer')
    except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
      reason = f'missing field {e}' if isinstance(e, KeyError) else str(e)
      raise errors.UserError(f'{path}:{number}: not a DPO pair ({reason}); expected a line of '
                             f'{PAIRS_FILE} as the dpo stage writes it') from None
    pairs.append(record)
  if not pairs:
    raise errors.UserError(f'{path}: no DPO pairs in this file')
  return pairs


SOURCES_KEY = 'config.dpo.sources'


def read_sources(config, tokenizer: Tokenizer) -> tuple[list[dict[str, Any]], list[sources.Report]]:
  """The pairs of `config.dpo.sources` (TRL preference files, or pair files this stage wrote), each tagged
  with its `source`, and a report per source; every record checked before the first step."""
  pairs, reports = [], []
  for source in sources.parse(config.dpo.sources, key=SOURCES_KEY, formats=sources.PREFERENCE_FORMATS):
    if source.format == 'dpo_pairs':
      read = read_pairs(source.path, tokenizer)
      report = sources.Report(source.label, kept=len(read), digest=sources.digest(source),
                              questions=[p['question'] for p in read if p.get('question')])
    else:
      read, report = sources.preference_pairs(source, tokenizer)
    if not read:
      raise errors.UserError(f'{source.location}: no preference pairs ({SOURCES_KEY}, {source.format})')
    pairs += [{**pair, 'source': source.label} for pair in read]
    reports.append(report)
  return pairs, reports


def load_or_build_pairs(config, workdir: pathlib.Path, model_config: model.ModelConfig, params: Any,
                        tokenizer: Tokenizer) -> list[dict[str, Any]]:
  """The pairs of `config.dpo.sources` if set; else the workdir's pairs (`artifacts.load_or_build` under
  `pairs_fingerprint`), built now on the first run."""
  if config.dpo.get('sources'):
    pairs, reports = read_sources(config, tokenizer)
    eval_settings = evals.Settings.from_config(config.dpo.task_eval)
    evaluated = [e.prompt for e in evals.select(eval_settings, tokenizer)] if eval_settings.per_task_language else []
    artifacts.write_data_report(workdir, reports, train=[q for r in reports for q in r.questions], evaluated=evaluated)
    return pairs
  built = []

  def build():
    examples = pair_prompts(config.dpo, tokenizer, seed=config.seed)
    anchor_examples = (pair_prompts(config.dpo, tokenizer, seed=config.seed, tasks=config.dpo.anchor_tasks,
                                    modes=config.dpo.anchor_modes) if config.dpo.anchor_modes else [])
    pairs, summary = build_pairs(config, model_config, params, tokenizer, examples, anchor_examples)
    if not pairs:
      raise errors.UserError(
          f'no DPO pair from {len(examples)} prompts × {config.dpo.samples_per_prompt} samples of '
          f'{config.init_from!r} ({summary["sampling"]}); sample more (config.dpo.pair_prompts, samples_per_prompt) '
          'or loosen config.dpo.verbose_min_ratio / verbose_min_extra')
    logging.info('DPO pairs: built %d from %d prompts → %s: %s', len(pairs), len(examples), workdir / PAIRS_FILE,
                 {k: v['pairs'] for k, v in summary['pairs'].items() if '/' not in k})
    built.extend(pairs)
    return summary, {PAIRS_FILE: ''.join(json.dumps(p, ensure_ascii=False) + '\n' for p in pairs)}

  artifacts.load_or_build(workdir, PAIRS_SUMMARY, pairs_fingerprint(config, tokenizer), build, what='DPO pairs')
  return built or read_pairs(workdir / PAIRS_FILE, tokenizer)


# ---- reference log-probs -------------------------------------------------------------------------------


def params_digest(params: Any) -> str:
  """sha256 over every leaf's path, dtype, shape and position-weighted checksums of its bits: the model's
  identity, computed where the params are (sharded over any mesh and processes: nothing is gathered)."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    digest.update(f'{jax.tree_util.keystr(path)}:{leaf.dtype}:{leaf.shape};'.encode())
    digest.update(np.asarray(distributed.to_host(_checksums(leaf))).tobytes())
  return digest.hexdigest()


@jax.jit
def _checksums(leaf: jax.Array) -> jax.Array:
  """[3] uint32 sums (wrapping) of the leaf's bits, two of them weighted by position: a changed value or order
  changes them."""
  bits = leaf
  if bits.dtype.itemsize in (2, 4):
    bits = jax.lax.bitcast_convert_type(bits, jnp.uint16 if bits.dtype.itemsize == 2 else jnp.uint32)
  bits = bits.astype(jnp.uint32)
  index = jnp.zeros(leaf.shape, jnp.uint32)   # the row-major position (mod 2³²), built in place: no reshape
  for axis, size in enumerate(leaf.shape):    # of a sharded leaf, which would gather it
    index = index * jnp.uint32(size) + jax.lax.broadcasted_iota(jnp.uint32, leaf.shape, axis)
  return jnp.stack([bits.sum(dtype=jnp.uint32), (bits * (index * jnp.uint32(2654435761) + 1)).sum(dtype=jnp.uint32),
                    ((bits ^ (index * jnp.uint32(40503))) * jnp.uint32(2246822519)).sum(dtype=jnp.uint32)])


def pairs_digest(pairs: Sequence[Mapping[str, Any]]) -> str:
  """sha256 over every pair's tokens and loss masks, in order: the data's identity."""
  digest = hashlib.sha256()
  for pair in pairs:
    digest.update(json.dumps([pair[f'{side}_{feature}'] for side in SIDES for feature in FEATURES]).encode())
  return digest.hexdigest()


def compute_reference_logps(model_config: model.ModelConfig, params: Any, pairs: Sequence[Mapping[str, Any]], *,
                            mesh: jax.sharding.Mesh, batch_size: int, length_multiple: int) -> np.ndarray:
  """[pairs, 2] summed response log-probs (chosen, rejected) under `params`, `batch_size` pairs at a
  time (the last batch filled with repeats, so every batch has the same row count)."""
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  logps = step_lib.MeshFunction(functools.partial(_jitted_pair_logps, model_config), mesh, replicated)
  out = []
  for start in tqdm.trange(0, len(pairs), batch_size, desc='DPO reference log-probs', unit='batch',
                           disable=jax.process_index() != 0):
    indices = [min(i, len(pairs) - 1) for i in range(start, start + batch_size)]
    batch = pair_batch(pairs, indices, length_multiple=length_multiple)
    out.append(distributed.to_host(logps(params, logps.put_batch(logps.local_rows(batch))))[:len(pairs) - start])
  return np.concatenate(out)


def reference_logps(workdir: pathlib.Path, model_config: model.ModelConfig, params: Any,
                    pairs: Sequence[Mapping[str, Any]], *, mesh: jax.sharding.Mesh, batch_size: int,
                    length_multiple: int) -> np.ndarray:
  """`compute_reference_logps`, kept in `workdir/dpo_reference.npy` under a fingerprint of the params, the
  pairs and the model config (the same params under another config, e.g. `config.model_overrides` of
  sliding_window, give other log-probs): reused when all are unchanged, made again otherwise."""
  computed = []

  def build():
    computed.append(compute_reference_logps(model_config, params, pairs, mesh=mesh, batch_size=batch_size,
                                            length_multiple=length_multiple))
    array = io.BytesIO()
    np.save(array, computed[0])
    return {}, {REFERENCE_FILE: array.getvalue()}

  fingerprint = {'params': params_digest(params), 'pairs': pairs_digest(pairs), 'model_config': repr(model_config)}
  artifacts.load_or_build(workdir, REFERENCE_RECORD, fingerprint, build, what='DPO reference log-probs',
                          stale='rebuild')
  return computed[0] if computed else np.load(workdir / REFERENCE_FILE)


# ---- the stage --------------------------------------------------------------------------------------


def check_config(config) -> None:
  """The config errors `run` would otherwise meet only after pair sampling and reference log-probs (numeric
  keys: `luckystar.config.DOMAINS`)."""
  if config.dpo.loss_type not in LOSS_TYPES:
    raise errors.UserError(f'config.dpo.loss_type={config.dpo.loss_type!r}; expected one of {LOSS_TYPES}')


def run(config, workdir: str) -> None:
  if loop.is_finished(config, workdir):
    loop.finish_without_training(config, workdir, progress_keys=PROGRESS_KEYS, summary_keys=SUMMARY_KEYS)
    return
  check_config(config)
  workdir = pathlib.Path(workdir)
  settings = config.dpo
  model_config, mesh, optimizer, state, tokenizer = state_lib.start(config, workdir)
  step_lib.check_rows(config.batch_size, mesh, f'config.batch_size={config.batch_size} pairs')

  # The starting params, before a resumed run restores its checkpoint: the policy that samples and the reference.
  with sharding.activate(mesh):   # pair sampling's rollouts split over the mesh
    pairs = load_or_build_pairs(config, workdir, model_config, state.params, tokenizer)
  reference = reference_logps(workdir, model_config, state.params, pairs, mesh=mesh,
                              batch_size=settings.reference_batch_size, length_multiple=settings.length_multiple)
  weights = (sources.weights(sources.parse(settings.sources, key=SOURCES_KEY)) if settings.get('sources') else None)
  eval_settings = evals.Settings.from_config(settings.task_eval)

  def eval_fn(params, step):
    del step
    with sharding.activate(mesh):   # the params stay sharded; the held-out rollouts split over the mesh
      return evals.evaluate(model_config, params, tokenizer, eval_settings)

  loss = functools.partial(loss_fn, model_config=model_config, beta=settings.beta, loss_type=settings.loss_type,
                           label_smoothing=settings.label_smoothing, ld_alpha=settings.ld_alpha,
                           sft_weight=settings.sft_weight, anchor_weight=settings.anchor_weight)
  update_fn = step_lib.make_update_fn(loss, optimizer, step_lib.state_shardings_of(state), mesh=mesh,
                                      learning_rate=optim.learning_rate_schedule(config),
                                      grad_accum_steps=config.grad_accum_steps, denominator='pairs',
                                      aux_weights=AUX_WEIGHTS)
  batches = training_batches(pairs, reference, batch_size=config.batch_size, seed=config.seed,
                             length_multiple=settings.length_multiple, weights=weights,
                             local_rows=update_fn.local_rows)
  loop.run_training(config, workdir, state=state, update_fn=update_fn, batches=batches,
                    eval_fn=eval_fn if eval_settings.per_task_language else None, model_config=model_config,
                    progress_keys=PROGRESS_KEYS, summary_keys=SUMMARY_KEYS)
