"""The RL method's options by name (docs/rl.md#advantage-estimators, #policy-loss-options): each advantage
estimator, policy-loss option and DPO loss against an independent numpy reference, and the defaults against
copies of the formulas they replaced, bit for bit. The model is replaced by fixed logits: no compile of a
network; the quick ones are in the fast tier."""

import functools
import pathlib

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from luckystar import config as config_lib
from luckystar import errors
from luckystar import model
from luckystar.engine import advantages as advantages_lib
from luckystar.engine import logprobs
from luckystar.engine import step as step_lib
from luckystar.stages import dpo, rlvr

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / 'configs'

# ---- advantage estimators -----------------------------------------------------------------------


def _numpy_advantages(name, rewards, survived):
  """Each estimator written out group by group in float64, from its paper's formula."""
  advantages, used = np.zeros(rewards.shape), np.zeros(rewards.shape, bool)
  for g in range(rewards.shape[0]):
    kept = np.flatnonzero(survived[g])
    if len(kept) < 2:   # no baseline: the group contributes nothing
      continue
    r = rewards[g, kept].astype(np.float64)
    used[g, kept] = True
    if name == 'rloo':
      advantages[g, kept] = [r[i] - np.delete(r, i).mean() for i in range(len(r))]
    elif name == 'grpo':
      advantages[g, kept] = (r - r.mean()) / (r.std(ddof=1) + advantages_lib.STD_EPSILON)
    else:   # dr_grpo; reinforce_pp before its batch normalisation
      advantages[g, kept] = r - r.mean()
  if name == 'reinforce_pp' and used.any():
    centred = advantages[used]
    advantages[used] = (centred - centred.mean()) / (centred.std() + advantages_lib.STD_EPSILON)
  return advantages, used


def _groups(seed, prompts=7, k=5, continuous=False):
  """Random groups with the cases every estimator must get right: an all-equal group, one with dropped rows,
  one with a single survivor and one with none. Grid rewards (multiples of 1/4, as correctness − penalty) sum
  exactly, so an all-equal group's deviations are exactly 0 and GRPO's std division does not scale rounding up."""
  rng = np.random.default_rng(seed)
  rewards = (rng.normal(size=(prompts, k)) if continuous else rng.integers(-4, 5, (prompts, k)) / 4).astype(np.float32)
  survived = rng.random((prompts, k)) < 0.8
  if not continuous:
    rewards[0] = 0.75                          # all equal, all survived
    rewards[1, :] = -0.25                      # all equal among survivors, with dropped rows
  survived[0] = True
  survived[1, :2] = False
  survived[2] = False
  survived[2, 0] = True                        # a single survivor
  survived[3] = False                          # none
  return rewards, survived


@pytest.mark.fast
@pytest.mark.parametrize('name', list(advantages_lib.ESTIMATORS))
@pytest.mark.parametrize('seed, k, continuous', [(0, 5, False), (1, 8, False), (2, 3, False), (3, 6, True)])
def test_each_estimator_equals_its_numpy_reference(name, seed, k, continuous):
  rewards, survived = _groups(seed, k=k, continuous=continuous)
  advantages, used = advantages_lib.ESTIMATORS[name](rewards, survived)
  expected, expected_used = _numpy_advantages(name, rewards, survived)
  np.testing.assert_array_equal(used, expected_used)
  np.testing.assert_allclose(advantages, expected, rtol=1e-4, atol=1e-5)
  assert not np.asarray(advantages)[~expected_used].any()          # dropped rows and lone survivors: exactly 0
  if not continuous:   # all-equal groups: no signal (RLOO's division by K − 1 may leave rounding)
    np.testing.assert_allclose(advantages[:2], 0, atol=1e-6)


@pytest.mark.fast
def test_group_estimators_are_rescaled_rloo():
  rewards, survived = _groups(4, k=6)
  rloo, used = advantages_lib.rloo_advantages(rewards, survived)
  dr_grpo, _ = advantages_lib.dr_grpo_advantages(rewards, survived)
  survivors = survived.sum(-1, keepdims=True)
  # r_i − mean of the others = K/(K−1) · (r_i − mean of all K)
  np.testing.assert_allclose(np.where(used, dr_grpo * survivors / np.maximum(survivors - 1, 1), 0), rloo, atol=1e-6)
  for name in ('grpo', 'dr_grpo'):
    np.testing.assert_allclose(np.asarray(advantages_lib.ESTIMATORS[name](rewards, survived)[0]).sum(-1), 0, atol=1e-5)


