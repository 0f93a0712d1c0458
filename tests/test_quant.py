"""AQT int4 weight-only quantization: TRAIN (fake quant), CONVERT, SERVE (docs/int4_and_export.md)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from luckystar import api
from luckystar import model as model_lib
from luckystar import quant
from luckystar import tokenizer as tokenizer_lib
from luckystar.model.config import ModelConfig, pattern_layer_types

# Two layer groups of (sliding, full), so the frozen tensors are stacked by the layer scan.
CONFIG = ModelConfig(vocab_size=tokenizer_lib.VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_layers=4,
                     num_heads=4, num_kv_heads=2, layer_types=pattern_layer_types(4, 2), sliding_window=8,
                     max_position_embeddings=256)
GROUP = 32
PROJECTIONS = {  # path inside a layer → (in, out) of the flattened [in, out] kernel
    ('self_attn', 'q_proj'): (64, 64), ('self_attn', 'k_proj'): (64, 32), ('self_attn', 'v_proj'): (64, 32),
    ('self_attn', 'o_proj'): (64, 64), ('mlp', 'gate_proj'): (64, 128), ('mlp', 'up_proj'): (64, 128),
    ('mlp', 'down_proj'): (128, 64)}
_logits = jax.jit(model_lib.apply, static_argnums=0)


@pytest.fixture(scope='module')
def params():
  return model_lib.init(CONFIG, jax.random.key(0))


@pytest.fixture(scope='module')
def tokens():
  return jax.random.randint(jax.random.key(1), (2, 12), 0, CONFIG.vocab_size)


@pytest.fixture(scope='module')
def converted(params):
  """group size → (serving config, served params), converted once per module."""
  cache = {}
  return lambda group_size: cache.setdefault(group_size, quant.convert(CONFIG, params, group_size=group_size))


@pytest.fixture(params=[0, GROUP], ids=['per_channel', 'group'])
def served(request, converted):
  return converted(request.param)


def _node(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def test_convert_keeps_int4_values_and_scales_and_drops_the_float_kernels(served):
  config, params = served
  group_size = config.quant.group_size
  assert config.quant == quant.QuantSettings('serve', 4, group_size, 'bfloat16')
  for i in range(CONFIG.layer_period):
    for path, (fan_in, fan_out) in PROJECTIONS.items():
      node = _node(params['layers'][f'layer_{i}'], path)
      assert set(node) == {'aqt'}, f'{path}: the float kernel must be gone'
      value, scale = np.asarray(node['aqt']['qrhs']['value']), np.asarray(node['aqt']['qrhs']['scale'])
      groups = CONFIG.num_layers // CONFIG.layer_period
      if group_size:
        assert value.shape == (groups, fan_in // group_size, group_size, fan_out)
        assert scale.shape == (groups, fan_in // group_size, 1, fan_out)
      else:
        assert value.shape == (groups, fan_in, fan_out) and scale.shape == (groups, 1, fan_out)
      assert value.dtype.name == 'int4'
      ints = value.astype(np.int8)
      assert ints.min() >= -8 and ints.max() <= 7
      # abs-max calibration: every channel (or group) uses the top of AQT's symmetric range [-7, 7]
      assert (np.abs(ints).max(axis=-2) == 7).all()
      # scales are export-dtype (bf16) values, carried as float32
      assert scale.dtype == np.float32 and (scale > 0).all()
      np.testing.assert_array_equal(scale.astype(jnp.bfloat16).astype(np.float32), scale)


def test_dequantized_weights_are_within_half_a_step(params, served):
  config, served_params = served
  _, dequantized = quant.dequantize(config, served_params)
  for path in PROJECTIONS:
    weight = np.asarray(_node(params['layers']['layer_0'], path)['kernel'])
    approx = np.asarray(_node(dequantized['layers']['layer_0'], path)['kernel'])
    frozen = _node(served_params['layers']['layer_0'], path)['aqt']['qrhs']
    step = np.broadcast_to(np.asarray(frozen['scale']), frozen['value'].shape).reshape(weight.shape)
    error = np.abs(weight - approx)
    # half a step; the extreme lands up to 7.5·(1 + 2⁻⁸) steps out (bf16-rounded scale) and is clipped to 7
    assert (error <= 0.53 * step).all(), path
    assert error.mean() > 0.05 * step.mean(), f'{path}: suspiciously exact; is it quantized at all?'


def test_serve_logits_equal_fake_quant_train_logits(params, served, tokens):
  config, served_params = served
  serve = _logits(config, served_params, tokens)
  train = _logits(quant.with_quant(CONFIG, 'train', group_size=config.quant.group_size), params, tokens)
  np.testing.assert_allclose(serve, train, rtol=1e-5, atol=1e-5)
  float_config, dequantized = quant.dequantize(config, served_params)
  np.testing.assert_allclose(serve, _logits(float_config, dequantized, tokens), rtol=1e-5, atol=1e-5)
  assert np.abs(serve - _logits(CONFIG, params, tokens)).max() > 1e-4  # int4 did change the model


def test_quantization_aware_training_passes_gradients_straight_through(params, converted, tokens):
  config, served_params = converted(GROUP)  # group-wise: the tiled case; per-channel is the same code
  train_config = quant.with_quant(CONFIG, 'train', group_size=config.quant.group_size)
  grad = jax.jit(jax.grad(lambda config, params: jnp.mean(jnp.square(model_lib.apply(config, params, tokens))),
                          argnums=1), static_argnums=0)
  qat_grads = grad(train_config, params)
  float_config, dequantized = quant.dequantize(config, served_params)
  # straight-through estimator: the gradient at the kernel is the float gradient at its int4 round trip
  want = grad(float_config, dequantized)
  for path in PROJECTIONS:
    got = _node(qat_grads['layers']['layer_1'], path)['kernel']
    np.testing.assert_allclose(got, _node(want['layers']['layer_1'], path)['kernel'], rtol=1e-4, atol=1e-8)
    assert np.abs(got).max() > 0


def test_served_model_generates_greedily_from_its_int4_logits(converted):
  config, served_params = converted(GROUP)  # the KV-cache sampler on int4 params; one variant is enough
  model = api.Model(config, served_params, tokenizer_lib.default())
  reply = model.generate('2+3은?', mode='concise', max_new_tokens=6)
  prompt, _ = model.tokenizer.render([{'role': 'user', 'content': '2+3은?'}], 'concise', add_generation_prompt=True)
  generated = reply.rollout.token_ids
  assert len(generated) > 0
  # teacher-forced: every sampled token is the argmax of the SERVE logits at its position
  logits = model.logits(np.array([prompt + generated.tolist()]))[0, len(prompt) - 1:-1]
  np.testing.assert_array_equal(np.argmax(logits, -1), generated)


def test_group_size_must_divide_every_input_dimension(params):
  with pytest.raises(ValueError, match='group_size=48 does not divide the 64 input features'):
    quant.convert(CONFIG, params, group_size=48)


def test_convert_refuses_served_params_and_bad_settings(converted):
  with pytest.raises(ValueError, match='already quantized'):
    quant.convert(*converted(GROUP))
  with pytest.raises(ValueError, match='mode'):
    quant.QuantSettings(mode='qat')
  with pytest.raises(ValueError, match='scale dtype'):
    quant.QuantSettings(scale_dtype='int8')


@pytest.mark.parametrize('size', ['tiny', 'command_a_111b'])
def test_memory_planner_arithmetic_matches_eval_shape_counts(size):
  from luckystar.quant import planner
  config = model_lib.get(size)
  hidden, mlp, layers = config.hidden_size, config.intermediate_size, config.num_layers
  q_out, kv_out = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
  dense = layers * (hidden * (q_out + 2 * kv_out) + q_out * hidden + 3 * hidden * mlp)
  params = planner.param_counts(config)   # eval_shape of the real model
  assert params == {'embedding': config.vocab_size * hidden, 'linear': dense, 'other': (layers + 1) * hidden,
                    'total': config.vocab_size * hidden + dense + (layers + 1) * hidden}
  assert params['total'] == model_lib.param_count(config)
  group = 128
  scales = layers * (hidden // group * (q_out + 2 * kv_out) + q_out // group * hidden + 2 * hidden // group * mlp
                     + mlp // group * hidden)
  assert planner.int4_tensor_counts(config, group) == {'values': dense, 'scales': scales}  # the SERVE layout

  context, batch = 131072, 1
  int4 = planner.plan(size, 'int4', group_size=group, context=context, batch=batch)
  assert int4.linear_bytes == dense // 2 + 2 * scales and int4.embedding_bytes == 2 * params['embedding']
  full = sum(t != model_lib.SLIDING for t in config.layer_types)
  slots = full * context + (layers - full) * min(config.sliding_window, context)
  assert int4.kv_bytes == 2 * batch * config.num_kv_heads * config.head_dim * 2 * slots
  assert int4.total_bytes == int4.weight_bytes + int4.kv_bytes + int4.reserve_bytes
  bf16 = planner.plan(size, 'bf16', context=context, batch=batch)
  assert bf16.linear_bytes == 2 * dense and bf16.kv_bytes == int4.kv_bytes
  if size == 'command_a_111b':
    assert 110e9 < params['total'] < 112e9
    # docs/int4_and_export.md: 111B int4 fits one 80 GB H100 with the KV budget left; bf16 and fp8 do not
    assert int4.fits and int4.max_context >= context, int4.report()
    assert not bf16.fits and not planner.plan(size, 'fp8', context=context, batch=batch).fits


@pytest.mark.parametrize('device_gb', [72, 75])
def test_memory_planner_longest_context_is_the_last_that_fits_wherever_it_is_asked(device_gb):
  """Sliding layers' caches stop at their window, so the KV cache is not linear in the context: the
  longest context is the last n whose plan fits, the same whichever context the plan was made at (the
  linear estimate from a plan at 8,192 tokens was 2.3× too short)."""
  from luckystar.quant import planner
  plan = functools.partial(planner.plan, 'command_a_111b', 'int4', device_bytes=device_gb * 10**9)
  n, at_full_length = (plan(context=context).max_context for context in (8192, 131072))
  assert n == at_full_length and 0 < n < 131072
  assert plan(context=n).fits and not plan(context=n + 1).fits
