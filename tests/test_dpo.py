"""Offline DPO (docs/rl.md): each loss variant against hand-computed values, response-only masks, the pair
builder, the cached reference log-probs, and the command line end to end (with a resume)."""

import dataclasses
import functools
import importlib.util
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import main_runs
from luckystar import errors
from luckystar import model
from luckystar import sampling
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import suites
from luckystar.model import sharding
from luckystar.rewards.reward import Verdict
from luckystar.stages import dpo
from luckystar.engine import logprobs, metrics, rollouts
from luckystar.engine import pairs as pairs_lib
from luckystar.engine import step as step_lib
from test_sft import MICRO, host_params

SMOKE = 'configs/dpo.py:smoke'


def _config(arg=None):
  from luckystar import config as config_lib
  return config_lib.from_file(main_runs.ROOT / 'configs' / 'dpo.py', arg)


# ---- the loss --------------------------------------------------------------------------------------------

# h = (1.5) − (−0.5) = 2, β = 0.1, ε = 0.1; by hand: −log σ(0.2) = 0.598139, −log σ(−0.2) = 0.798139.
HAND = {('sigmoid', 0.0): 0.598139,                    # DPO: −log σ(βh)
        ('sigmoid', 0.1): 0.9 * 0.598139 + 0.1 * 0.798139,   # cDPO = 0.618139
        ('robust', 0.1): (0.9 * 0.598139 - 0.1 * 0.798139) / 0.8,   # rDPO = 0.573139
        ('ipo', 0.0): (2.0 - 5.0) ** 2,                # IPO: (h − 1/(2β))² = 9
        ('hinge', 0.0): 1.0 - 0.2}                     # SLiC: max(0, 1 − βh) = 0.8


@pytest.mark.fast
@pytest.mark.parametrize('loss_type, label_smoothing', list(HAND))
def test_each_loss_variant_equals_the_hand_computed_value(loss_type, label_smoothing):
  losses = dpo.preference_losses(jnp.array([1.5]), jnp.array([-0.5]), beta=0.1, loss_type=loss_type,
                                 label_smoothing=label_smoothing)
  np.testing.assert_allclose(losses, [HAND[loss_type, label_smoothing]], atol=1e-5)


@pytest.mark.fast
def test_loss_settings_are_checked():
  with pytest.raises(ValueError, match='loss_type'):
    dpo.preference_losses(jnp.zeros(1), jnp.zeros(1), beta=0.1, loss_type='slic')
  with pytest.raises(ValueError, match='label_smoothing'):
    dpo.preference_losses(jnp.zeros(1), jnp.zeros(1), beta=0.1, label_smoothing=0.5)


# A fixture batch of 2 pairs, T = 7: prompt tokens (mask 0), then the reply; pair 1's rejected reply has a
# spliced tool result (mask 0) in the middle and at the end.
MASKS = np.array([[[0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1]],
                  [[0, 0, 1, 1, 1, 1, 0], [0, 0, 1, 0, 0, 1, 0]]], np.int32)   # [B, 2, T]


def _fixture_batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(4, MICRO.vocab_size, MASKS.shape).astype(np.int32)
  real = np.array([[[1, 1, 1, 1, 1, 0, 0], [1] * 7], [[1, 1, 1, 1, 1, 1, 0], [1] * 7]], np.int32)
  return {'tokens': tokens * real, 'loss_mask': MASKS, 'segment_ids': real,
          'positions': np.broadcast_to(np.arange(7, dtype=np.int32), MASKS.shape).copy(),
          'reference_logps': np.array([[-20.0, -30.0], [-25.0, -22.0]], np.float32)}


@pytest.fixture
def fixed_logits(monkeypatch):
  """model.apply replaced by fixed logits [2B, T, V] (rows: the chosen replies, then the rejected)."""
  logits = np.random.default_rng(1).normal(0, 2, (4, 7, MICRO.vocab_size)).astype(np.float32)
  monkeypatch.setattr(model, 'apply', lambda config, params, tokens, *args, **kwargs: jnp.asarray(logits))
  return logits


