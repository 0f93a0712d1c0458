"""Attention backends against the dense reference (the [T, T] attention every earlier release computed):
values and gradients, sliding windows, packing, GQA / MQA / MHA, and the model wired through each."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from luckystar import model
from luckystar import sampling
from luckystar.model import attention

S, F = model.SLIDING, model.FULL
apply = jax.jit(model.apply, static_argnums=0)


def dense_reference(q, k, v, segment_ids, window):
  """Scores [B, K, G, T, T] masked (causal, same segment, inside the window) and softmaxed in fp32."""
  length = q.shape[1]
  i, j = np.arange(length)[:, None], np.arange(length)[None, :]
  allowed = (j <= i) & ((j > i - window) if window else True)
  mask = allowed[None] & (segment_ids[:, :, None] == segment_ids[:, None, :])
  scores = jnp.einsum('btkgd,bskd->bkgts', q, k, preferred_element_type=jnp.float32) * q.shape[-1]**-0.5
  scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
  return jnp.einsum('bkgts,bskd->btkgd', jax.nn.softmax(scores, axis=-1), v.astype(jnp.float32))


def _inputs(kv_heads, groups, length=40, head_dim=8, seed=0, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(2, length, kv_heads, groups, head_dim)), dtype)
  k, v = (jnp.asarray(rng.normal(size=(2, length, kv_heads, head_dim)), dtype) for _ in range(2))
  # Row 0: one document and end padding (segment 0). Row 1: three packed documents, then padding.
  segments = np.zeros((2, length), np.int32)
  segments[0, :length - 5] = 1
  segments[1, :11], segments[1, 11:19], segments[1, 19:length - 3] = 1, 2, 3
  return q, k, v, jnp.asarray(segments)


def _value_and_grads(fn, q, k, v):
  """The output and d(Σ out · w)/d(q, k, v) for a fixed random w (every output element matters)."""
  weight = jnp.asarray(np.random.default_rng(9).normal(size=q.shape), jnp.float32)
  loss = lambda q, k, v: (fn(q, k, v).astype(jnp.float32) * weight).sum()
  return fn(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


HEADS = {'gqa': (2, 3), 'mqa': (1, 4), 'mha': (4, 1)}
# (window, block): full causal and sliding layers, windows shorter, longer and not a multiple of the block,
# and a block that does not divide the 40 tokens (rows padded to blocks).
MASKS = [(None, 8), (5, 8), (12, 8), (17, 16), (64, 40)]


@pytest.mark.fast
@pytest.mark.parametrize('heads', sorted(HEADS))
@pytest.mark.parametrize('window,block', MASKS)
def test_blockwise_equals_the_dense_attention_in_fp32(heads, window, block):
  q, k, v, segments = _inputs(*HEADS[heads])
  want, want_grads = _value_and_grads(lambda q, k, v: dense_reference(q, k, v, segments, window), q, k, v)
  blockwise = jax.jit(functools.partial(attention.blockwise, segment_ids=segments, window=window, block=block))
  got, got_grads = _value_and_grads(blockwise, q, k, v)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  for got_grad, want_grad in zip(got_grads, want_grads):
    np.testing.assert_allclose(got_grad, want_grad, atol=1e-5, rtol=0)


@pytest.mark.fast
@pytest.mark.parametrize('impl', ['xla', 'blockwise'])
def test_bfloat16_attention_stays_within_the_stated_tolerance(impl):
  """bf16 inputs and compute against the fp32 reference: |Δ| ≤ 2e-2 on unit-scale values (bf16 keeps 8
  mantissa bits, ≈ 4e-3 relative per rounding, and the output is a rounded weighted mean)."""
  q, k, v, segments = _inputs(2, 3, length=64, head_dim=16, seed=1)
  want = dense_reference(q, k, v, segments, 12)
  low = [x.astype(jnp.bfloat16) for x in (q, k, v)]
  got = attention.attend(*low, segments, window=12, impl=impl, dtype=jnp.bfloat16, block=16)
  assert got.dtype == jnp.bfloat16
  assert float(jnp.abs(got.astype(jnp.float32) - want).max()) <= 2e-2


@pytest.mark.fast
@pytest.mark.parametrize('window', [None, 6, 20])
def test_blockwise_visits_exactly_the_key_blocks_a_query_block_can_see(window):
  """The band for sliding layers, the causal triangle for full ones: no visited block is all masked
  (wasted work) and no skipped block holds a visible key (a wrong answer)."""
  size, blocks = 4, 12
  positions = np.arange(size * blocks)
  causal = positions[None, :] <= positions[:, None]
  seen = causal & ((positions[None, :] > positions[:, None] - window) if window else True)
  for i in range(blocks):
    first, last = (int(x) for x in attention._key_range(jnp.int32(i), size, window))
    has_visible = [seen[i * size:(i + 1) * size, j * size:(j + 1) * size].any() for j in range(blocks)]
    assert [first <= j <= last for j in range(blocks)] == has_visible
  for j in range(blocks):
    first, last = (int(x) for x in attention._query_range(jnp.int32(j), size, blocks, window))
    has_visible = [seen[i * size:(i + 1) * size, j * size:(j + 1) * size].any() for i in range(blocks)]
    assert [first <= i <= last for i in range(blocks)] == has_visible


@pytest.mark.parametrize('heads', ['gqa', 'mqa'])
@pytest.mark.parametrize('window', [None, 150])
def test_splash_kernel_in_interpret_mode_equals_the_dense_attention(heads, window):
  """The TPU kernel (Pallas splash attention: segment ids, causal and local masks) run by the Pallas
  interpreter on CPU; the MQA kernel for one KV head, the MHA kernel with repeated KV heads otherwise."""
  q, k, v, segments = _inputs(*HEADS[heads], length=300, head_dim=16, seed=2)   # 3 blocks of 128, padded
  want, want_grads = _value_and_grads(lambda q, k, v: dense_reference(q, k, v, segments, window), q, k, v)
  splash = functools.partial(attention.splash, segment_ids=segments, window=window, block=128, interpret=True)
  got, got_grads = _value_and_grads(splash, q, k, v)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  for got_grad, want_grad in zip(got_grads, want_grads):
    np.testing.assert_allclose(got_grad, want_grad, atol=1e-5, rtol=0)


@pytest.mark.fast
@pytest.mark.parametrize('window', [None, 7])
def test_the_fused_call_equals_the_dense_attention(window):
  """The cuDNN backend's `jax.nn.dot_product_attention` call (window, causal and lengths as it passes them),
  run by its XLA implementation on CPU: equal on real tokens of one-segment rows; a batch with a packed row
  takes the blockwise path and is equal everywhere."""
  q, k, v, segments = _inputs(2, 3, length=40, seed=5)
  want = dense_reference(q, k, v, segments, window)
  one_segment = jnp.minimum(segments, 1).at[1].set(jnp.arange(40) < 31)
  got = attention.fused(q, k, v, one_segment, window=window, implementation='xla')
  want_one = dense_reference(q, k, v, one_segment, window)
  real = np.asarray(one_segment, bool)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want_one)[real], atol=1e-5, rtol=0)
  np.testing.assert_allclose(attention.fused(q, k, v, segments, window=window, implementation='xla'), want,
                             atol=1e-5, rtol=0)


@pytest.mark.fast
def test_auto_picks_per_platform():
  assert attention.resolve('auto', 'cpu') == 'blockwise'
  assert attention.resolve('auto', 'gpu') == 'cudnn'
  assert attention.resolve('auto', 'tpu') == 'splash'
  assert attention.resolve('blockwise', 'tpu') == 'blockwise'
  assert attention.resolve('xla', 'gpu') == 'xla'
  assert attention.resolve('cudnn', 'cpu') == attention.resolve('splash', 'gpu') == 'blockwise'
  assert attention.resolve('cudnn', 'gpu') == 'cudnn'
  with pytest.raises(ValueError, match='attention_impl'):
    model.get('tiny', attention_impl='flash')
  with pytest.raises(ValueError, match='remat_scope'):
    model.get('tiny', remat_scope='block')


def _config(**overrides):
  return model.get('tiny', vocab_size=256, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
                   sliding_window=6, layer_types=(S, S, F, S, S, F), num_layers=6, **overrides)


def _packed_batch(length=37):
  rng = np.random.default_rng(3)
  tokens = rng.integers(0, 256, (2, length))
  segments = np.ones((2, length), np.int32)
  segments[1, 14:30], segments[1, 30:] = 2, 0
  positions = np.stack([np.arange(length), np.r_[np.arange(14), np.arange(16), np.zeros(length - 30, int)]])
  return tokens, positions, segments


@pytest.mark.fast
@pytest.mark.parametrize('impl', ['blockwise', 'splash', 'cudnn'])
def test_the_model_through_each_backend_equals_the_dense_one(impl):
  """Logits and parameter gradients of a packed batch; off their accelerator, splash and cudnn run the
  blockwise math (what `attend` falls back to)."""
  tokens, positions, segments = _packed_batch()
  loss = lambda params, config: (apply(config, params, tokens, positions, segments) ** 2).mean()
  dense, other = _config(attention_impl='xla'), _config(attention_impl=impl, attention_block=8)
  params = model.init(dense, jax.random.key(0))
  np.testing.assert_allclose(apply(other, params, tokens, positions, segments),
                             apply(dense, params, tokens, positions, segments), atol=1e-5, rtol=1e-5)
  got, want = jax.grad(loss)(params, other), jax.grad(loss)(params, dense)
  for path, g in jax.tree_util.tree_leaves_with_path(got):
    w = functools.reduce(lambda node, key: node[key.key], path, want)
    np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize('policy', ['full', 'dots'])   # 30 s of compiles: full suite only
def test_per_layer_remat_gives_the_gradients_of_no_remat(policy):
  tokens, positions, segments = _packed_batch()
  loss = lambda params, config: (apply(config, params, tokens, positions, segments) ** 2).mean()
  config = _config(attention_impl='blockwise', attention_block=8)
  params = model.init(config, jax.random.key(1))
  want = jax.grad(loss)(params, config)
  for scope in ('layer', 'group'):
    got = jax.grad(loss)(params, config.replace(remat_policy=policy, remat_scope=scope))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-7, rtol=1e-5), got, want)


@pytest.mark.fast
def test_cached_decoding_equals_the_blockwise_forward():
  """Decoding keeps its cache attention; a right-padded prefill and decode with the blockwise model give the
  logits of its unpadded forward pass."""
  config = _config(attention_impl='blockwise', attention_block=4)
  params = model.init(config, jax.random.key(2))
  rng = np.random.default_rng(4)
  prompts = [rng.integers(1, 256, n).tolist() for n in (3, 9, 14)]
  extra = rng.integers(1, 256, (len(prompts), 3))
  tokens, lengths = sampling.right_pad(prompts)
  last, cache = jax.jit(model.prefill, static_argnums=(0, 4))(config, params, tokens, lengths, tokens.shape[1] + 3)
  chunk, _ = jax.jit(model.decode, static_argnums=0)(config, params, extra, cache)
  full = np.zeros((len(prompts), 17), np.int32)
  for b, p in enumerate(prompts):
    full[b, :len(p) + 3] = p + extra[b].tolist()
  logits = np.asarray(apply(config, params, full))
  want = np.stack([logits[b, len(p) - 1:len(p) + 3] for b, p in enumerate(prompts)])
  np.testing.assert_allclose(np.concatenate([np.asarray(last)[:, None], chunk], axis=1), want, atol=1e-5)