def _todays_rloo_advantages(rewards, survived):
  """A copy of `rloo_advantages` as stages/rlvr.py had it before the estimators moved."""
  survived = jnp.asarray(survived, bool)
  rewards = jnp.where(survived, jnp.asarray(rewards, jnp.float32), 0.0)
  survivors = survived.sum(-1, keepdims=True)
  baseline = (rewards.sum(-1, keepdims=True) - rewards) / jnp.maximum(survivors - 1, 1)
  used = survived & (survivors >= 2)
  return jnp.where(used, rewards - baseline, 0.0), used


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(st.integers(1, 6).flatmap(lambda k: st.tuples(
    st.lists(st.lists(st.floats(-2, 2, width=32), min_size=k, max_size=k), min_size=1, max_size=5),
    st.lists(st.lists(st.booleans(), min_size=k, max_size=k), min_size=5, max_size=5))))
@pytest.mark.fast
def test_the_default_estimator_is_todays_rloo_bit_for_bit(data):
  rewards, survived = np.array(data[0], np.float32), np.array(data[1][:len(data[0])])
  new, new_used = advantages_lib.ESTIMATORS['rloo'](rewards, survived)
  old, old_used = _todays_rloo_advantages(rewards, survived)
  np.testing.assert_array_equal(new, old)
  np.testing.assert_array_equal(new_used, old_used)


def test_training_batch_takes_the_estimator_by_name():
  from test_rlvr import _scored
  from luckystar.data import suites
  example = suites.load('korean_mc', 'train')[0]
  rewards = [[1.0, 0.0, 0.0, 0.5], [1.0, 1.0, 0.0, 0.0]]
  groups = [[_scored(example, [20 + i], [1], correct=r > 0, reward=r) for i, r in enumerate(row)] for row in rewards]
  survived = np.ones((2, 4), bool)
  for name, estimator in advantages_lib.ESTIMATORS.items():
    batch, _ = rlvr.training_batch([[2, 10], [2, 11]], groups, length_multiple=4, advantage=name)
    np.testing.assert_array_equal(batch['advantages'], np.asarray(estimator(np.array(rewards), survived)[0]).ravel())
  default, _ = rlvr.training_batch([[2, 10], [2, 11]], groups, length_multiple=4)
  todays, _ = _todays_rloo_advantages(rewards, survived)
  np.testing.assert_array_equal(default['advantages'], np.asarray(todays).ravel())


# ---- dynamic sampling ---------------------------------------------------------------------------


def _draw_from(table, calls):
  """A `draw` for `rlvr.dynamic_groups`: prompt i's group earns rewards table[i] (None: dropped overlong)."""
  from test_rlvr import _scored
  from luckystar.data import suites
  example = suites.load('korean_mc', 'train')[0]

  def draw(indices, rng):
    calls.append((np.asarray(indices).tolist(), np.asarray(jax.random.key_data(rng)).tolist()))
    return [[_scored(example, [20], [1], correct=bool(r), overlong=r is None, reward=r) for r in table[int(i)]]
            for i in indices]
  return draw


@pytest.mark.fast
def test_dynamic_sampling_off_is_one_draw_with_the_steps_rng():
  calls = []
  indices, groups, metrics = rlvr.dynamic_groups(_draw_from([[1.0, 1.0]] * 4, calls), np.arange(2),
                                                 jax.random.key(3), pool_size=4, rounds=0)
  assert indices.tolist() == [0, 1] and len(groups) == 2 and metrics == {}
  assert calls == [([0, 1], np.asarray(jax.random.key_data(jax.random.key(3))).tolist())]