def _hand_logps(logits, batch):
  """Σ over response tokens of log softmax(logits[t])[token t+1], per pair [B, 2], in plain numpy."""
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  out = np.zeros((2, 2))
  for b in range(2):
    for s in range(2):
      row = s * 2 + b
      out[b, s] = sum(log_probs[row, t, batch['tokens'][b, s, t + 1]] for t in range(6)
                      if batch['loss_mask'][b, s, t + 1])
  return out


@pytest.mark.fast
@pytest.mark.parametrize('loss_type, label_smoothing, sft_weight',
                         [('sigmoid', 0.0, 0.0), ('sigmoid', 0.1, 0.5), ('robust', 0.1, 0.0), ('ipo', 0.0, 0.0)])
def test_loss_fn_on_the_fixture_batch(fixed_logits, loss_type, label_smoothing, sft_weight):
  batch = _fixture_batch()
  loss, aux = dpo.loss_fn(None, batch, None, model_config=MICRO, beta=0.1, loss_type=loss_type,
                          label_smoothing=label_smoothing, sft_weight=sft_weight)
  logps = _hand_logps(fixed_logits, batch)
  h = (logps[:, 0] - batch['reference_logps'][:, 0]) - (logps[:, 1] - batch['reference_logps'][:, 1])
  log_sigmoid = lambda x: -np.log1p(np.exp(-x))
  eps = label_smoothing
  per_pair = {'sigmoid': -(1 - eps) * log_sigmoid(0.1 * h) - eps * log_sigmoid(-0.1 * h),
              'robust': (-(1 - eps) * log_sigmoid(0.1 * h) + eps * log_sigmoid(-0.1 * h)) / (1 - 2 * eps),
              'ipo': (h - 5.0) ** 2}[loss_type]
  lengths = np.array([[2, 4], [4, 2]])     # response tokens after position 0
  nll = (-logps[:, 0] / lengths[:, 0]).mean()
  np.testing.assert_allclose(loss, per_pair.mean() + sft_weight * nll, rtol=1e-5)
  rewards = 0.1 * (logps - batch['reference_logps'])
  expected = {'rewards/chosen': rewards[:, 0].mean(), 'rewards/rejected': rewards[:, 1].mean(),
              'rewards/margins': (rewards[:, 0] - rewards[:, 1]).mean(),
              'rewards/accuracies': (rewards[:, 0] > rewards[:, 1]).mean(),
              'logps/chosen': logps[:, 0].mean(), 'logps/rejected': logps[:, 1].mean(),
              'response_length/chosen': 3.0, 'response_length/rejected': 3.0, 'sft_loss': nll, 'pairs': 2.0}
  for name, value in expected.items():
    np.testing.assert_allclose(aux[name], value, rtol=1e-5, err_msg=name)


@pytest.mark.fast
def test_an_anchor_row_adds_only_its_weighted_nll_and_stays_out_of_the_pair_metrics(fixed_logits):
  batch = {**_fixture_batch(), 'anchor': np.array([0, 1], np.int32)}   # row 1: an anchor
  loss, aux = dpo.loss_fn(None, batch, None, model_config=MICRO, beta=0.1, sft_weight=0.5, anchor_weight=2.0)
  logps = _hand_logps(fixed_logits, batch)
  h = (logps[0, 0] - batch['reference_logps'][0, 0]) - (logps[0, 1] - batch['reference_logps'][0, 1])
  nll = -logps[:, 0] / np.array([2, 4])                                # response tokens of each chosen reply
  # Row 0: DPO + 0.5 · NLL; row 1: 2 · its NLL, no preference term; the mean over both rows.
  np.testing.assert_allclose(loss, (np.log1p(np.exp(-0.1 * h)) + 0.5 * nll[0] + 2.0 * nll[1]) / 2, rtol=1e-5)
  rewards = 0.1 * (logps[0] - batch['reference_logps'][0])
  for name, value in {'rewards/chosen': rewards[0], 'rewards/margins': rewards[0] - rewards[1],
                      'logps/rejected': logps[0, 1], 'sft_loss': nll[0], 'anchor_loss': nll[1], 'anchor_rows': 1.0,
                      'response_length/chosen': 2.0, 'pairs': 2.0}.items():
    np.testing.assert_allclose(aux[name], value, rtol=1e-5, err_msg=name)


