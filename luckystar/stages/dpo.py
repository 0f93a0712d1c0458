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
pairs move this one (experiments/sweeps/dpo_anchors.md). Each term is a mean over rows (pairs and
anchors), so the loss is Σ over rows / rows and gradient accumulation stays exact
(`step.accumulate_gradients`, denominator 'pairs'). Only response tokens count (`loss_mask`, as
`Tokenizer.render` and the sampler lay it out): prompt and tool-result tokens have weight 0 in every
log-prob here.

The stage (`run`):
  1. Pairs (`engine.pairs`, its docstring says how they are made): preference pairs and anchor rows sampled
     from the starting policy in `workdir/dpo_pairs.jsonl`, reused on a re-run; or the preference data of
     `config.dpo.sources`.
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

import functools
import hashlib
import io
import json
import pathlib
from typing import Any, Callable, Mapping, Sequence

import grain
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from luckystar import distributed
from luckystar import errors
from luckystar import model
from luckystar.data import pipeline
from luckystar.engine import artifacts, evals, logprobs, loop, optim
from luckystar.engine import pairs as pairs_lib
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib
from luckystar.engine.pairs import ANCHOR, SIDES
from luckystar.model import sharding

LOSS_TYPES = ('sigmoid', 'robust', 'ipo', 'hinge')
REFERENCE_FILE = 'dpo_reference.npy'  # [pairs, 2] float32
REFERENCE_RECORD = 'dpo_reference.json'  # its fingerprint
FEATURES = ('tokens', 'loss_mask')
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
    pairs = pairs_lib.load_or_build_pairs(config, workdir, model_config, state.params, tokenizer)
  reference = reference_logps(workdir, model_config, state.params, pairs, mesh=mesh,
                              batch_size=settings.reference_batch_size, length_multiple=settings.length_multiple)
  weights = pairs_lib.source_weights(settings)
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
