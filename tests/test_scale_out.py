"""Scale-out (docs/models.md): the SFT, RLOO and DPO steps and the RLOO sampler on conftest's 8 fake CPU
devices, under a pure data-parallel mesh and an fsdp × tensor mesh, equal one device (fp32)."""

import functools

import jax
import ml_collections
import numpy as np
import pytest

from luckystar import model
from luckystar import sampling
from luckystar.model import sharding
from luckystar.engine import logprobs
from luckystar.stages import dpo, rlvr
from luckystar.engine import optim
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib
from test_sft import MICRO, host_params

ROWS, LENGTH, STEPS = 8, 16, 3
LAYOUTS = {'data': (8, 1, 1), 'fsdp×tensor': (1, 4, 2)}
CONFIG = ml_collections.ConfigDict(dict(learning_rate=1e-2, warmup_steps=0, total_steps=10, weight_decay=0.1,
                                        b1=0.9, b2=0.95, max_grad_norm=1.0))


def sft_batch(rng):
  tokens = rng.integers(1, MICRO.vocab_size, (ROWS, LENGTH))
  segments = np.where(np.arange(LENGTH) < LENGTH // 2, 1, 2) * np.ones((ROWS, 1), np.int64)
  positions = np.where(segments == 1, np.arange(LENGTH), np.arange(LENGTH) - LENGTH // 2)
  return {'tokens': tokens, 'loss_mask': rng.integers(0, 2, (ROWS, LENGTH)), 'segment_ids': segments,
          'positions': positions}


def rlvr_batch(rng):
  """Two prompts × four rollouts: a 5-token prompt, then a continuation of random length."""
  lengths = rng.integers(8, LENGTH + 1, ROWS)
  inside = np.arange(LENGTH)[None] < lengths[:, None]
  return {'tokens': rng.integers(1, MICRO.vocab_size, (ROWS, LENGTH)) * inside,
          'positions': np.arange(LENGTH)[None] * inside, 'segment_ids': inside.astype(np.int32),
          'loss_mask': (inside & (np.arange(LENGTH)[None] >= 5)).astype(np.int32),
          'old_logprobs': -rng.uniform(3, 5, (ROWS, LENGTH)).astype(np.float32) * inside,
          'advantages': rng.normal(size=ROWS).astype(np.float32), 'used': np.array([1, 1, 1, 0, 1, 1, 1, 1])}


def dpo_batch(rng):
  pairs = []
  for row in range(ROWS):
    sides = {'kind': dpo.ANCHOR if row % 3 == 2 else 'concise'}   # anchor rows too
    for side in dpo.SIDES:
      n = int(rng.integers(6, LENGTH + 1))
      sides[f'{side}_tokens'] = rng.integers(1, MICRO.vocab_size, n).tolist()
      sides[f'{side}_loss_mask'] = [0] * 4 + [1] * (n - 4)
    pairs.append(sides)
  reference = -rng.uniform(20, 40, (ROWS, 2))
  return dpo.pair_batch(pairs, np.arange(ROWS), reference, length_multiple=LENGTH)


STAGES = {  # loss, denominator, batch maker
    'sft': (functools.partial(logprobs.token_cross_entropy, model_config=MICRO), 'tokens', sft_batch),
    'rlvr': (functools.partial(rlvr.loss_fn, model_config=MICRO, temperature=0.7, clip_epsilon=0.2), 'tokens',
             rlvr_batch),
    'dpo': (functools.partial(dpo.loss_fn, model_config=MICRO, beta=0.1, sft_weight=0.5, anchor_weight=2.0), 'pairs',
            dpo_batch),
}


def one_device():
  return sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])


def train_losses(stage, mesh):
  """train/loss of STEPS updates from the same params on the same batches, and the final state."""
  loss, denominator, make_batch = STAGES[stage]
  rng = np.random.default_rng(7)
  batches = [make_batch(rng) for _ in range(STEPS)]
  optimizer = optim.make(CONFIG)
  state = state_lib.create(MICRO, optimizer, mesh, seed=0, params=host_params(MICRO, 1))
  update = step_lib.make_update_fn(loss, optimizer, step_lib.state_shardings_of(state), mesh=mesh,
                                   denominator=denominator)
  losses = []
  for batch in batches:
    device_batch = update.put_batch(batch)
    state, metrics = update(state, device_batch, state_lib.step_rng(state))
    losses.append(float(metrics['train/loss']))
  return losses, state, device_batch


@pytest.fixture(scope='module')
def reference():
  return {}