@pytest.mark.fast
def test_prompt_and_tool_tokens_never_contribute(fixed_logits, monkeypatch):
  batch = _fixture_batch()
  loss, aux = dpo.loss_fn(None, batch, None, model_config=MICRO, sft_weight=0.5)
  # Logits at positions whose next token is not a response token (prompt, tool result, padding).
  rows = np.concatenate([batch['loss_mask'][:, 0], batch['loss_mask'][:, 1]])[:, 1:]    # [2B, T-1]
  changed = fixed_logits.copy()
  changed[:, :-1][rows == 0] += np.random.default_rng(2).normal(0, 5, (int((rows == 0).sum()), MICRO.vocab_size))
  changed[:, -1] += np.random.default_rng(4).normal(0, 5, MICRO.vocab_size)   # the last predicts nothing
  monkeypatch.setattr(model, 'apply', lambda *args, **kwargs: jnp.asarray(changed))
  same, same_aux = dpo.loss_fn(None, batch, None, model_config=MICRO, sft_weight=0.5)
  np.testing.assert_allclose(same, loss, rtol=1e-6)
  np.testing.assert_allclose(same_aux['logps/rejected'], aux['logps/rejected'], rtol=1e-6)
  changed[1, 3] += np.random.default_rng(3).normal(0, 5, MICRO.vocab_size)   # a response position: it moves
  assert abs(float(dpo.loss_fn(None, batch, None, model_config=MICRO, sft_weight=0.5)[0]) - float(loss)) > 1e-4


def test_trailing_tool_tokens_never_contribute_with_a_real_model():
  params = host_params(MICRO, 0)
  batch = _fixture_batch()
  loss = jax.jit(lambda batch: dpo.loss_fn(params, batch, None, model_config=MICRO)[0])
  changed = {k: v.copy() for k, v in batch.items()}
  changed['tokens'][1, 1, 6] = 7 if batch['tokens'][1, 1, 6] != 7 else 8   # a tool token at the end (mask 0)
  np.testing.assert_allclose(loss(changed), loss(batch), rtol=1e-6)
  changed['tokens'][1, 1, 5] = 7 if batch['tokens'][1, 1, 5] != 7 else 8   # a response token
  assert abs(float(loss(changed)) - float(loss(batch))) > 1e-6


def _random_pairs(count, seed):
  """Pairs of a shared prompt (mask 0) and two replies of random lengths with tool tokens (mask 0) among
  them; every third row an anchor (its reply in both halves)."""
  rng = np.random.default_rng(seed)
  pairs = []
  for index in range(count):
    prompt = rng.integers(4, MICRO.vocab_size, int(rng.integers(3, 12))).tolist()
    sides = {}
    for side in dpo.SIDES:
      n = int(rng.integers(2, 10))
      sides[side] = (prompt + rng.integers(4, MICRO.vocab_size, n).tolist(),
                     [0] * len(prompt) + [1] + (rng.random(n - 1) > 0.2).astype(int).tolist())
    anchor = index % 3 == 2
    if anchor:
      sides['rejected'] = sides['chosen']
    pairs.append(_pair(*sides['chosen'][:1], *sides['rejected'][:1], sides['chosen'][1], sides['rejected'][1],
                       kind=dpo.ANCHOR if anchor else 'concise'))
  return pairs