@pytest.mark.fast
def test_dynamic_sampling_drops_groups_without_spread_and_refills_them():
  # prompts 0-3 all-equal, a single survivor, or none: uninformative; 4-9 informative
  table = [[1.0, 1.0], [0.0, 0.0], [1.0, None], [None, None]] + [[1.0, 0.0]] * 6
  np.testing.assert_array_equal(rlvr.informative_groups(_draw_from(table, [])(np.arange(10), jax.random.key(0))),
                                [False] * 4 + [True] * 6)
  calls = []
  indices, groups, metrics = rlvr.dynamic_groups(_draw_from(table, calls), np.array([0, 4, 1, 5]),
                                                 jax.random.key(0), pool_size=10, rounds=8)
  assert len(indices) == len(groups) == 4 and indices[:2].tolist() == [4, 5]
  assert all(i >= 4 for i in indices) and rlvr.informative_groups(groups).all()
  rounds = len(calls) - 1
  assert metrics['train/dynamic/rounds'] == rounds >= 1
  assert metrics['train/dynamic/extra_rollouts'] == 2 * 4 * rounds
  assert metrics['train/dynamic/uninformative_kept'] == 0
  drawn = [i for chosen, _ in calls for i in chosen]
  assert metrics['train/dynamic/dropped_groups'] == sum(i < 4 for i in drawn)
  assert len({tuple(key) for _, key in calls}) == len(calls)   # each refill round draws under its own key


@pytest.mark.fast
def test_dynamic_sampling_keeps_the_batch_shape_when_its_rounds_run_out():
  table = [[1.0, 1.0]] * 3 + [[1.0, 0.0]]
  calls = []
  indices, groups, metrics = rlvr.dynamic_groups(_draw_from(table, calls), np.array([0, 1, 2]),
                                                 jax.random.key(1), pool_size=3, rounds=2)
  assert indices.tolist() == [0, 1, 2] and len(calls) == 3   # the pool has no informative prompt
  assert metrics['train/dynamic/uninformative_kept'] == 3 and metrics['train/dynamic/rounds'] == 2
  assert metrics['train/dynamic/dropped_groups'] == 9 - 3


# ---- the policy loss ----------------------------------------------------------------------------

ROWS, LENGTH, VOCAB = 6, 9, 11
CONFIG = model.get('tiny', vocab_size=VOCAB)   # the logits below replace the model: only vocab_size matters


@pytest.fixture
def fixed_logits(monkeypatch):
  """model.apply replaced by a table: the logits [VOCAB] at a token and position, times params['scale'] (so
  there is a gradient); rows keep their logits in any batch (micro-batches too). Returns the table."""
  table = np.random.default_rng(7).normal(0, 1.5, (VOCAB, LENGTH, VOCAB)).astype(np.float32)
  monkeypatch.setattr(model, 'apply', lambda config, params, tokens, positions, *args, **kwargs:
                      jnp.asarray(table)[tokens, positions] * params['scale'])
  return table


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _policy_batch(logits, temperature):
  """Rows of a prompt (mask 0), then generated tokens, a tool result (mask 0) in row 1, a dropped row (used 0);
  old and reference log-probs near the policy's, so ratios fall on both sides of every clip range."""
  rng = np.random.default_rng(3)
  tokens = rng.integers(0, VOCAB, (ROWS, LENGTH)).astype(np.int32)
  loss_mask = np.zeros((ROWS, LENGTH), np.int32)
  loss_mask[:, 3:] = 1
  loss_mask[1, 5:7] = 0
  loss_mask[4, 2:] = 1
  policy = _numpy_logprobs(logits, tokens, temperature)
  old = policy + rng.normal(0, 0.3, policy.shape)
  ref = policy + rng.normal(0, 0.5, policy.shape)
  return {'tokens': tokens, 'positions': np.tile(np.arange(LENGTH, dtype=np.int32), (ROWS, 1)),
          'segment_ids': np.ones((ROWS, LENGTH), np.int32), 'loss_mask': loss_mask,
          'advantages': rng.normal(0, 1, ROWS).astype(np.float32), 'used': np.array([1, 1, 1, 0, 1, 1], np.int32),
          'old_logprobs': np.pad(old, ((0, 0), (1, 0))).astype(np.float32),
          'ref_logprobs': np.pad(ref, ((0, 0), (1, 0))).astype(np.float32)}


def _numpy_logprobs(table, tokens, temperature):
  """log softmax(logits[t] / temperature)[token t+1]: [rows, LENGTH − 1]."""
  logits = table[tokens, np.arange(tokens.shape[1])].astype(np.float64)
  log_probs = _log_softmax(logits / temperature)[:, :-1]
  return np.take_along_axis(log_probs, tokens[:, 1:, None], -1)[..., 0]


