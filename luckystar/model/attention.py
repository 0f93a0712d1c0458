"""Attention, one entry point for training (`attend`) and cached decoding (`attend_blocks`), with backends
chosen by `ModelConfig.attention_impl`:

    xla        scores [B, K, G, T, T] in fp32, masked, softmaxed: the reference, what transformers computes
    blockwise  online softmax over key blocks (pure JAX, a custom VJP that recomputes the probabilities in the
               backward pass): never forms [T, T], and visits only the key blocks a query block can see,
               causal blocks for full layers and the band for sliding ones; memory O(T·D) per head
    cudnn      `jax.nn.dot_product_attention(implementation='cudnn')` on GPU: causal, local window; rows packed
               with several segments fall back to blockwise (it takes no segment ids)
    splash     Pallas splash attention on TPU (segment ids, causal and local masks); `interpret=True` runs its
               kernel on CPU for tests
    auto       per platform (`resolve`): blockwise on CPU (faster than xla from 128 tokens up, the bundled
               `bench` step included: docs/benchmarks.md); cudnn on GPU; splash on TPU

Masks everywhere: key j is visible from query i iff j <= i, segment_ids equal, and for a sliding layer
i - window < j. q [B, T, K, G, D] (G query heads per KV head), k, v [B, T, K, D].
"""

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from luckystar.model.config import ATTENTION_IMPLS as IMPLS
from luckystar.model.config import ModelConfig

Array = jax.Array

DEFAULT_BLOCK = ModelConfig.attention_block
SPLASH_LANES = 128   # splash blocks are multiples of the TPU's 128 lanes


def resolve(impl: str, platform: str | None = None) -> str:
  """The backend that runs `impl` on `platform` (default: jax's default backend); cudnn and splash off their
  accelerator run the same math blockwise."""
  if impl not in IMPLS:
    raise ValueError(f'attention_impl {impl!r} is not one of {IMPLS}')
  platform = platform or jax.default_backend()
  if impl == 'auto':
    impl = {'gpu': 'cudnn', 'tpu': 'splash'}.get(platform, 'blockwise')
  if (impl == 'cudnn' and platform != 'gpu') or (impl == 'splash' and platform != 'tpu'):
    return 'blockwise'
  return impl


def causal(query: Array, key: Array, window: int | None) -> Array:
  """The one causal + window rule, broadcast over query and key positions (training masks and the cache's)."""
  allowed = key <= query
  if window is not None:
    allowed &= key > query - window
  return allowed


def visible(segment_ids_q: Array, segment_ids_k: Array, query: Array, key: Array, window: int | None) -> Array:
  """[B, Tq, Tk] bool: causal, same segment, and inside the window. query [Tq], key [Tk]: token positions."""
  allowed = causal(query[:, None], key[None, :], window)
  return allowed[None] & (segment_ids_q[:, :, None] == segment_ids_k[:, None, :])


def attend(q: Array, k: Array, v: Array, segment_ids: Array, *, window: int | None, impl: str = 'auto',
           dtype: Any = jnp.float32, block: int = DEFAULT_BLOCK) -> Array:
  """Training attention within rows: q [B, T, K, G, D], k, v [B, T, K, D], segment_ids [B, T] → [B, T, K, G, D]."""
  impl = resolve(impl)
  if impl == 'xla':
    return _xla(q, k, v, segment_ids, window, dtype)
  if impl == 'cudnn':
    return fused(q, k, v, segment_ids, window=window, dtype=dtype)
  if impl == 'splash':
    return splash(q, k, v, segment_ids, window=window, dtype=dtype, block=block)
  return blockwise(q, k, v, segment_ids, window=window, dtype=dtype, block=block)


def _xla(q, k, v, segment_ids, window, dtype):
  length = q.shape[1]
  positions = jnp.arange(length)
  mask = visible(segment_ids, segment_ids, positions, positions, window)                 # [B, T, T]
  scores = jnp.einsum('btkgd,bskd->bkgts', q, k, preferred_element_type=jnp.float32) * q.shape[-1]**-0.5
  scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
  return jnp.einsum('bkgts,bskd->btkgd', probs, v.astype(dtype))


# ---- blockwise: online softmax with a recomputing backward pass -----------------------------------------