def test_score_columns_give_the_same_logps_loss_and_gradient():
  """pair_batch's score_columns project onto the vocabulary only at response tokens: the pair log-probs,
  the loss, its metrics and its gradient, whole and in micro-batches, equal the every-position ones (fp32)."""
  params = host_params(MICRO, 0)
  pairs = _random_pairs(8, seed=5)
  batch = dpo.pair_batch(pairs, range(8), -np.random.default_rng(6).uniform(10, 30, (8, 2)), length_multiple=8)
  full = {k: v for k, v in batch.items() if k != 'score_columns'}
  narrow = logprobs.with_score_columns(full, multiple=4)     # fewer columns than T - 1, padded with -1
  length = full['tokens'].shape[-1]
  assert batch['score_columns'].shape == (8, 2, min(logprobs.SCORE_COLUMN_MULTIPLE, length - 1))
  assert narrow['score_columns'].shape[-1] < length - 1 and (narrow['score_columns'] == -1).any()
  assert dpo.flatten_pairs(narrow)['score_columns'].shape == (16, narrow['score_columns'].shape[-1])
  pair_logps = jax.jit(dpo.pair_logps, static_argnums=0)
  expected = pair_logps(MICRO, params, full)
  for scored in (batch, narrow):
    np.testing.assert_allclose(pair_logps(MICRO, params, scored), expected, rtol=1e-5, atol=1e-5)
  loss = functools.partial(dpo.loss_fn, model_config=MICRO, beta=0.1, sft_weight=0.5, anchor_weight=2.0)
  for grad_accum_steps in (1, 2):
    grad = jax.jit(functools.partial(step_lib.accumulate_gradients, loss, grad_accum_steps=grad_accum_steps,
                                     denominator='pairs', aux_weights=dpo.AUX_WEIGHTS))
    full_grads, full_aux = grad(params, full, jax.random.key(0))
    part_grads, part_aux = grad(params, narrow, jax.random.key(0))
    assert float(full_aux['anchor_rows']) == 2.0
    for name in full_aux:
      np.testing.assert_allclose(part_aux[name], full_aux[name], rtol=1e-5, atol=1e-6, err_msg=name)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), part_grads, full_grads)


# ---- batches and pairs ------------------------------------------------------------------------------------


def _pair(chosen, rejected, chosen_mask, rejected_mask, **extra):
  return {'chosen_tokens': chosen, 'chosen_loss_mask': chosen_mask, 'rejected_tokens': rejected,
          'rejected_loss_mask': rejected_mask, **extra}


@pytest.mark.fast
def test_pair_batch_pads_and_keeps_a_pair_in_one_row():
  pairs = [_pair([2, 5, 6], [2, 5, 7, 8, 9], [0, 1, 1], [0, 1, 1, 0, 1]), _pair([2, 3], [2, 4], [0, 1], [0, 1])]
  batch = dpo.pair_batch(pairs, np.array([1, 0]), np.array([[-1.0, -2.0], [-3.0, -4.0]]), length_multiple=4)
  assert batch['tokens'].shape == (2, 2, 8)
  assert batch['tokens'][1, 1].tolist() == [2, 5, 7, 8, 9, 0, 0, 0]
  assert batch['loss_mask'][1, 1].tolist() == [0, 1, 1, 0, 1, 0, 0, 0]
  assert batch['segment_ids'][0, 0].tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
  assert batch['reference_logps'].tolist() == [[-3.0, -4.0], [-1.0, -2.0]]
  # Score columns: t where token t+1 is a response token, per half, padded with -1 (M capped at T - 1).
  assert batch['score_columns'].shape == (2, 2, 7)
  assert batch['score_columns'][1, 1].tolist() == [0, 1, 3, -1, -1, -1, -1]
  assert batch['score_columns'][0, 0].tolist() == [0, -1, -1, -1, -1, -1, -1]
  rows = dpo.flatten_pairs(batch)
  assert rows['tokens'].shape == (4, 8) and rows['tokens'][2].tolist() == batch['tokens'][0, 1].tolist()
  assert rows['score_columns'][3].tolist() == batch['score_columns'][1, 1].tolist()