@pytest.mark.parametrize('layout', LAYOUTS)
@pytest.mark.parametrize('stage', STAGES)
def test_sharded_step_matches_one_device(stage, layout, reference):
  assert jax.device_count() == 8, 'tests/conftest.py sets 8 fake CPU devices'
  if stage not in reference:
    reference[stage] = train_losses(stage, one_device())[0]
  losses, state, batch = train_losses(stage, sharding.make_mesh(LAYOUTS[layout]))
  np.testing.assert_allclose(losses, reference[stage], rtol=1e-5)
  assert len(set(reference[stage])) == STEPS   # the updates changed the params
  kernel = state.params['layers']['layer_0']['mlp']['gate_proj']['kernel']     # [groups, embed, mlp]
  opt_kernel = state.opt_state[1][0].mu['layers']['layer_0']['mlp']['gate_proj']['kernel']
  data, fsdp, tensor = LAYOUTS[layout]
  assert kernel.addressable_shards[0].data.shape == (1, MICRO.hidden_size // fsdp, MICRO.intermediate_size // tensor)
  assert opt_kernel.sharding == kernel.sharding   # Adam moments are sharded like their params
  if layout == 'fsdp×tensor':
    assert state.params['embedding'].sharding.spec == jax.sharding.PartitionSpec('tensor', 'fsdp')
  assert batch['tokens'].addressable_shards[0].data.shape[0] == ROWS // (data * fsdp)


def test_sharded_rollouts_sample_the_same_tokens():
  """The RLOO sampler (temperature 1, KV cache sharded by the same table) under the fsdp × tensor mesh
  draws the same tokens and log-probs as on one device: the random bits do not depend on the sharding."""
  layout = 'fsdp×tensor'
  rng = np.random.default_rng(3)
  prompts = [rng.integers(1, MICRO.vocab_size, n).tolist() for n in (3, 9, 5, 12, 1, 7, 4, 10)]
  params = host_params(MICRO, 2)
  outputs = {}
  for name, mesh in {'one device': one_device(), layout: sharding.make_mesh(LAYOUTS[layout])}.items():
    with sharding.activate(mesh):
      outputs[name] = sampling.sample(MICRO, jax.device_put(params, model.param_shardings(MICRO, mesh)), prompts,
                                      rng=jax.random.key(5), max_new_tokens=8,
                                      settings=sampling.SamplingSettings(temperature=1.0))
  data, fsdp, _ = LAYOUTS[layout]
  assert outputs[layout].tokens.addressable_shards[0].data.shape[0] == len(prompts) // (data * fsdp)
  np.testing.assert_array_equal(np.asarray(outputs[layout].tokens), np.asarray(outputs['one device'].tokens))
  np.testing.assert_allclose(np.asarray(outputs[layout].untruncated_logprobs),
                             np.asarray(outputs['one device'].untruncated_logprobs), rtol=1e-5, atol=1e-5)


def test_sharded_sampling_pads_a_batch_that_does_not_split():
  """5 prompts on a mesh of 8 batch devices: padded to 8 rows with budget 0, the 5 real rows come back
  equal to one device's."""
  rng = np.random.default_rng(4)
  prompts = [rng.integers(1, MICRO.vocab_size, n).tolist() for n in (3, 9, 5, 12, 1)]
  params = host_params(MICRO, 2)
  outputs = {}
  for name, mesh in {'one device': one_device(), 'data': sharding.make_mesh(LAYOUTS['data'])}.items():
    with sharding.activate(mesh):
      outputs[name] = sampling.sample(MICRO, jax.device_put(params, model.param_shardings(MICRO, mesh)), prompts,
                                      rng=jax.random.key(6), max_new_tokens=6,
                                      settings=sampling.SamplingSettings(temperature=0.0))
  assert outputs['data'].tokens.shape == (5, 6)
  np.testing.assert_array_equal(np.asarray(outputs['data'].tokens), np.asarray(outputs['one device'].tokens))
  np.testing.assert_array_equal(np.asarray(outputs['data'].lengths), np.asarray(outputs['one device'].lengths))


@pytest.mark.parametrize('stage', sorted(STAGES))
def test_metrics_do_not_depend_on_grad_accum_steps(stage):
  """Every aux entry, not only the loss and gradients, comes out as from the whole batch: means over some rows
  (DPO's rewards over preference rows, anchor_loss over anchors) by those rows, counts summed (AUX_WEIGHTS).
  Averaging all of them by the denominator made DPO's anchor_rows 1 / 0.5 / 0.25 at 1 / 2 / 4 micro-batches."""
  loss, denominator, make_batch = STAGES[stage]
  batch = jax.tree.map(np.asarray, make_batch(np.random.default_rng(3)))
  params = host_params(MICRO, 1)
  weights = {'sft': None, 'rlvr': rlvr.AUX_WEIGHTS, 'dpo': dpo.AUX_WEIGHTS}[stage]
  aux = {k: jax.jit(lambda p, b, k=k: step_lib.accumulate_gradients(
      loss, p, b, jax.random.key(0), grad_accum_steps=k, denominator=denominator, aux_weights=weights)[1])(
          params, batch) for k in (1, 2, 4)}
  assert set(aux[2]) == set(aux[4]) == set(aux[1])
  for k in (2, 4):
    for name, value in aux[1].items():
      np.testing.assert_allclose(aux[k][name], value, rtol=2e-5, atol=1e-6, err_msg=f'{name} at {k} micro-batches')
