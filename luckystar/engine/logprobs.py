"""Token log-probabilities of a model on a batch, shared by every stage's loss and eval.

A batch holds tokens, positions, segment_ids, loss_mask [B, T] int; `with_score_columns` adds the columns
where a next token is scored, so that the vocabulary projection runs only there.

Chunked losses: at scale the logits of a batch's scored columns outgrow a device (256 × 8,192 columns of a
256k vocabulary are 2 PB of float32). Past LOGITS_BUDGET per device, or at `ModelConfig.loss_chunk` columns
when set, the projection and what a loss needs of it (cross-entropy, log-probs, entropy) run a chunk of
columns at a time under `jax.checkpoint`, so the backward pass recomputes each chunk's logits instead of
keeping them; the results are the same (tests/test_chunked_loss.py).
"""

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from luckystar import model


def next_token_targets(batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
  """(targets, weights), both [..., T-1] for [..., T] rows: the prediction at position t is scored against
  token t+1, only where token t+1 is trained on (loss_mask) and belongs to the same document as token t."""
  tokens, segments = batch['tokens'], batch['segment_ids']
  same_document = (segments[..., 1:] == segments[..., :-1]) & (segments[..., 1:] > 0)
  weights = (batch['loss_mask'][..., 1:] > 0) & same_document
  return tokens[..., 1:], weights.astype(jnp.float32)


SCORE_COLUMN_MULTIPLE = 64
LOGITS_BUDGET = 1 << 30   # bytes of float32 logits per device that a loss may hold at once


def loss_chunk(model_config: model.ModelConfig, rows: int, columns: int) -> int:
  """Columns per chunk of a loss's vocabulary projection over [rows, columns] scored positions: the config's
  `loss_chunk`, else all of them while their logits fit LOGITS_BUDGET per device, else the most that do."""
  if model_config.loss_chunk:
    return min(model_config.loss_chunk, columns)
  per_column = 4 * rows * model_config.vocab_size / jax.device_count()   # the batch axis splits over devices
  return max(1, min(columns, int(LOGITS_BUDGET // per_column)))


def map_column_chunks(fn, chunk: int, *arrays: jax.Array):
  """fn over [B, chunk, ...] slices of `arrays` ([B, M, ...] each), rematerialised in the backward pass; its
  outputs ([B, chunk, ...] each) put back together as [B, M, ...]. M is padded up to a multiple of `chunk`
  (padding rows are computed and dropped)."""
  columns = arrays[0].shape[1]
  count = -(-columns // chunk)
  def split(a):   # [B, M, ...] → [count, B, chunk, ...]
    a = jnp.pad(a, [(0, 0), (0, count * chunk - columns)] + [(0, 0)] * (a.ndim - 2))
    return jnp.moveaxis(a.reshape(a.shape[0], count, chunk, *a.shape[2:]), 1, 0)
  def join(a):    # [count, B, chunk, ...] → [B, M, ...]
    a = jnp.moveaxis(a, 0, 1)
    return a.reshape(a.shape[0], count * chunk, *a.shape[3:])[:, :columns]
  outputs = jax.lax.map(jax.checkpoint(lambda sliced: fn(*sliced)), tuple(map(split, arrays)))
  return jax.tree.map(join, outputs)


def _scored_states(model_config: model.ModelConfig, params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
  """The final hidden states where next tokens are scored: [B, T-1, E], or [B, M, E] at score_columns."""
  columns = batch.get('score_columns')
  hidden = model.apply(model_config, params, batch['tokens'], batch['positions'], batch['segment_ids'],
                       logit_columns=None if columns is None else jnp.maximum(columns, 0), features_only=True)
  return hidden[:, :-1] if columns is None else hidden


def with_score_columns(batch: Mapping[str, np.ndarray], multiple: int = SCORE_COLUMN_MULTIPLE
                       ) -> dict[str, np.ndarray]:
  """Adds 'score_columns' [B, M] ([B, 2, M] for DPO's [B, 2, T] pair rows: any leading axes are kept):
  per row, the columns t whose next token is trained on (`next_token_targets`), padded with -1; M is the
  longest row's count rounded up to `multiple` (a few batch shapes, each compiled once).
  `token_cross_entropy` then projects onto the vocabulary only there: with ~10–30% of tokens trained,
  most of that projection's FLOPs are skipped. Exact: the loss and its gradient are the same as without it."""
  _, weights = next_token_targets(batch)                 # [..., T-1]
  columns = [np.flatnonzero(row) for row in weights.reshape(-1, weights.shape[-1])]
  width = min(-(-max(1, max(map(len, columns))) // multiple) * multiple, weights.shape[-1])
  padded = np.full((len(columns), width), -1, np.int32)
  for row, found in zip(padded, columns):
    row[:len(found)] = found
  return {**batch, 'score_columns': padded.reshape(*weights.shape[:-1], width)}


def token_cross_entropy(params: Any, batch: Mapping[str, jax.Array], rng: jax.Array | None, *,
                        model_config: model.ModelConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Σ token cross-entropy over trained tokens / their count, over the whole batch.

  batch: tokens, loss_mask, segment_ids, positions, each [B, T] int; optionally score_columns
  [B, M] (`with_score_columns`: logits only where a target is trained).
  aux: loss, accuracy (greedy next-token), tokens (the denominator).
  """
  del rng  # deterministic
  targets, weights = next_token_targets(batch)
  columns = batch.get('score_columns')
  if columns is not None:
    valid, columns = columns >= 0, jnp.maximum(columns, 0)
    targets = jnp.take_along_axis(targets, columns, axis=1)
    weights = jnp.take_along_axis(weights, columns, axis=1) * valid
  scored = lambda logits, targets: (optax.softmax_cross_entropy_with_integer_labels(logits, targets),
                                    jnp.argmax(logits, -1) == targets)
  chunk = loss_chunk(model_config, *targets.shape)
  if chunk == targets.shape[1]:   # the logits fit: one projection, as ever
    if columns is None:
      logits = model.apply(model_config, params, batch['tokens'], batch['positions'], batch['segment_ids'])
      logits = logits[:, :-1]  # [B, T-1, V]; the last position has no next token
    else:
      logits = model.apply(model_config, params, batch['tokens'], batch['positions'], batch['segment_ids'],
                           logit_columns=columns)
    nll, hit = scored(logits, targets)
  else:
    nll, hit = map_column_chunks(lambda h, t: scored(model.head(model_config, params, h), t), chunk,
                                 _scored_states(model_config, params, batch), targets)
  tokens = weights.sum()
  safe_tokens = jnp.maximum(tokens, 1.0)
  loss = (nll * weights).sum() / safe_tokens
  accuracy = (hit * weights).sum() / safe_tokens
  return loss, {'loss': loss, 'accuracy': accuracy, 'tokens': tokens}


def token_logprobs(model_config: model.ModelConfig, params: Any, batch: Mapping[str, jax.Array],
                   temperature: float) -> tuple[jax.Array, jax.Array]:
  """(log π(token t+1 | ≤ t), entropy) of the distribution softmax(logits / temperature) the sampler
  drew from (before top-k / top-p): [B, T-1] over every column t, or [B, M] at `batch['score_columns']`
  (`with_score_columns`: the vocabulary projection only where a generated token is scored)."""
  columns = batch.get('score_columns')
  tokens = next_tokens(batch, batch['tokens'])
  def scored(logits, tokens):
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature)
    return (jnp.take_along_axis(log_probs, tokens[..., None], axis=-1)[..., 0],
            -(jnp.exp(log_probs) * log_probs).sum(-1))
  chunk = loss_chunk(model_config, *tokens.shape)
  if chunk < tokens.shape[1]:
    return map_column_chunks(lambda h, t: scored(model.head(model_config, params, h), t), chunk,
                             _scored_states(model_config, params, batch), tokens)
  if columns is None:
    logits = model.apply(model_config, params, batch['tokens'], batch['positions'], batch['segment_ids'])[:, :-1]
  else:
    logits = model.apply(model_config, params, batch['tokens'], batch['positions'], batch['segment_ids'],
                         logit_columns=jnp.maximum(columns, 0))
  return scored(logits, tokens)


def next_tokens(batch: Mapping[str, jax.Array], values: jax.Array) -> jax.Array:
  """A per-token [B, T] array at t+1 for each scored column t, aligned with `token_logprobs`:
  [B, T-1], or [B, M] at `batch['score_columns']` (0 at padding columns, -1)."""
  columns = batch.get('score_columns')
  if columns is None:
    return values[:, 1:]
  picked = jnp.take_along_axis(values, jnp.maximum(columns, 0) + 1, axis=1)
  return jnp.where(columns >= 0, picked, jnp.zeros_like(picked))