def _scored(example, tokenizer, response, *, correct, mismatch=False, thinking=None):
  turn = tokenizer_lib.AssistantTurn(thinking=thinking, response=response, ended=True)
  ids = tokenizer.render([{'role': 'assistant', 'thinking': thinking, 'response': response}], 'concise')[0]
  ids = ids[ids.index(tokenizer.special_ids[tokenizer_lib.ROLE_TOKENS['assistant']]) + 1:]   # after the header
  zeros = np.zeros(len(ids), np.float32)
  rollout = sampling.Rollout(token_ids=np.asarray(ids, np.int32), loss_mask=np.ones(len(ids), np.int32),
                             logprobs=zeros, untruncated_logprobs=zeros, actions=[], final_turn=turn,
                             stop_reason='end_of_turn')
  return rollouts.Scored(example, rollout, Verdict(correct=correct, format_ok=True, language_mismatch=mismatch),
                         float(correct))


@pytest.mark.fast
def test_build_pairs_kinds_limits_and_provenance(monkeypatch):
  tokenizer = tokenizer_lib.default()
  examples = [suites.load('math', 'train')[0], suites.load('chat', 'train')[0]]
  long_thinking = 'First I add the numbers, then I take away the ones given to a friend, step by step. ' * 2

  def fake_generate_and_score(model_config, params, tokenizer_, batch, prompts, rng, *, samples_per_prompt, **kwargs):
    assert samples_per_prompt == 4 and kwargs['settings'].temperature == 1.0
    return [[_scored(e, tokenizer, e.answer, correct=True),                                   # short: no pair
             _scored(e, tokenizer, 'Wrong.', correct=False, thinking=long_thinking),           # verbose, wrong
             _scored(e, tokenizer, e.answer, correct=True, thinking=long_thinking),            # verbose: the pair
             _scored(e, tokenizer, 'Wrong language.', correct=False, mismatch=True)]           # language pair
            for e in batch]

  monkeypatch.setattr(rollouts, 'generate_and_score', fake_generate_and_score)
  config = _config()
  pairs, summary = pairs_lib.build_pairs(config, None, None, tokenizer, examples)
  assert [(p['example_id'], p['kind'], p['sample_index']) for p in pairs] == [
      (examples[0].id, 'concise', 2), (examples[0].id, 'language', 3),
      (examples[1].id, 'concise', 2), (examples[1].id, 'language', 3)]  # a correct verbose reply first, limit 1
  assert summary['pairs']['concise']['pairs'] == 2 and summary['pairs']['concise']['rejected_correct'] == 1.0
  for pair in pairs:
    prompt = rollouts.render_prompt(tokenizer, examples[[e.id for e in examples].index(pair['example_id'])], 'concise')
    assert pair['chosen_tokens'][:len(prompt)] == pair['rejected_tokens'][:len(prompt)] == prompt
    assert not any(pair['chosen_loss_mask'][:len(prompt)]) and not any(pair['rejected_loss_mask'][:len(prompt)])
    assert pair['chosen_length'] == sum(pair['chosen_loss_mask'])
    assert pair['rejected_length'] == sum(pair['rejected_loss_mask'])
    assert pair['sampling'] == dict(config.sampling) and pair['mode'] == 'concise'
    assert pair['policy'] == config.init_from
    if pair['kind'] == 'concise':
      assert pair['rejected_length'] >= max(config.dpo.verbose_min_ratio * pair['chosen_length'],
                                            pair['chosen_length'] + config.dpo.verbose_min_extra)
  assert [pairs[0]['chosen_text'], pairs[2]['chosen_text']] == [pairs_lib.direct_response(e) for e in examples]


