"""Model sizes, scan grouping, packing, remat and sharded execution on 8 fake CPU devices."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from luckystar import model
from luckystar.model import sharding

S, F = model.SLIDING, model.FULL
apply = jax.jit(model.apply, static_argnums=0)


def _config(**overrides):
  return model.get('tiny', vocab_size=512, hidden_size=64, intermediate_size=128, sliding_window=6,
                   **overrides)


def test_command_a_parameter_count_is_111b():
  count = model.param_count(model.get('command_a_111b'))  # jax.eval_shape: nothing is allocated
  print(f'command_a_111b: {count:,} parameters')
  assert abs(count - 111e9) / 111e9 < 0.01


def test_command_r7b_parameter_count():
  count = model.param_count(model.get('command_r7b'))
  print(f'command_r7b: {count:,} parameters')
  assert abs(count - 8.03e9) / 8.03e9 < 0.01  # the published Command R7B size (with its 256k embedding)


@pytest.mark.parametrize('layer_types,period', [
    ((S, S, S, F) * 2, 4), ((S, F) * 3, 2), ((S, F, S, S, F), 5), ((F,) * 3, 1)])
def test_layers_are_scanned_in_groups_of_the_period(layer_types, period):
  config = _config(num_layers=len(layer_types), layer_types=layer_types)
  assert config.layer_period == period
  params = model.init(config, jax.random.key(0))
  assert sorted(params['layers']) == [f'layer_{i}' for i in range(period)]
  kernel = params['layers']['layer_0']['mlp']['up_proj']['kernel']
  assert kernel.shape == (len(layer_types) // period, 64, 128)


def test_config_errors_name_the_problem():
  with pytest.raises(ValueError, match='layer_types has 3 entries for 4 layers'):
    _config(layer_types=(S, S, F))
  with pytest.raises(ValueError, match='remat_policy'):
    _config(remat_policy='sometimes')
  with pytest.raises(ValueError, match='unknown model size'):
    model.get('huge')


def test_packed_documents_do_not_see_each_other():
  """Two documents packed in one row (segment ids, restarted positions) give each one's own logits."""
  config = _config()
  params = model.init(config, jax.random.key(1))
  rng = np.random.default_rng(0)
  first, second = rng.integers(0, 512, 13), rng.integers(0, 512, 9)
  packed = np.concatenate([first, second])[None]
  segments = np.array([[1] * 13 + [2] * 9])
  positions = np.array([list(range(13)) + list(range(9))])
  logits = apply(config, params, packed, positions, segments)
  np.testing.assert_allclose(logits[0, :13], apply(config, params, first[None])[0], atol=1e-5)
  np.testing.assert_allclose(logits[0, 13:], apply(config, params, second[None])[0], atol=1e-5)


@pytest.mark.parametrize('policy', ['full', 'dots'])
def test_remat_policies_keep_values_and_gradients(policy):
  config = _config()
  params = model.init(config, jax.random.key(2))
  tokens = np.random.default_rng(1).integers(0, 512, (2, 20))

  @functools.partial(jax.jit, static_argnums=1)
  def value_and_grad(params, config):
    return jax.value_and_grad(lambda p: model.apply(config, p, tokens).mean())(params)

  base_value, base_grad = value_and_grad(params, config)
  value, grad = value_and_grad(params, config.replace(remat_policy=policy))
  np.testing.assert_allclose(value, base_value, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), grad, base_grad)


def test_bfloat16_compute_stays_close_to_float32():
  config = _config()
  params = model.init(config, jax.random.key(3))
  tokens = np.random.default_rng(2).integers(0, 512, (2, 16))
  full = apply(config, params, tokens)
  half = apply(config.replace(dtype='bfloat16'), params, tokens)
  assert half.dtype == jnp.float32  # logits always come back in fp32
  np.testing.assert_allclose(half, full, atol=0.1)


@pytest.mark.parametrize('mesh_shape', [(1, 4, 2), (2, 2, 2)])
def test_sharded_forward_equals_single_device(mesh_shape):
  assert jax.device_count() == 8, 'tests/conftest.py sets 8 fake CPU devices'
  config = _config(num_kv_heads=2)
  mesh = sharding.make_mesh(mesh_shape)
  params = model.init_sharded(config, jax.random.key(4), mesh)
  kernel = params['layers']['layer_0']['self_attn']['q_proj']['kernel']  # [groups, embed, heads, head_dim]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, 'fsdp', 'tensor', None)
  if mesh_shape[1] * mesh_shape[2] > 1:
    assert kernel.addressable_shards[0].data.shape != kernel.shape, 'params are not actually split'

  tokens = np.random.default_rng(3).integers(0, 512, (8, 24))
  want = apply(config, jax.device_get(params), tokens)  # single device
  batch_sharding = sharding.logical_shardings(jax.sharding.PartitionSpec('batch', 'length'), mesh)
  with sharding.activate(mesh):
    got = apply(config, params, jax.device_put(tokens, batch_sharding))
  assert got.addressable_shards[0].data.shape[0] == 8 // (mesh_shape[0] * mesh_shape[1])  # batch is split
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_mesh_shape_errors():
  with pytest.raises(ValueError, match='needs 6 devices'):
    sharding.make_mesh((3, 2, 1))
  assert sharding.make_mesh({'tensor': 2, 'data': -1}).shape == {'data': 4, 'fsdp': 1, 'tensor': 2}