def _numpy_loss(logits, batch, *, temperature=1.0, clip_low=0.0, clip_high=0.0, kl_beta=0.0, kl_estimator='k3',
                normalize='tokens'):
  """The policy loss and its clip fraction from the formulas: PPO's clipped objective with bounds 1 − ε_low and
  1 + ε_high (ε = 0: that side unclipped), Schulman's k1 / k2 / k3, token or sequence means over used rows."""
  policy = _numpy_logprobs(logits, batch['tokens'], temperature)
  mask = batch['loss_mask'][:, 1:] * batch['used'][:, None]
  ratio = np.exp(policy - batch['old_logprobs'][:, 1:])
  advantages = batch['advantages'][:, None].astype(np.float64)
  low, high = (1 - clip_low if clip_low else -np.inf), (1 + clip_high if clip_high else np.inf)
  objective = np.minimum(ratio * advantages, np.clip(ratio, low, high) * advantages)
  x = batch['ref_logprobs'][:, 1:] - policy     # log π_ref − log π
  kl = {'k1': -x, 'k2': 0.5 * x ** 2, 'k3': np.exp(x) - x - 1}[kl_estimator]
  per_token = -objective + kl_beta * kl
  if normalize == 'tokens':
    loss = (per_token * mask).sum() / mask.sum()
  else:
    rows = mask.sum(-1) > 0
    loss = ((per_token * mask).sum(-1)[rows] / mask.sum(-1)[rows]).mean()
  clipped = ((ratio < low) | (ratio > high)) * mask
  return loss, clipped.sum() / mask.sum()


PARAMS = {'scale': jnp.float32(1.0)}


@pytest.mark.parametrize('clip_epsilon, clip_low, clip_high, expected_low, expected_high', [
    (0.2, None, None, 0.2, 0.2),      # today's symmetric clip
    (0.2, None, 0.28, 0.2, 0.28),     # DAPO's clip-higher over clip_epsilon
    (0.0, 0.2, 0.28, 0.2, 0.28),
    (0.0, 0.0, 0.28, 0.0, 0.28),      # the upper side only
    (0.2, 0.1, 0.0, 0.1, 0.0),        # the lower side only
])
@pytest.mark.parametrize('normalize', rlvr.NORMALIZATIONS)
def test_clipping_options_equal_the_numpy_reference(fixed_logits, clip_epsilon, clip_low, clip_high, expected_low,
                                                    expected_high, normalize):
  batch = _policy_batch(fixed_logits, 0.7)
  loss, aux = rlvr.loss_fn(PARAMS, batch, None, model_config=CONFIG, temperature=0.7, clip_epsilon=clip_epsilon,
                           clip_low=clip_low, clip_high=clip_high, normalize=normalize)
  expected, clip_fraction = _numpy_loss(fixed_logits, batch, temperature=0.7, clip_low=expected_low,
                                        clip_high=expected_high, normalize=normalize)
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(aux['clip_fraction'], clip_fraction, rtol=1e-6)
  assert 0 < clip_fraction < 1


@pytest.mark.fast
@pytest.mark.parametrize('kl_estimator', list(rlvr.KL_ESTIMATORS))
def test_each_kl_estimator_equals_the_numpy_reference(fixed_logits, kl_estimator):
  batch = _policy_batch(fixed_logits, 1.0)
  loss, aux = rlvr.loss_fn(PARAMS, batch, None, model_config=CONFIG, kl_beta=0.3, kl_estimator=kl_estimator)
  np.testing.assert_allclose(loss, _numpy_loss(fixed_logits, batch, kl_beta=0.3, kl_estimator=kl_estimator)[0],
                             rtol=1e-5)
  without = _numpy_loss(fixed_logits, batch)[0]
  np.testing.assert_allclose(aux['kl'], (_numpy_loss(fixed_logits, batch, kl_beta=1.0, kl_estimator=kl_estimator)[0]
                                         - without), rtol=1e-4)