@pytest.mark.fast
def test_anchor_rows_hold_the_first_correct_finished_reply_in_the_prompt_language(monkeypatch):
  tokenizer = tokenizer_lib.default()
  examples = [suites.load('math', 'train')[0], suites.load('chat', 'train')[0]]
  thinking = 'I add the numbers.'

  def fake_generate_and_score(model_config, params, tokenizer_, batch, prompts, rng, **kwargs):
    assert kwargs['settings'].max_tool_turns == 2     # reasoning mode calls the calculator
    groups = []
    for e in batch:
      overlong = _scored(e, tokenizer, e.answer, correct=True, thinking=thinking)
      overlong = dataclasses.replace(overlong, rollout=dataclasses.replace(overlong.rollout, stop_reason='overlong'))
      groups.append([_scored(e, tokenizer, 'Wrong.', correct=False, thinking=thinking), overlong,
                     _scored(e, tokenizer, e.answer, correct=True, mismatch=True, thinking=thinking),
                     _scored(e, tokenizer, e.answer, correct=True, thinking=thinking),       # the anchor
                     _scored(e, tokenizer, e.answer, correct=True)])
    return groups

  monkeypatch.setattr(rollouts, 'generate_and_score', fake_generate_and_score)
  config = _config()
  config.dpo.anchor_modes = ('reasoning',)
  pairs, summary = pairs_lib.build_pairs(config, None, None, tokenizer, [], examples)   # anchors only
  assert [(p['example_id'], p['kind'], p['mode'], p['sample_index']) for p in pairs] == [
      (e.id, 'anchor', 'reasoning', 3) for e in examples]
  assert summary['sampling']['reasoning/anchor'] == 2 and 'all' not in summary['pairs']
  for pair, example in zip(pairs, examples):
    prompt = rollouts.render_prompt(tokenizer, example, 'reasoning')
    assert pair['chosen_tokens'] == pair['rejected_tokens'] and pair['chosen_tokens'][:len(prompt)] == prompt
    assert pair['chosen_loss_mask'] == pair['rejected_loss_mask'] == [0] * len(prompt) + [1] * (
        len(pair['chosen_tokens']) - len(prompt))
    assert example.answer in pair['chosen_text'] and pair['chosen_text'] == pair['rejected_text']
  batch = dpo.pair_batch(pairs + [_pair([2, 3], [2, 4], [0, 1], [0, 1], kind='concise')], [0, 2], length_multiple=8)
  assert batch['anchor'].tolist() == [1, 0]


@pytest.mark.fast
def test_an_unverifiable_reference_reply_is_not_chosen():
  tokenizer = tokenizer_lib.default()
  example = suites.load('math', 'train')[0]
  assert pairs_lib.chosen_reply(tokenizer, example, 'concise', 'reference') is not None
  wrong = dataclasses.replace(example, response='The answer is 1234567.')
  assert pairs_lib.chosen_reply(tokenizer, wrong, 'concise', 'reference') is None
  assert pairs_lib.chosen_reply(tokenizer, wrong, 'concise', 'direct')['text'] == pairs_lib.direct_response(example)
  with pytest.raises(errors.UserError, match='config.dpo.chosen'):
    pairs_lib.chosen_reply(tokenizer, example, 'concise', 'shortest')


@pytest.mark.parametrize('task', pairs_lib.DIRECT_TASKS)
def test_the_direct_answer_is_verified_and_shorter_than_the_reference_reply(task):
  tokenizer = tokenizer_lib.default()
  examples = {e.language: e for e in suites.load(task, 'train')}  # one per language
  for language, example in examples.items():
    direct = pairs_lib.chosen_reply(tokenizer, example, 'concise', 'direct')
    reference = pairs_lib.chosen_reply(tokenizer, example, 'concise', 'reference')
    assert direct is not None and direct['text'] == pairs_lib.direct_response(example), (language, direct)
    assert direct['loss_mask'].sum() <= reference['loss_mask'].sum()
    assert example.answer in direct['text']
  assert pairs_lib.direct_response(examples['ko']).endswith(('입니다.', f'정답: {examples["ko"].answer}'))
  if task == 'korean_mc':  # the chosen option and its letter: the filled-in sentence the reference restates is gone
    example = examples['ko']
    particle = example.meta['options']['ABCDEFGHIJ'.index(example.answer)]
    assert particle in example.response and example.response.endswith(f'정답: {example.answer}')
    assert pairs_lib.direct_response(example) == f'{particle} 정답: {example.answer}' != example.response
    without_options = dataclasses.replace(example, meta={})
    assert pairs_lib.direct_response(without_options) == f'정답: {example.answer}'


def test_the_with_math_variant_adds_math_pairs_and_changes_nothing_else():
  default, with_math = _config().to_dict(), _config('with_math').to_dict()
  assert 'math' not in default['dpo']['tasks']
  assert tuple(with_math['dpo']['tasks']) == (*default['dpo']['tasks'], 'math')
  with_math['dpo']['tasks'] = default['dpo']['tasks']
  assert with_math == default


