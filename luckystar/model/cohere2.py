"""Cohere2 decoder (Command R7B / Command A) in flax.linen, logit-for-logit equal to transformers.

Parallel block `x + attn(ln(x)) + mlp(ln(x))`; mean-subtracting LayerNorm without
bias; interleaved RoPE on sliding-window layers only (full layers are NoPE);
GQA; embeddings tied to the LM head, logits scaled by `logit_scale`.
Layers are scanned in groups of the `layer_types` period.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

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

  @nn.compact
  def __call__(self, x: Array) -> Array:
    contract = len(self.axes) - len(self.features)
    kernel = self.param('kernel', _init(self.axes), (*x.shape[x.ndim - contract:], *self.features),
                        self.param_dtype)
    dims = ((tuple(range(x.ndim - contract, x.ndim)), tuple(range(contract))), ((), ()))
    return jax.lax.dot_general(x.astype(self.dtype), kernel.astype(self.dtype), dims)


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


def attention_mask(segment_ids: Array, window: int | None) -> Array:
  """[B, 1, T, T] bool: causal, same segment, and (for sliding layers) i - window < j <= i."""
  length = segment_ids.shape[1]
  query, key = jnp.arange(length)[:, None], jnp.arange(length)[None, :]
  allowed = key <= query
  if window is not None:
    allowed &= key > query - window
  same_segment = segment_ids[:, :, None] == segment_ids[:, None, :]
  return (allowed[None] & same_segment)[:, None]


class Attention(nn.Module):
  config: ModelConfig
  sliding: bool

  @nn.compact
  def __call__(self, x: Array, positions: Array, mask: Array) -> Array:
    cfg = self.config
    dense = functools.partial(Projection, dtype=cfg.dtype, param_dtype=cfg.param_dtype)
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
    scores = jnp.einsum('btkgd,bskd->bkgts', q, k, preferred_element_type=jnp.float32) * cfg.head_dim**-0.5
    scores = jnp.where(mask[:, :, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(cfg.dtype)
    out = jnp.einsum('bkgts,bskd->btkgd', probs, v).reshape(batch, length, cfg.num_heads, cfg.head_dim)
    out = constrain(out, ('batch', 'length', 'act_heads', None))
    return dense((cfg.hidden_size,), ('heads', 'head_dim', 'embed'), name='o_proj')(out)


class Mlp(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    dense = functools.partial(Projection, dtype=cfg.dtype, param_dtype=cfg.param_dtype)
    gate = dense((cfg.intermediate_size,), ('embed', 'mlp'), name='gate_proj')(x)
    up = dense((cfg.intermediate_size,), ('embed', 'mlp'), name='up_proj')(x)
    hidden = constrain(nn.silu(gate) * up, ('batch', 'length', 'act_mlp'))
    return dense((cfg.hidden_size,), ('mlp', 'embed'), name='down_proj')(hidden)


class Block(nn.Module):
  """Parallel residual block: one LayerNorm feeds both attention and MLP."""
  config: ModelConfig
  sliding: bool

  @nn.compact
  def __call__(self, x: Array, positions: Array, mask: Array) -> Array:
    h = LayerNorm(self.config.layer_norm_eps, self.config.param_dtype, name='input_layernorm')(x)
    out = x + Attention(self.config, self.sliding, name='self_attn')(h, positions, mask) + Mlp(
        self.config, name='mlp')(h)
    return constrain(out, ('batch', 'length', 'act_embed'))


class LayerGroup(nn.Module):
  """One period of `layer_types` (e.g. 3 sliding + 1 full); the scan body."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, positions: Array, masks: dict[str, Array]) -> tuple[Array, None]:
    for i, layer_type in enumerate(self.config.layer_types[:self.config.layer_period]):
      x = Block(self.config, layer_type == SLIDING, name=f'layer_{i}')(x, positions, masks[layer_type])
    return x, None


class Decoder(nn.Module):
  """tokens [B, T] int → logits [B, T, V] float32."""
  config: ModelConfig

  @nn.compact
  def __call__(self, tokens: Array, positions: Array | None = None, segment_ids: Array | None = None) -> Array:
    cfg = self.config
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    if segment_ids is None:
      segment_ids = jnp.ones_like(tokens)
    embedding = self.param('embedding', _init(('vocab', 'embed')), (cfg.vocab_size, cfg.hidden_size),
                           cfg.param_dtype)
    x = constrain(jnp.take(embedding, tokens, axis=0).astype(cfg.dtype), ('batch', 'length', 'act_embed'))
    masks = {layer_type: attention_mask(segment_ids, cfg.sliding_window if layer_type == SLIDING else None)
             for layer_type in set(cfg.layer_types)}

    group = LayerGroup
    if cfg.remat_policy != 'none':
      group = nn.remat(group, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=False)
    scanned = nn.scan(group, variable_axes={'params': 0}, split_rngs={'params': True},
                      in_axes=(nn.broadcast, nn.broadcast), length=cfg.num_layers // cfg.layer_period,
                      metadata_params={nn.PARTITION_NAME: 'layers'})
    x, _ = scanned(cfg, name='layers')(x, positions, masks)

    x = LayerNorm(cfg.layer_norm_eps, cfg.param_dtype, name='norm')(x)
    logits = jnp.einsum('bte,ve->btv', x, embedding.astype(cfg.dtype), preferred_element_type=jnp.float32)
    return constrain(logits * cfg.logit_scale, ('batch', 'length', 'act_vocab'))
