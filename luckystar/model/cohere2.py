"""Cohere2 decoder (Command R7B / Command A) in flax.linen, logit-for-logit equal to transformers.

Parallel block `x + attn(ln(x)) + mlp(ln(x))`; mean-subtracting LayerNorm without
bias; interleaved RoPE on sliding-window layers only (full layers are NoPE);
GQA; embeddings tied to the LM head, logits scaled by `logit_scale`.
Layers are scanned in groups of the `layer_types` period.

Decoding with a KV cache (`Decoder(..., cache=...)`, see `init_cache`): every row
has its own cursor `index[b]`, the next column it writes; a row's tokens sit at
columns 0.. in order, so column c has position c and RoPE sees exactly the
positions of the unpadded row. A call appends a right-padded chunk [B, T] of
which row b takes `lengths[b]` tokens (0: the row is left as it was), so one
program serves a prefill of prompts of different lengths, a decode step of the
rows still running, and a tool turn spliced into the rows that called a tool,
each row at its own length. Full-attention layers keep every column (a buffer
of `max_length`); sliding layers keep a ring buffer of
`min(sliding_window, max_length)` columns (column c lives in slot c % size),
all the window ever needs. The cache follows the scan: its per-layer buffers
[groups, batch, kv_heads, slots, head_dim] carry a leading axis of layer groups
and travel whole in the scan carry, so that a decode step writes its column in
place (then attends over the updated buffer) instead of copying buffers in and
out of the scan.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from luckystar.model import attention as attention_lib
from luckystar.model.config import REMAT_POLICY_NAMES, SLIDING, ModelConfig

Array = jax.Array

REMAT_POLICIES = {  # 'none' (no rematerialisation) keeps every activation
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    'save_dots': jax.checkpoint_policies.checkpoint_dots,
}
assert set(REMAT_POLICIES) | {'none'} == set(REMAT_POLICY_NAMES)


def _init(axes: tuple[str | None, ...], stddev: float = 0.02):
  return nn.with_logical_partitioning(nn.initializers.normal(stddev), axes)


def constrain(x: Array, axes: tuple[str | None, ...]) -> Array:
  """Activation sharding constraint by logical names (a no-op outside `sharding.activate`)."""
  return nn.with_logical_constraint(x, axes)


class Projection(nn.Module):
  """x @ kernel, contracting x's last `len(kernel_shape) - len(features)` axes.

  The kernel is [*contracted, *features] with logical names `axes`. (flax's DenseGeneral
  initialises a flattened kernel, which breaks multi-axis logical sharding under a mesh.)
  """
  features: tuple[int, ...]
  axes: tuple[str | None, ...]
  dtype: Any
  param_dtype: Any
  quant: Any = None   # luckystar.quant.QuantSettings: the same matmul with AQT int weights; None: float

  @nn.compact
  def __call__(self, x: Array) -> Array:
    contract = len(self.axes) - len(self.features)
    shape = (*x.shape[x.ndim - contract:], *self.features)
    # One 2-D matmul: XLA:CPU's backward of a 3-D dot_general is several times slower.
    leading, contracted = x.shape[:x.ndim - contract], int(np.prod(x.shape[x.ndim - contract:]))
    lhs = x.reshape(-1, contracted).astype(self.dtype)
    if self.quant is not None:
      out = self.quant.matmul(self, lhs, shape, _init(self.axes))
    else:
      kernel = self.param('kernel', _init(self.axes), shape, self.param_dtype)
      out = jnp.dot(lhs, kernel.reshape(contracted, -1).astype(self.dtype))
    return out.reshape(*leading, *self.features)


class LayerNorm(nn.Module):
  """Cohere's LayerNorm: subtracts the mean, fp32 statistics, a weight and no bias."""
  eps: float
  param_dtype: Any
  axes: tuple[str | None, ...] = ('embed',)

  @nn.compact
  def __call__(self, x: Array) -> Array:
    shape = x.shape[-len(self.axes):]
    weight = self.param('weight', nn.with_logical_partitioning(nn.initializers.ones, self.axes),
                        shape, self.param_dtype)
    h = x.astype(jnp.float32)  # statistics over the last axis only (QK-norm: per head)
    mean = h.mean(-1, keepdims=True)
    var = jnp.square(h - mean).mean(-1, keepdims=True)
    h = (h - mean) * jax.lax.rsqrt(var + self.eps)
    return (weight.astype(jnp.float32) * h).astype(x.dtype)