def test_a_task_without_a_direct_answer_is_a_clear_error():
  with pytest.raises(errors.UserError, match="task 'nl2sql'"):
    pairs_lib.direct_response(suites.load('nl2sql', 'train')[0])


@pytest.mark.fast
def test_a_malformed_pair_file_names_its_line(tmp_path):
  path = tmp_path / 'pairs.jsonl'
  good = _pair([2, 5], [2, 6], [0, 1], [0, 1])
  tokenizer = tokenizer_lib.default()
  for bad in ({**good, 'rejected_loss_mask': [0, 0]}, {**good, 'tokenizer': 'another0123456789'}):
    path.write_text(json.dumps(good) + '\n' + json.dumps(bad) + '\n')
    with pytest.raises(errors.UserError, match=r'pairs.jsonl:2: not a DPO pair'):
      pairs_lib.read_pairs(path, tokenizer)
  path.write_text(json.dumps(good) + '\n' + json.dumps({**good, 'tokenizer': tokenizer.fingerprint}) + '\n')
  assert len(pairs_lib.read_pairs(path, tokenizer)) == 2   # no fingerprint: a file from before pairs recorded one


# ---- the cached reference log-probs ----------------------------------------------------------------------


def test_reference_logps_are_cached_reused_and_invalidated(tmp_path, monkeypatch):
  calls = []
  compute = dpo.compute_reference_logps
  monkeypatch.setattr(dpo, 'compute_reference_logps',
                      lambda *args, **kwargs: calls.append(1) or compute(*args, **kwargs))
  mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  rng = np.random.default_rng(3)
  pairs = [_pair(rng.integers(4, 64, 9).tolist(), rng.integers(4, 64, 6).tolist(), [0] * 4 + [1] * 5,
                 [0] * 4 + [1] * 2) for _ in range(3)]
  params = host_params(MICRO, 0)
  get = lambda params, pairs: dpo.reference_logps(tmp_path, MICRO, params, pairs, mesh=mesh, batch_size=2,
                                                  length_multiple=8)
  first = get(params, pairs)
  assert len(calls) == 1 and first.shape == (3, 2) and (tmp_path / dpo.REFERENCE_FILE).is_file()
  every_position = {k: v for k, v in dpo.pair_batch(pairs, range(3), length_multiple=8).items() if k != 'score_columns'}
  direct = jax.jit(dpo.pair_logps, static_argnums=0)(MICRO, params, every_position)
  np.testing.assert_allclose(first, direct, rtol=1e-5)   # the scored-columns pass equals logits at every position
  np.testing.assert_array_equal(get(params, pairs), first)                    # a second run: reused
  assert len(calls) == 1
  other_params = jax.tree.map(lambda x: x * 1.01, params)
  changed = get(other_params, pairs)                                          # another model: recomputed
  assert len(calls) == 2 and not np.allclose(changed, first)
  other_pairs = [dict(pairs[0], rejected_tokens=pairs[0]['rejected_tokens'][:-1] + [5]), *pairs[1:]]
  get(other_params, other_pairs)                                              # other data: recomputed
  assert len(calls) == 3
  get(other_params, other_pairs)
  assert len(calls) == 3
  windowed = dpo.reference_logps(tmp_path, dataclasses.replace(MICRO, sliding_window=2), other_params, other_pairs,
                                 mesh=mesh, batch_size=2, length_multiple=8)   # same params, another config
  assert len(calls) == 4                                                      # recomputed, and different
  assert not np.allclose(windowed, compute(MICRO, other_params, other_pairs, mesh=mesh, batch_size=2,
                                           length_multiple=8))