def blockwise(q: Array, k: Array, v: Array, segment_ids: Array, *, window: int | None, dtype: Any = jnp.float32,
              block: int = DEFAULT_BLOCK) -> Array:
  """`attend` by blocks of `block` queries and keys; the same values as `_xla` up to fp32 rounding."""
  length = q.shape[1]
  size = min(block, length)
  q, k, v, segment_ids = _pad_to_blocks(q, k, v, segment_ids, size)
  qt = jnp.einsum('btkgd->bkgtd', q)
  kt, vt = jnp.einsum('btkd->bktd', k), jnp.einsum('btkd->bktd', v.astype(dtype))
  out = _flash(qt, kt, vt, segment_ids.astype(jnp.int32), window, size)
  return jnp.einsum('bkgtd->btkgd', out)[:, :length].astype(dtype)


def _pad_to_blocks(q, k, v, segment_ids, size):
  """Rows padded at the end to a multiple of `size` tokens; padding gets segment -1, so it sees only itself
  and nothing real sees it."""
  pad = -q.shape[1] % size
  if pad:
    q, k, v = (jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)) for x in (q, k, v))
    segment_ids = jnp.pad(segment_ids, [(0, 0), (0, pad)], constant_values=-1)
  return q, k, v, segment_ids


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def _key_range(i: Array, size: int, window: int | None) -> tuple[Array, Array]:
  """[first, last] key block that query block i can see."""
  first = 0 if window is None else jnp.maximum(0, (i * size - window + 1) // size)
  return first, i


def _query_range(j: Array, size: int, blocks: int, window: int | None) -> tuple[Array, Array]:
  """[first, last] query block that can see key block j."""
  last = blocks - 1 if window is None else jnp.minimum(blocks - 1, (j * size + size - 1 + window - 1) // size)
  return j, last


def _slice(x: Array, index: Array, size: int, axis: int) -> Array:
  return jax.lax.dynamic_slice_in_dim(x, index * size, size, axis=axis)


def _scores(q_block, k_block, seg_q, seg_k, i, j, size, window):
  """(scaled fp32 scores [B, K, G, bq, bk], visibility [B, 1, 1, bq, bk]) of query block i against key block j."""
  scores = jnp.einsum('bkgtd,bksd->bkgts', q_block, k_block.astype(q_block.dtype),
                      preferred_element_type=jnp.float32) * q_block.shape[-1]**-0.5
  positions = jnp.arange(size)
  mask = visible(seg_q, seg_k, i * size + positions, j * size + positions, window)[:, None, None]
  return scores, mask


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q, k, v, segment_ids, window, size):
  return _flash_forward(q, k, v, segment_ids, window, size)[0]


def _flash_forward(q, k, v, segment_ids, window, size):
  """q [B, K, G, T, D], k, v [B, K, T, D] → (out [B, K, G, T, D] fp32, logsumexp [B, K, G, T])."""
  batch, kv_heads, groups, length, head_dim = q.shape
  blocks = length // size

  def query_block(i):
    q_block, seg_q = _slice(q, i, size, 3), _slice(segment_ids, i, size, 1)

    def key_block(j, carry):
      out, top, total = carry
      scores, mask = _scores(q_block, _slice(k, j, size, 2), seg_q, _slice(segment_ids, j, size, 1), i, j, size,
                             window)
      new_top = jnp.maximum(top, jnp.where(mask, scores, -jnp.inf).max(-1))
      safe = jnp.where(jnp.isfinite(new_top), new_top, 0.0)   # a row that has seen no key yet
      probs = jnp.where(mask, jnp.exp(scores - safe[..., None]), 0.0)
      rescale = jnp.exp(top - safe)
      values = _slice(v, j, size, 2)
      out = out * rescale[..., None] + jnp.einsum('bkgts,bksd->bkgtd', probs.astype(values.dtype), values,
                                                  preferred_element_type=jnp.float32)
      return out, new_top, total * rescale + probs.sum(-1)

    first, last = _key_range(i, size, window)
    init = (jnp.zeros((batch, kv_heads, groups, size, head_dim), jnp.float32),
            jnp.full((batch, kv_heads, groups, size), -jnp.inf, jnp.float32),
            jnp.zeros((batch, kv_heads, groups, size), jnp.float32))
    out, top, total = jax.lax.fori_loop(first, last + 1, key_block, init)
    return out / total[..., None], top + jnp.log(total)   # every row sees itself: total > 0

  outs, logsumexps = jax.lax.map(query_block, jnp.arange(blocks))   # [blocks, B, K, G, size, ...]
  out = jnp.moveaxis(outs, 0, 3).reshape(batch, kv_heads, groups, length, head_dim)
  logsumexp = jnp.moveaxis(logsumexps, 0, 3).reshape(batch, kv_heads, groups, length)
  return out, logsumexp


def _flash_fwd(q, k, v, segment_ids, window, size):
  out, logsumexp = _flash_forward(q, k, v, segment_ids, window, size)
  return out, (q, k, v, segment_ids, out, logsumexp)


def _flash_bwd(window, size, residuals, d_out):
  q, k, v, segment_ids, out, logsumexp = residuals
  batch, kv_heads, groups, length, head_dim = q.shape
  blocks, scale = length // size, head_dim**-0.5
  d_out = d_out.astype(jnp.float32)
  delta = (d_out * out).sum(-1)                                                # [B, K, G, T]

  def probs_and_dscores(i, j):
    q_block, d_block = _slice(q, i, size, 3), _slice(d_out, i, size, 3)
    scores, mask = _scores(q_block, _slice(k, j, size, 2), _slice(segment_ids, i, size, 1),
                           _slice(segment_ids, j, size, 1), i, j, size, window)
    probs = jnp.where(mask, jnp.exp(scores - _slice(logsumexp, i, size, 3)[..., None]), 0.0)
    d_probs = jnp.einsum('bkgtd,bksd->bkgts', d_block, _slice(v, j, size, 2).astype(jnp.float32))
    return probs, probs * (d_probs - _slice(delta, i, size, 3)[..., None]), q_block, d_block

  def dq_block(i):
    def key_block(j, dq):
      _, d_scores, _, _ = probs_and_dscores(i, j)
      return dq + jnp.einsum('bkgts,bksd->bkgtd', d_scores, _slice(k, j, size, 2).astype(jnp.float32)) * scale
    first, last = _key_range(i, size, window)
    return jax.lax.fori_loop(first, last + 1, key_block, jnp.zeros((batch, kv_heads, groups, size, head_dim)))

  def dkv_block(j):
    def query_block(i, carry):
      dk, dv = carry
      probs, d_scores, q_block, d_block = probs_and_dscores(i, j)
      dv = dv + jnp.einsum('bkgts,bkgtd->bksd', probs, d_block)
      return dk + jnp.einsum('bkgts,bkgtd->bksd', d_scores, q_block.astype(jnp.float32)) * scale, dv
    first, last = _query_range(j, size, blocks, window)
    zeros = jnp.zeros((batch, kv_heads, size, head_dim))
    return jax.lax.fori_loop(first, last + 1, query_block, (zeros, zeros))

  dq = jnp.moveaxis(jax.lax.map(dq_block, jnp.arange(blocks)), 0, 3).reshape(q.shape)
  dk, dv = jax.lax.map(dkv_block, jnp.arange(blocks))
  dk, dv = (jnp.moveaxis(x, 0, 2).reshape(k.shape) for x in (dk, dv))
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_flash.defvjp(_flash_fwd, _flash_bwd)


# ---- cuDNN (GPU) and splash (TPU) -------------------------------------------------------------------------


def fused(q: Array, k: Array, v: Array, segment_ids: Array, *, window: int | None, dtype: Any = jnp.float32,
          implementation: str | None = 'cudnn') -> Array:
  """`jax.nn.dot_product_attention` (cuDNN's fused kernel by default) for rows of one segment with padding at
  the end: causal, local window and sequence lengths, which it takes without a [T, T] mask. Packed rows (a
  second segment) it cannot express without one, so a batch holding any goes blockwise. Padding queries
  (segment 0) come out as zeros rather than attending among themselves; nothing real reads them."""
  batch, length, kv_heads, groups, head_dim = q.shape

  def kernel(_):
    lengths = (segment_ids != 0).sum(-1).astype(jnp.int32)
    out = jax.nn.dot_product_attention(
        q.reshape(batch, length, kv_heads * groups, head_dim).astype(dtype), k.astype(dtype), v.astype(dtype),
        is_causal=True, local_window_size=None if window is None else (window - 1, 0),
        query_seq_lengths=lengths, key_value_seq_lengths=lengths, implementation=implementation)
    return out.reshape(q.shape)

  one_segment = jnp.all(segment_ids <= 1) & jnp.all(jnp.diff(segment_ids, axis=1) <= 0)
  return jax.lax.cond(one_segment, kernel, lambda _: blockwise(q, k, v, segment_ids, window=window, dtype=dtype),
                      None)


def splash(q: Array, k: Array, v: Array, segment_ids: Array, *, window: int | None, dtype: Any = jnp.float32,
           block: int = DEFAULT_BLOCK, interpret: bool = False) -> Array:
  """Pallas splash attention (TPU; `interpret=True` runs the kernel anywhere, slowly, for tests)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
  true_length = q.shape[1]
  size = min(_round_up(block, SPLASH_LANES), _round_up(true_length, SPLASH_LANES))   # the kernel's tiling
  q, k, v, segment_ids = _pad_to_blocks(q, k, v, segment_ids, size)
  batch, length, kv_heads, groups, head_dim = q.shape
  heads = kv_heads * groups
  mask = masks.CausalMask((length, length)) if window is None else masks.LocalMask(
      (length, length), (window - 1, 0), offset=0)
  sizes = kernel.BlockSizes(block_q=size, block_kv=size, block_kv_compute=size, block_q_dkv=size,
                            block_kv_dkv=size, block_kv_dkv_compute=size, block_q_dq=size, block_kv_dq=size)
  attention = kernel.make_splash_mqa_single_device(masks.MultiHeadMask([mask] * groups), block_sizes=sizes,
                                                   interpret=interpret) if kv_heads == 1 else \
      kernel.make_splash_mha_single_device(masks.MultiHeadMask([mask] * heads), block_sizes=sizes,
                                           interpret=interpret)
  scale = head_dim**-0.5
  # [B, heads, T, D]; query head h = kv_head * G + g, as the grouped layout orders them.
  queries = jnp.einsum('btkgd->bkgtd', q).reshape(batch, heads, length, head_dim).astype(dtype) * scale
  keys, values = (jnp.einsum('btkd->bktd', x).astype(dtype) for x in (k, v))
  segments = kernel.SegmentIds(q=segment_ids.astype(jnp.int32), kv=segment_ids.astype(jnp.int32))
  if kv_heads == 1:
    out = jax.vmap(attention)(queries, keys[:, 0], values[:, 0], segments)
  else:   # MHA kernel: repeat each KV head for its G query heads
    keys, values = (jnp.repeat(x, groups, axis=1) for x in (keys, values))
    out = jax.vmap(attention)(queries, keys, values, segments)
  out = out.reshape(batch, kv_heads, groups, length, head_dim)
  return jnp.einsum('bkgtd->btkgd', out)[:, :true_length].astype(dtype)


# ---- cached decoding ------------------------------------------------------------------------------------


def attend_blocks(q: Array, blocks: Sequence[tuple[Array, Array]], mask: Array, dtype: Any) -> Array:
  """Softmax attention over key blocks kept apart (never concatenated, so a cache is never copied): the decoding
  path (a step or a prefill against the cache).

  q [B, T, K, G, D]; blocks of (keys, values) [B, K, S_i, D]; mask [B, 1, T, sum S_i] → [B, T, K, G, D].
  The cache layout puts K before S so both matmuls read it as is.
  """
  scale, lowest = q.shape[-1]**-0.5, jnp.finfo(jnp.float32).min
  scores, offset = [], 0
  for keys, _ in blocks:
    score = jnp.einsum('btkgd,bksd->bkgts', q, keys.astype(q.dtype), preferred_element_type=jnp.float32)
    scores.append(jnp.where(mask[:, :, None, :, offset:offset + keys.shape[2]], score * scale, lowest))
    offset += keys.shape[2]
  top = functools.reduce(jnp.maximum, [score.max(-1, keepdims=True) for score in scores])
  weights = [jnp.exp(score - top) for score in scores]
  total = sum(weight.sum(-1) for weight in weights)                              # [B, K, G, T]
  out = sum(jnp.einsum('bkgts,bksd->bkgtd', weight.astype(dtype), values.astype(dtype),
                       preferred_element_type=jnp.float32) for weight, (_, values) in zip(weights, blocks))
  return jnp.einsum('bkgtd->btkgd', out / total[..., None]).astype(dtype)