def _todays_loss_fn(params, batch, rng, *, model_config, temperature=1.0, clip_epsilon=0.0, kl_beta=0.0,
                    normalize='tokens'):
  """A copy of `rlvr.loss_fn` before clip_low / clip_high / kl_estimator."""
  del rng
  policy_logprobs, entropy = logprobs.token_logprobs(model_config, params, batch, temperature)
  rows = batch['used'].astype(jnp.float32)
  generated = logprobs.next_tokens(batch, batch['loss_mask']).astype(jnp.float32)
  mask = generated * rows[:, None]
  advantages = batch['advantages'].astype(jnp.float32)[:, None]
  ratio = jnp.exp(policy_logprobs - jax.lax.stop_gradient(logprobs.next_tokens(batch, batch['old_logprobs'])))
  objective = ratio * advantages
  if clip_epsilon > 0:
    objective = jnp.minimum(objective, jnp.clip(ratio, 1 - clip_epsilon, 1 + clip_epsilon) * advantages)
  per_token = -objective
  kl = jnp.zeros_like(policy_logprobs)
  if kl_beta > 0:
    log_ratio = logprobs.next_tokens(batch, batch['ref_logprobs']) - policy_logprobs
    kl = jnp.exp(log_ratio) - log_ratio - 1.0
    per_token = per_token + kl_beta * kl
  tokens = mask.sum()
  sequences = (mask.sum(-1) > 0).sum().astype(jnp.float32)
  if normalize == 'tokens':
    weights = mask / jnp.maximum(tokens, 1.0)
  else:
    weights = mask / jnp.maximum(mask.sum(-1, keepdims=True), 1.0) / jnp.maximum(sequences, 1.0)
  loss = (per_token * weights).sum()
  mean = lambda x: (x * mask).sum() / jnp.maximum(tokens, 1.0)
  clipped = (jnp.abs(ratio - 1) > clip_epsilon) if clip_epsilon > 0 else jnp.zeros_like(ratio, bool)
  aux = {'loss': loss, 'kl': mean(kl), 'entropy': (entropy * generated).sum() / jnp.maximum(generated.sum(), 1.0),
         'ratio': mean(ratio), 'clip_fraction': mean(clipped.astype(jnp.float32)), 'tokens': tokens,
         'sequences': sequences, 'sampled_tokens': generated.sum()}
  return loss, aux


@pytest.mark.parametrize('settings', [dict(), dict(kl_beta=0.1, normalize='sequences'),
                                      dict(clip_epsilon=0.2, kl_beta=0.1)])
@pytest.mark.fast
def test_default_options_give_todays_loss_bit_for_bit(fixed_logits, settings):
  """Unset clip_low / clip_high and kl_estimator='k3' trace today's program (without clipping, the same jaxpr, so
  the same compiled step), and give today's loss, metrics and gradient to the bit."""
  batch = _policy_batch(fixed_logits, 0.7)
  new = functools.partial(rlvr.loss_fn, model_config=CONFIG, temperature=0.7, **settings)
  old = functools.partial(_todays_loss_fn, model_config=CONFIG, temperature=0.7, **settings)
  if not settings.get('clip_epsilon'):   # clipping counts its clipped tokens by other, equal, comparisons
    assert str(jax.make_jaxpr(new)(PARAMS, batch, None)) == str(jax.make_jaxpr(old)(PARAMS, batch, None))
  (new_loss, new_aux), new_grad = jax.jit(jax.value_and_grad(new, has_aux=True))(PARAMS, batch, None)
  (old_loss, old_aux), old_grad = jax.jit(jax.value_and_grad(old, has_aux=True))(PARAMS, batch, None)
  np.testing.assert_array_equal(new_loss, old_loss)
  np.testing.assert_array_equal(new_grad['scale'], old_grad['scale'])
  for name in old_aux:
    np.testing.assert_array_equal(new_aux[name], old_aux[name], err_msg=name)


def test_token_normalisation_is_dapos_batch_token_mean_under_accumulation(fixed_logits):
  """normalize='tokens' over micro-batches of unequal token counts is Σ over every token of the global batch /
  its token count (DAPO's token-level mean), not a mean of per-micro-batch means: no separate key is needed."""
  batch = _policy_batch(fixed_logits, 1.0)
  batch['loss_mask'][::2, 5:] = 0                   # micro-batch 0 (rows 0, 2, 4) has fewer tokens than 1
  loss = functools.partial(rlvr.loss_fn, model_config=CONFIG, clip_epsilon=0.2)
  whole = jax.grad(lambda p: loss(p, batch, None)[0])(PARAMS)['scale']
  grads, aux = step_lib.accumulate_gradients(loss, PARAMS, batch, jax.random.key(0), grad_accum_steps=2,
                                             denominator='tokens', aux_weights=rlvr.AUX_WEIGHTS)
  np.testing.assert_allclose(grads['scale'], whole, rtol=1e-5)
  np.testing.assert_allclose(aux['loss'], _numpy_loss(fixed_logits, batch, clip_low=0.2, clip_high=0.2)[0], rtol=1e-5)
  micro = [_numpy_loss(fixed_logits, {k: v[i::2] for k, v in batch.items()}, clip_low=0.2, clip_high=0.2)[0]
           for i in range(2)]
  assert abs(np.mean(micro) - float(aux['loss'])) > 1e-3   # the mean of micro-batch means would differ