# ---- the command line, end to end ------------------------------------------------------------------------


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """configs/dpo.py:smoke (3 steps), then the same command with one more step on the same workdir."""
  root = tmp_path_factory.mktemp('dpo')
  workdir, cache = root / 'run', root / 'jax_cache'
  code, stdout, log = main_runs.outputs(main_runs.start(SMOKE, workdir, cache_dir=cache))
  assert code == 0, log[-3000:]
  first = (workdir / 'metrics.jsonl').read_text()
  code, resume_log = main_runs.finish(main_runs.start(SMOKE, workdir, cache_dir=cache,
                                                      overrides=['--config.total_steps=4']))
  assert code == 0, resume_log[-3000:]
  return {'workdir': workdir, 'log': log, 'first_metrics': first, 'resume_log': resume_log, 'stdout': stdout}


def test_smoke_run_shows_preference_accuracy_and_ends_with_concise_length_before_and_after(runs):
  first = [json.loads(line) for line in runs['first_metrics'].splitlines()]
  length = 'eval/concise/response_length'
  lines = runs['stdout'].splitlines()
  assert 'dpo: step 3 of 3' in lines
  assert any(line.split() == [length, f'{first[0][length]:.4g}', '→', f'{first[-1][length]:.4g}', '(step', '0', '→',
                              '3)'] for line in lines), runs['stdout']
  assert 'rewards/accuracies=' in runs['log'] and 'rewards/margins=' in runs['log']


def test_smoke_run_logs_trl_metrics_and_both_eval_modes(runs):
  rows = metrics.read(runs['workdir'])
  assert [r['step'] for r in rows] == [0, 1, 2, 3, 4]
  for name in ('train/loss', 'train/rewards/chosen', 'train/rewards/rejected', 'train/rewards/margins',
               'train/rewards/accuracies', 'train/logps/chosen', 'train/logps/rejected',
               'train/response_length/chosen', 'train/response_length/rejected'):
    assert name in rows[1], name
  # Step 1's policy is the starting policy: its log-probs equal the cached reference's, so h = 0.
  assert rows[1]['train/loss'] == pytest.approx(math.log(2), abs=1e-4)
  assert rows[1]['train/rewards/margins'] == pytest.approx(0.0, abs=1e-3)
  assert rows[3]['train/rewards/margins'] > 0 and rows[3]['train/loss'] < math.log(2)
  for mode in ('concise', 'reasoning'):
    for name in (f'eval/{mode}/correctness', f'eval/{mode}/response_length'):
      assert name in rows[0] and name in rows[-1], name
  pairs = [json.loads(line) for line in (runs['workdir'] / pairs_lib.PAIRS_FILE).read_text().splitlines()]
  assert pairs and {'example_id', 'task', 'language', 'kind', 'sampling', 'chosen_length', 'rejected_length',
                    'rejected_correct'} <= set(pairs[0])


def test_rerun_resumes_and_reuses_pairs_and_reference(runs):
  log = runs['resume_log']
  assert 'resumed from' in log and 'at step 3' in log
  assert 'DPO pairs: reusing' in log and 'DPO reference log-probs: reusing' in log
  first = [json.loads(line) for line in runs['first_metrics'].splitlines()]
  again = metrics.read(runs['workdir'])[:4]
  # Steps 1-3 were not retrained; the resumed run's step 4 follows from the restored state.
  assert [r['step'] for r in first] == [r['step'] for r in again] == [0, 1, 2, 3]
  assert first[1]['train/loss'] == again[1]['train/loss']


def test_changed_pair_settings_are_a_clear_error(runs):
  config = _config('smoke')
  config.dpo.samples_per_prompt = 3
  with pytest.raises(errors.UserError, match='samples_per_prompt'):
    pairs_lib.load_or_build_pairs(config, runs['workdir'], None, None, tokenizer_lib.default())


def test_pairs_built_with_another_direct_answer_format_are_stale(runs, monkeypatch):
  # A pair file from before the Korean MC chosen reply kept its option text must not be reused silently.
  monkeypatch.setattr(pairs_lib, 'DIRECT_FORMAT', pairs_lib.DIRECT_FORMAT - 1)
  with pytest.raises(errors.UserError, match='direct_format'):
    pairs_lib.load_or_build_pairs(_config('smoke'), runs['workdir'], None, None, tokenizer_lib.default())
