"""Chunked losses (engine.logprobs): projecting onto the vocabulary a chunk of scored columns at a time gives
the same SFT loss, RL log-probs / entropy and DPO pair log-probs, and the same gradients, as one projection."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from luckystar import model as model_lib
from luckystar.engine import logprobs
from luckystar.model.config import ModelConfig, pattern_layer_types

CONFIG = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     layer_types=pattern_layer_types(2, 2), sliding_window=8, max_position_embeddings=64)


@pytest.fixture(scope='module')
def params():
  return model_lib.init(CONFIG, jax.random.key(0))


def _batch(with_columns: bool, seed: int = 1):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, CONFIG.vocab_size, (3, 24)).astype(np.int32)
  loss_mask = (rng.random((3, 24)) < 0.6).astype(np.int32)
  segment_ids = np.ones_like(tokens)
  segment_ids[2, 18:] = 0   # padding
  batch = {'tokens': tokens, 'loss_mask': loss_mask, 'segment_ids': segment_ids,
           'positions': np.broadcast_to(np.arange(24, dtype=np.int32), tokens.shape).copy()}
  return logprobs.with_score_columns(batch, multiple=8) if with_columns else batch


@pytest.mark.parametrize('with_columns, chunk', [(False, 5), (True, 8)])   # a ragged last chunk, and an even one
def test_chunked_cross_entropy_and_its_gradient_equal_one_projection(params, with_columns, chunk):
  batch = _batch(with_columns)
  chunked = dataclasses.replace(CONFIG, loss_chunk=chunk)
  whole = jax.value_and_grad(logprobs.token_cross_entropy, has_aux=True)
  (loss, aux), grads = jax.jit(lambda p, b: whole(p, b, None, model_config=CONFIG))(params, batch)
  (loss_c, aux_c), grads_c = jax.jit(lambda p, b: whole(p, b, None, model_config=chunked))(params, batch)
  np.testing.assert_allclose(loss_c, loss, rtol=1e-6)
  np.testing.assert_allclose(aux_c['accuracy'], aux['accuracy'], rtol=1e-6)
  assert aux_c['tokens'] == aux['tokens'] > 0
  for (path, g), g_c in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(grads_c)):
    np.testing.assert_allclose(g_c, g, rtol=2e-5, atol=1e-7, err_msg=jax.tree_util.keystr(path))


def test_chunked_token_logprobs_entropy_and_their_gradient_equal_one_projection(params):
  batch = _batch(True, seed=2)
  def objective(p, config):   # an RL-shaped objective: Σ logπ · weights + entropy bonus
    taken, entropy = logprobs.token_logprobs(config, p, batch, temperature=0.7)
    weights = jnp.linspace(-1, 1, taken.size).reshape(taken.shape)
    return (taken * weights).sum() + 0.01 * entropy.sum(), (taken, entropy)
  run = lambda config: jax.jit(jax.value_and_grad(objective, has_aux=True), static_argnums=1)(params, config)
  (value, (taken, entropy)), grads = run(CONFIG)
  (value_c, (taken_c, entropy_c)), grads_c = run(dataclasses.replace(CONFIG, loss_chunk=3))
  np.testing.assert_allclose(taken_c, taken, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(entropy_c, entropy, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(value_c, value, rtol=1e-5)
  for g, g_c in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_c)):
    np.testing.assert_allclose(g_c, g, rtol=2e-5, atol=1e-6)


@pytest.mark.fast
def test_the_chunk_is_automatic_past_the_budget_and_a_setting_otherwise():
  big = dataclasses.replace(CONFIG, vocab_size=256_000)
  assert logprobs.loss_chunk(CONFIG, 256, 8192) == 8192   # small logits: one projection
  per_device = 4 * 256 * 256_000 / jax.device_count()
  assert logprobs.loss_chunk(big, 256, 8192) == int(logprobs.LOGITS_BUDGET // per_device) < 8192
  assert logprobs.loss_chunk(dataclasses.replace(CONFIG, loss_chunk=100), 4, 64) == 64
  assert logprobs.loss_chunk(dataclasses.replace(CONFIG, loss_chunk=16), 4, 64) == 16
  with pytest.raises(ValueError, match='loss_chunk'):
    dataclasses.replace(CONFIG, loss_chunk=-1)