# ---- DPO losses --------------------------------------------------------------------------------------


@pytest.mark.fast
def test_each_dpo_loss_type_equals_the_numpy_reference():
  rng = np.random.default_rng(5)
  chosen, rejected = rng.normal(0, 3, 64).astype(np.float32), rng.normal(0, 3, 64).astype(np.float32)
  beta, eps = 0.3, 0.1
  h = chosen.astype(np.float64) - rejected
  log_sigmoid = lambda x: -np.logaddexp(0, -x)
  expected = {'sigmoid': -(1 - eps) * log_sigmoid(beta * h) - eps * log_sigmoid(-beta * h),
              'robust': (-(1 - eps) * log_sigmoid(beta * h) + eps * log_sigmoid(-beta * h)) / (1 - 2 * eps),
              'ipo': (h - 1 / (2 * beta)) ** 2,
              'hinge': np.maximum(0, 1 - beta * h)}
  assert set(expected) == set(dpo.LOSS_TYPES)
  for loss_type, values in expected.items():
    got = dpo.preference_losses(jnp.asarray(chosen), jnp.asarray(rejected), beta=beta, loss_type=loss_type,
                                label_smoothing=eps)
    np.testing.assert_allclose(got, values, rtol=1e-5, atol=1e-5, err_msg=loss_type)


def _numpy_desensitized(token_logps, masks, alpha):
  """LD-DPO's log π per reply [B, 2], reply by reply: the first min(|y_c|, |y_r|) response tokens at 1, the rest
  at alpha. token_logps, masks: [B, 2, T − 1] (mask: of the token each column predicts)."""
  out = np.zeros(masks.shape[:2])
  for b in range(masks.shape[0]):
    public = masks[b].sum(-1).min()
    for side in range(2):
      columns = np.flatnonzero(masks[b, side])
      out[b, side] = token_logps[b, side, columns[:public]].sum() + alpha * token_logps[b, side, columns[public:]].sum()
  return out


@pytest.mark.parametrize('alpha', [0.0, 0.3, 1.0])
def test_desensitized_logps_equal_the_numpy_reference_with_and_without_score_columns(alpha):
  rng = np.random.default_rng(6)
  pairs, length = 5, 12
  loss_mask = (rng.random((pairs, 2, length)) < 0.6).astype(np.int32)   # gaps: tool results
  loss_mask[..., :2] = 0                                                 # the prompt
  loss_mask[0, 1] = loss_mask[0, 0]                                      # equal lengths (an anchor row)
  token_logps = rng.normal(-2, 1, (pairs, 2, length - 1)).astype(np.float32)
  expected = _numpy_desensitized(token_logps, loss_mask[..., 1:], alpha)
  batch = {'tokens': np.zeros((pairs, 2, length), np.int32), 'loss_mask': loss_mask,
           'segment_ids': np.ones((pairs, 2, length), np.int32)}
  full = dpo.flatten_pairs(batch)
  flat_logps = np.concatenate([token_logps[:, 0], token_logps[:, 1]])    # [2B, T − 1] as flatten_pairs orders rows
  np.testing.assert_allclose(dpo.desensitized_logps(jnp.asarray(flat_logps), full, alpha), expected, rtol=1e-5)
  scored = dpo.flatten_pairs(logprobs.with_score_columns(batch, multiple=4))
  at_columns = np.where(scored['score_columns'] >= 0,
                        np.take_along_axis(flat_logps, np.maximum(scored['score_columns'], 0), 1), 0)
  np.testing.assert_allclose(dpo.desensitized_logps(jnp.asarray(at_columns), scored, alpha), expected, rtol=1e-5)