def apply_rope(x: Array, positions: Array, theta: float) -> Array:
  """Interleaved (GPT-J style) rotary embedding: pairs (2i, 2i+1). x: [B, T, N, D], positions: [B, T]."""
  head_dim = x.shape[-1]
  inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)  # [D/2]
  angles = positions.astype(jnp.float32)[:, :, None, None] * inv_freq  # [B, T, 1, D/2]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  h = x.astype(jnp.float32)
  even, odd = h[..., 0::2], h[..., 1::2]
  rotated = jnp.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1)
  return rotated.reshape(x.shape).astype(x.dtype)


# Logical axis names of one layer's cache buffers [groups, batch, kv_heads, slots, head_dim]
# (kv_heads before slots: the attention matmuls then read the cache without a transpose).
CACHE_AXES = ('layers', 'batch', 'act_kv_heads', 'length', None)


def cache_slots(config: ModelConfig, sliding: bool, max_length: int) -> int:
  """Columns a layer keeps: the whole context for full layers, the window (as a ring) for sliding ones."""
  return min(config.sliding_window, max_length) if sliding else max_length


def slot_columns(index: Array, slots: int) -> Array:
  """[B, slots] the column each ring slot of row b holds once its columns < index[b] are written;
  negative = never written."""
  last = index[:, None] - 1
  return last - jnp.mod(last - jnp.arange(slots), slots)


def cache_key_columns(index: Array, length: int, slots: int) -> Array:
  """[B, keys] the columns of the keys that T = length new tokens at columns index[b].. attend to.

  One token (a decode step) is written first and attends to the cache alone, the order that lets
  the write happen in place. A chunk (a prefill) attends to [the cache before the write; the chunk
  itself], since a ring buffer cannot hold a chunk longer than itself.
  """
  if length == 1:
    return slot_columns(index + 1, slots)
  return jnp.concatenate([slot_columns(index, slots), index[:, None] + jnp.arange(length)], axis=1)


def cached_attention_mask(index: Array, length: int, slots: int, window: int | None) -> Array:
  """[B, 1, T, keys] bool for T new tokens at columns index[b].. (keys: `cache_key_columns`).

  Key column k is visible from query column q iff 0 <= k <= q (written, causal) and, for sliding
  layers, q - window < k. A chunk's padding columns (past a row's length) are never keys of its real
  tokens, which come before them.
  """
  queries = index[:, None] + jnp.arange(length)                                  # [B, T]
  keys = cache_key_columns(index, length, slots)                                 # [B, keys]
  allowed = attention_lib.causal(queries[:, :, None], keys[:, None, :], window)
  return (allowed & (keys[:, None, :] >= 0))[:, None]


def write_cache(buffer: Array, new: Array, index: Array, end: Array) -> Array:
  """Ring write of row b's new [B, K, T, D] columns index[b]..end[b]-1 into buffer [B, K, slots, D]; only
  the last `slots` of them survive when a row writes more than the ring holds."""
  slots, length = buffer.shape[2], new.shape[2]
  columns = slot_columns(end, slots)               # [B, slots]: the newest column of each slot after the write
  offsets = jnp.clip(columns - index[:, None], 0, length - 1)
  take = jnp.take_along_axis(new.astype(buffer.dtype), offsets[:, None, :, None], axis=2)
  return jnp.where((columns >= index[:, None])[:, None, :, None], take, buffer)


def attend_and_update_cache(q: Array, k: Array, v: Array, cache: dict[str, Array], group: Array, index: Array,
                            end: Array, mask: Array, dtype: Any) -> tuple[Array, dict[str, Array]]:
  """New tokens' attention over the cache of layer group `group`, and the cache with them written in.

  q [B, T, K, G, D]; k, v [B, T, K, D]; row b's new columns are index[b]..end[b]-1; cache {'k', 'v'}:
  [groups, B, K, slots, D] (all groups: they travel in the scan carry, so a decode step updates them in
  place rather than copying them).
  """
  new = {'k': jnp.swapaxes(k, 1, 2), 'v': jnp.swapaxes(v, 1, 2)}                 # [B, K, T, D]
  if k.shape[1] == 1:  # decode: write each row's column (a row that takes no token writes at its
    # cursor, which its next token overwrites), then attend to the cache alone
    rows, slot = jnp.arange(index.shape[0]), jnp.mod(index, cache['k'].shape[3])
    cache = {name: cache[name].at[group, rows, :, slot].set(new[name][:, :, 0].astype(cache[name].dtype),
                                                             unique_indices=True) for name in cache}
    current = {name: jax.lax.dynamic_index_in_dim(cache[name], group, keepdims=False) for name in cache}
    out = attention_lib.attend_blocks(q, [(current['k'], current['v'])], mask, dtype)
  else:                # prefill: attend to [old cache; chunk], then write
    old = {name: jax.lax.dynamic_index_in_dim(cache[name], group, keepdims=False) for name in cache}
    out = attention_lib.attend_blocks(q, [(old['k'], old['v']), (new['k'], new['v'])], mask, dtype)
    cache = {name: jax.lax.dynamic_update_index_in_dim(cache[name], write_cache(old[name], new[name], index, end),
                                                       group, axis=0) for name in cache}
  return out, {name: constrain(buffer, CACHE_AXES) for name, buffer in cache.items()}


class Attention(nn.Module):
  """Training: attends within the rows of x, `context` being their segment ids [B, T], through
  `attention.attend` (the backend of `config.attention_impl`). Decoding, with `cache` ({'k', 'v'} of
  every group, see `attend_and_update_cache`), the layer group `group` and `span` = (index, end) [B],
  each row's new columns: `context` is this layer's `cached_attention_mask`; returns (out, updated cache)."""
  config: ModelConfig
  sliding: bool

  @nn.compact
  def __call__(self, x: Array, positions: Array, context: Array, cache: dict[str, Array] | None = None,
               group: Array | None = None, span: tuple[Array, Array] | None = None):
    cfg = self.config
    dense = functools.partial(Projection, dtype=cfg.dtype, param_dtype=cfg.param_dtype, quant=cfg.quant)
    q = dense((cfg.num_heads, cfg.head_dim), ('embed', 'heads', 'head_dim'), name='q_proj')(x)
    k = dense((cfg.num_kv_heads, cfg.head_dim), ('embed', 'kv_heads', 'head_dim'), name='k_proj')(x)
    v = dense((cfg.num_kv_heads, cfg.head_dim), ('embed', 'kv_heads', 'head_dim'), name='v_proj')(x)
    if cfg.use_qk_norm:
      q = LayerNorm(cfg.layer_norm_eps, cfg.param_dtype, ('heads', 'head_dim'), name='q_norm')(q)
      k = LayerNorm(cfg.layer_norm_eps, cfg.param_dtype, ('kv_heads', 'head_dim'), name='k_norm')(k)
    if self.sliding or cfg.rope_on_full_layers:
      q, k = apply_rope(q, positions, cfg.rope_theta), apply_rope(k, positions, cfg.rope_theta)
    q = constrain(q, ('batch', 'length', 'act_heads', None))
    k = constrain(k, ('batch', 'length', 'act_kv_heads', None))

    batch, length = x.shape[:2]
    groups = cfg.num_heads // cfg.num_kv_heads  # query head h uses KV head h // groups
    q = q.reshape(batch, length, cfg.num_kv_heads, groups, cfg.head_dim)
    if cache is None:
      out = attention_lib.attend(q, k, v, context, window=cfg.sliding_window if self.sliding else None,
                                 impl=cfg.attention_impl, dtype=cfg.dtype, block=cfg.attention_block)
    else:
      out, cache = attend_and_update_cache(q, k, v, cache, group, *span, context, cfg.dtype)
    out = out.reshape(batch, length, cfg.num_heads, cfg.head_dim)
    out = constrain(out, ('batch', 'length', 'act_heads', None))
    out = dense((cfg.hidden_size,), ('heads', 'head_dim', 'embed'), name='o_proj')(out)
    return out if cache is None else (out, cache)