@pytest.fixture
def pair_logits(monkeypatch):
  """model.apply replaced by fixed logits [2B, T, V] times params['scale']."""
  from test_dpo import MASKS, MICRO
  logits = np.random.default_rng(1).normal(0, 2, (4, 7, MICRO.vocab_size)).astype(np.float32)
  monkeypatch.setattr(model, 'apply',
                      lambda config, params, tokens, *args, **kwargs: jnp.asarray(logits) * params['scale'])
  return logits, MASKS, MICRO


def test_dpo_ld_alpha_equals_the_numpy_reference_and_one_is_todays_loss(pair_logits):
  from test_dpo import _fixture_batch
  logits, masks, micro = pair_logits
  batch = _fixture_batch()
  log_probs = _log_softmax(logits.astype(np.float64))[:, :-1]                      # [2B, T − 1, V]
  rows = np.concatenate([batch['tokens'][:, 0], batch['tokens'][:, 1]])
  token_logps = np.take_along_axis(log_probs, rows[:, 1:, None], -1)[..., 0]
  token_logps = np.stack([token_logps[:2], token_logps[2:]], 1)                    # [B, 2, T − 1]
  log_sigmoid = lambda x: -np.logaddexp(0, -x)
  for alpha in (0.0, 0.5):
    policy = _numpy_desensitized(token_logps, masks[..., 1:], alpha)
    h = (policy[:, 0] - batch['reference_logps'][:, 0]) - (policy[:, 1] - batch['reference_logps'][:, 1])
    loss, aux = dpo.loss_fn(PARAMS, batch, None, model_config=micro, beta=0.1, ld_alpha=alpha)
    np.testing.assert_allclose(loss, -log_sigmoid(0.1 * h).mean(), rtol=1e-5)
    whole = (token_logps * masks[..., 1:]).sum(-1)
    np.testing.assert_allclose(aux['logps/chosen'], whole[:, 0].mean(), rtol=1e-5)   # metrics: whole sums
  # ld_alpha = 1 is today's loss: the summed log-probs through `preference_losses`, to the bit.
  loss, _ = dpo.loss_fn(PARAMS, batch, None, model_config=micro, beta=0.1, ld_alpha=1.0)
  logratios = dpo.pair_logps(micro, PARAMS, batch) - batch['reference_logps']
  np.testing.assert_array_equal(loss, dpo.preference_losses(logratios[:, 0], logratios[:, 1], beta=0.1).mean())


# ---- config ------------------------------------------------------------------------------------------


@pytest.mark.fast
def test_the_shipped_configs_default_to_todays_method():
  rl = config_lib.from_file(CONFIGS / 'rlvr.py').rlvr
  assert (rl.advantage, rl.kl_estimator, rl.normalize) == ('rloo', 'k3', 'tokens')
  assert rl.clip_low is None and rl.clip_high is None      # unset: clip_epsilon
  assert config_lib.from_file(CONFIGS / 'dpo.py').dpo.ld_alpha == 1.0


@pytest.mark.fast
@pytest.mark.parametrize('key, value', [('advantage', 'ppo'), ('kl_estimator', 'k4'), ('normalize', 'batch_tokens')])
def test_a_bad_choice_is_one_error_naming_the_key(key, value):
  config = config_lib.from_file(CONFIGS / 'rlvr.py')
  config.rlvr[key] = value
  with pytest.raises(errors.UserError, match=f"config.rlvr.{key}='{value}'; expected one of"):
    rlvr.check_config(config)


@pytest.mark.fast
def test_bad_numbers_and_dpo_loss_types_are_errors_naming_the_key():
  config = config_lib.from_file(CONFIGS / 'rlvr.py')
  config.rlvr.clip_high = -0.1
  with pytest.raises(errors.UserError, match=r'config.rlvr.clip_high=-0.1 is not a number ≥ 0, or None'):
    config_lib.check(config)
  config = config_lib.from_file(CONFIGS / 'dpo.py')
  config.dpo.ld_alpha = 1.5
  with pytest.raises(errors.UserError, match=r'config.dpo.ld_alpha=1.5 is not a number in \[0, 1\]'):
    config_lib.check(config)
  config.dpo.ld_alpha, config.dpo.loss_type = 0.5, 'kto'
  with pytest.raises(errors.UserError, match="config.dpo.loss_type='kto'; expected one of"):
    dpo.check_config(config)