class Mlp(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    dense = functools.partial(Projection, dtype=cfg.dtype, param_dtype=cfg.param_dtype, quant=cfg.quant)
    gate = dense((cfg.intermediate_size,), ('embed', 'mlp'), name='gate_proj')(x)
    up = dense((cfg.intermediate_size,), ('embed', 'mlp'), name='up_proj')(x)
    hidden = constrain(nn.silu(gate) * up, ('batch', 'length', 'act_mlp'))
    return dense((cfg.hidden_size,), ('mlp', 'embed'), name='down_proj')(hidden)


class Block(nn.Module):
  """Parallel residual block: one LayerNorm feeds both attention and MLP."""
  config: ModelConfig
  sliding: bool

  @nn.compact
  def __call__(self, x: Array, positions: Array, context: Array, cache: dict[str, Array] | None = None,
               group: Array | None = None, span: tuple[Array, Array] | None = None):
    # Training keeps the residual stream split over the sequence ('act_seq', see model.sharding); the
    # branches work on whole rows, gathered while still [B, T, E] and summed back whole, so that the
    # projections' flattened [B·T, E] matmuls never meet a sequence-split operand or cotangent (GSPMD
    # reshards those by replicating them).
    residual = ('batch', 'act_seq' if cache is None else 'length', 'act_embed')
    whole = ('batch', 'length', 'act_embed')
    h = constrain(LayerNorm(self.config.layer_norm_eps, self.config.param_dtype, name='input_layernorm')(x), whole)
    attention = Attention(self.config, self.sliding, name='self_attn')(h, positions, context, cache, group, span)
    if cache is not None:
      attention, cache = attention
    mlp = Mlp(self.config, name='mlp')(h)
    if cache is None:   # decoding's residual is whole already: one constraint on the sum, as before
      attention, mlp = constrain(attention, whole), constrain(mlp, whole)
    out = constrain(x + attention + mlp, residual)
    return out if cache is None else (out, cache)


class LayerGroup(nn.Module):
  """One period of `layer_types` (e.g. 3 sliding + 1 full); the scan body.

  The carry is x [B, T, E], or when decoding (x, caches, group, span): the caches of every group
  ({'layer_i': {'k', 'v'}}), this group's number and (index, end) [B], each row's new columns. `context` is the rows'
  segment ids [B, T] when training, {layer type: cached mask} when decoding. With
  `remat_scope='layer'` each block is rematerialised on its own (the backward pass then holds one
  layer's recomputed activations at a time, not the group's).
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, carry, positions: Array, context: Array | dict[str, Array]):
    cfg = self.config
    x, caches = (carry, None) if not isinstance(carry, tuple) else (carry[0], dict(carry[1]))
    block_class = Block
    if caches is None and cfg.remat_policy != 'none' and cfg.remat_scope == 'layer':
      block_class = nn.remat(Block, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=False)
    for i, layer_type in enumerate(cfg.layer_types[:cfg.layer_period]):
      block = block_class(cfg, layer_type == SLIDING, name=f'layer_{i}')
      if caches is None:
        x = block(x, positions, context)
      else:
        group, span = carry[2], carry[3]
        x, caches[f'layer_{i}'] = block(x, positions, context[layer_type], caches[f'layer_{i}'], group, span)
    return (x if caches is None else (x, caches, carry[2] + 1, carry[3])), None


class Decoder(nn.Module):
  """tokens [B, T] int → logits [B, T, V] float32.

  With `cache` (see `init_cache`): row b appends tokens[b, :lengths[b]] (default all T) at its own
  cursor, positions and masks come from the cache, and the call returns (logits, updated cache).
  `last_only` keeps only the logits of each row's last new token ([B, 1, V]), all a sampler needs
  after a prefill. Without a cache,
  `logit_columns` [B, M] int returns logits at those columns only ([B, M, V]): a loss that scores a
  few positions skips most of the vocabulary projection (a large share of a small model's FLOPs).
  `features_only` returns the final hidden states there instead ([B, M, E], before the final norm), and
  `hidden` runs the head alone on such states: a loss projects them onto the vocabulary in chunks.
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, tokens: Array, positions: Array | None = None, segment_ids: Array | None = None,
               cache: dict[str, Any] | None = None, last_only: bool = False, logit_columns: Array | None = None,
               lengths: Array | None = None, features_only: bool = False, hidden: Array | None = None):
    cfg = self.config
    if hidden is not None:   # the head alone, on states a features_only call returned
      return self._logits(hidden, self._embedding())
    if cache is not None:
      if positions is not None or segment_ids is not None:
        raise ValueError('with a cache, positions come from cache["index"]; do not pass positions/segment_ids')
      return self._extend(tokens, cache, lengths, last_only)
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    if segment_ids is None:
      segment_ids = jnp.ones_like(tokens)
    embedding = self._embedding()
    x = constrain(jnp.take(embedding, tokens, axis=0).astype(cfg.dtype), ('batch', 'act_seq', 'act_embed'))
    group = LayerGroup
    if cfg.remat_policy != 'none' and cfg.remat_scope == 'group':
      group = nn.remat(group, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=False)
    scanned = nn.scan(group, variable_axes={'params': 0}, split_rngs={'params': True},
                      in_axes=(nn.broadcast, nn.broadcast), length=cfg.num_layers // cfg.layer_period,
                      metadata_params={nn.PARTITION_NAME: 'layers'})
    x, _ = scanned(cfg, name='layers')(x, positions, segment_ids)
    if logit_columns is not None:  # [B, M]: the vocabulary projection only where a loss needs it
      x = jnp.take_along_axis(x, logit_columns[..., None], axis=1)
    return x if features_only else self._logits(x, embedding)

  def _embedding(self) -> Array:
    cfg = self.config
    return self.param('embedding', _init(('vocab', 'embed')), (cfg.embedding_rows, cfg.hidden_size), cfg.param_dtype)

  def _logits(self, x: Array, embedding: Array) -> Array:
    cfg = self.config
    x = LayerNorm(cfg.layer_norm_eps, cfg.param_dtype, name='norm')(x)
    logits = jnp.einsum('bte,ve->btv', x, embedding.astype(cfg.dtype), preferred_element_type=jnp.float32)
    logits = constrain(logits * cfg.logit_scale, ('batch', 'length', 'act_vocab'))
    return logits[..., :cfg.vocab_size] if cfg.vocab_padding else logits   # padding rows are never a token

  def _extend(self, tokens: Array, cache: dict[str, Any], lengths: Array | None, last_only: bool
              ) -> tuple[Array, dict[str, Any]]:
    """Appends row b's tokens[b, :lengths[b]] (default all T) at its columns cache['index'][b]..; (logits,
    new cache). With last_only, the logits of each row's last new token ([B, 1, V]; junk where lengths is 0)."""
    cfg = self.config
    index, length = cache['index'], tokens.shape[1]
    lengths = jnp.full_like(index, length) if lengths is None else lengths.astype(index.dtype)
    positions = index[:, None] + jnp.arange(length)
    embedding = self._embedding()
    x = constrain(jnp.take(embedding, tokens, axis=0).astype(cfg.dtype), ('batch', 'length', 'act_embed'))
    layer_types = cfg.layer_types[:cfg.layer_period]
    masks = {}
    for i, layer_type in enumerate(layer_types):
      slots = cache['layers'][f'layer_{i}']['k'].shape[3]
      window = cfg.sliding_window if layer_type == SLIDING else None
      masks[layer_type] = cached_attention_mask(index, length, slots, window)
    # No remat: decoding takes no gradients. Same module names as training, so the same params.
    # Fully unrolled (unroll=0; jax reads unroll=True as 1 for a single group), so the groups' cache
    # buffers are updated in place rather than copied through a loop; compile time grows with depth.
    scanned = nn.scan(LayerGroup, variable_axes={'params': 0}, split_rngs={'params': True},
                      in_axes=(nn.broadcast, nn.broadcast), length=cfg.num_layers // cfg.layer_period, unroll=0,
                      metadata_params={nn.PARTITION_NAME: 'layers'})
    span = (index, index + lengths)
    (x, layers, _, _), _ = scanned(cfg, name='layers')((x, cache['layers'], jnp.int32(0), span), positions, masks)
    if last_only:
      # a one-hot sum rather than a gather, which GSPMD can only partition by replicating x
      last = jnp.arange(length) == jnp.maximum(lengths - 1, 0)[:, None]
      x = x if length == 1 else jnp.einsum('bte,bt->be', x, last.astype(x.dtype))[:, None]
    return self._logits(x, embedding), {'index': index + lengths, 'layers': layers}
