"""RLOO's math (docs/rl.md): the leave-one-out advantages, dropped rows, and the policy-gradient loss."""

import hypothesis
from hypothesis import strategies as st
import jax
import numpy as np
import pytest

from luckystar import errors
from luckystar import model
from luckystar.engine import curriculum
from luckystar.engine import advantages as advantages_lib
from luckystar.engine import logprobs, rollouts
from luckystar.stages import rlvr


@pytest.mark.fast
def test_design_vector_k8_three_correct():
  rewards = np.array([[1, 1, 1, 0, 0, 0, 0, 0]], np.float32)
  advantages, used = advantages_lib.rloo_advantages(rewards, np.ones_like(rewards, bool))
  np.testing.assert_allclose(advantages[0, :3], 1 - 2 / 7, atol=1e-6)   # +0.714
  np.testing.assert_allclose(advantages[0, 3:], -3 / 7, atol=1e-6)      # −0.429
  assert np.round(float(advantages[0, 0]), 3) == 0.714 and np.round(float(advantages[0, 3]), 3) == -0.429
  assert used.all()


@pytest.mark.fast
def test_dropped_rows_leave_the_baseline_and_the_loss():
  rewards = np.array([[1, 0, 1, 1]], np.float32)
  survived = np.array([[True, True, False, True]])
  advantages, used = advantages_lib.rloo_advantages(rewards, survived)
  # survivors 1, 0, 1: baselines (0+1)/2, (1+1)/2, (1+0)/2
  np.testing.assert_allclose(advantages, [[0.5, -1.0, 0.0, 0.5]], atol=1e-6)
  assert used.tolist() == [[True, True, False, True]]


@pytest.mark.fast
def test_groups_with_fewer_than_two_survivors_contribute_nothing():
  rewards = np.array([[1, 0, 0], [1, 1, 0]], np.float32)
  survived = np.array([[True, False, False], [False, False, False]])
  advantages, used = advantages_lib.rloo_advantages(rewards, survived)
  assert not used.any() and not np.asarray(advantages).any()


@pytest.mark.fast
@pytest.mark.parametrize('correct, mismatch, expected', [
    ([1, 1, 0, 0], [0, 0, 0, 0], [0.667, 0.667, -0.667, -0.667]),
    ([1, 1, 0, 0], [1, 0, 0, 0], [0.167, 0.833, -0.5, -0.5]),     # rewards 0.5, 1, 0, 0
    ([1, 0, 0, 0], [0, 1, 1, 0], [1.333, -0.667, -0.667, 0.0]),   # rewards 1, −0.5, −0.5, 0
    ([0, 0, 0, 0], [1, 1, 1, 1], [0.0, 0.0, 0.0, 0.0]),            # all −0.5: no signal
])
def test_language_penalty_combinations(correct, mismatch, expected):
  rewards = np.asarray(correct, np.float32) - 0.5 * np.asarray(mismatch, np.float32)
  advantages, _ = advantages_lib.rloo_advantages(rewards[None], np.ones((1, 4), bool))
  np.testing.assert_allclose(advantages[0], expected, atol=1e-3)


@pytest.mark.fast
@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.integers(1, 5).flatmap(lambda k: st.tuples(
    st.lists(st.lists(st.sampled_from([-0.5, 0.0, 0.5, 1.0]), min_size=k, max_size=k), min_size=1, max_size=6),
    st.lists(st.lists(st.booleans(), min_size=k, max_size=k), min_size=6, max_size=6))))
def test_advantages_of_a_group_sum_to_zero(data):
  rewards, survived = np.array(data[0], np.float32), np.array(data[1][:len(data[0])])
  advantages, used = advantages_lib.rloo_advantages(rewards, survived)
  advantages, used = np.asarray(advantages), np.asarray(used)
  np.testing.assert_allclose(advantages.sum(-1), 0.0, atol=1e-5)
  assert not advantages[~used].any()
  assert (used.any(-1) == (survived.sum(-1) >= 2)).all()
  zero = np.asarray(rlvr.zero_variance_groups(rewards, survived))
  assert (zero <= ~np.abs(advantages).any(-1)).all()   # no signal ⇒ all advantages 0


def _batch(config, rows=4, length=12, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, config.vocab_size, (rows, length)).astype(np.int32)
  loss_mask = np.zeros((rows, length), np.int32)
  loss_mask[:, length // 2:] = 1
  loss_mask[1, length - 3:] = 0                                # a spliced tool result
  return {'tokens': tokens, 'positions': np.tile(np.arange(length, dtype=np.int32), (rows, 1)),
          'segment_ids': np.ones((rows, length), np.int32), 'loss_mask': loss_mask,
          'advantages': np.array([1.0, -0.5, 0.25, 2.0], np.float32), 'used': np.array([1, 1, 1, 0], np.int32)}


@pytest.fixture(scope='module')
def tiny():
  config = model.get('tiny', hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                     layer_types=(model.SLIDING, model.FULL), sliding_window=4)
  return config, model.init(config, jax.random.key(0))


def test_on_policy_loss_is_advantage_weighted_nll_over_generated_tokens(tiny):
  config, params = tiny
  batch = _batch(config)
  token_lps, _ = logprobs.token_logprobs(config, params, batch, temperature=0.7)
  batch['old_logprobs'] = np.pad(np.asarray(token_lps), ((0, 0), (1, 0)))
  loss, aux = rlvr.loss_fn(params, batch, None, model_config=config, temperature=0.7)
  mask = batch['loss_mask'][:, 1:] * batch['used'][:, None]
  on_policy = -(batch['advantages'][:, None] * mask).sum() / mask.sum()    # ratio = 1 on every token
  np.testing.assert_allclose(loss, on_policy, rtol=1e-5)
  assert aux['tokens'] == mask.sum()

  # The gradient is that of −Σ A·log π / tokens; prompt, tool and dropped-row tokens never contribute.
  def reinforce(p):
    lp, _ = logprobs.token_logprobs(config, p, batch, temperature=0.7)
    return -(batch['advantages'][:, None] * lp * mask).sum() / mask.sum()
  grads = jax.grad(lambda p: rlvr.loss_fn(p, batch, None, model_config=config, temperature=0.7)[0])(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), grads, jax.grad(reinforce)(params))
  changed = dict(batch, tokens=batch['tokens'].copy())
  changed['tokens'][3, -1] = 5                                  # a dropped row (used 0)
  changed['tokens'][1, -1] = 5                                  # a tool-result token (mask 0) at the end
  np.testing.assert_allclose(rlvr.loss_fn(params, changed, None, model_config=config, temperature=0.7)[0], loss,
                             rtol=1e-6)


def test_clipping_and_kl(tiny):
  config, params = tiny
  batch = _batch(config)
  token_lps, _ = logprobs.token_logprobs(config, params, batch, temperature=1.0)
  token_lps = np.asarray(token_lps)
  shift = np.random.default_rng(1).normal(0, 0.5, token_lps.shape).astype(np.float32)
  batch['old_logprobs'] = np.pad(token_lps + shift, ((0, 0), (1, 0)))
  batch['ref_logprobs'] = np.pad(token_lps - shift, ((0, 0), (1, 0)))
  loss, aux = rlvr.loss_fn(params, batch, None, model_config=config, clip_epsilon=0.2, kl_beta=0.1)
  ratio = np.exp(-shift)
  advantages = batch['advantages'][:, None]
  objective = np.minimum(ratio * advantages, np.clip(ratio, 0.8, 1.2) * advantages)
  kl = np.exp(-shift) + shift - 1
  mask = batch['loss_mask'][:, 1:] * batch['used'][:, None]
  np.testing.assert_allclose(loss, ((-objective + 0.1 * kl) * mask).sum() / mask.sum(), rtol=1e-4)
  np.testing.assert_allclose(aux['clip_fraction'], ((np.abs(ratio - 1) > 0.2) * mask).sum() / mask.sum(), rtol=1e-5)
  per_sequence, _ = rlvr.loss_fn(params, batch, None, model_config=config, clip_epsilon=0.2, kl_beta=0.1,
                                 normalize='sequences')
  rows = ((-objective + 0.1 * kl) * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
  np.testing.assert_allclose(per_sequence, rows[mask.sum(-1) > 0].mean(), rtol=1e-4)


def test_scoring_only_generated_columns_is_exact(tiny):
  """training_batch's score_columns project onto the vocabulary at generated tokens only: the loss,
  its metrics and its gradient equal the full projection's."""
  config, params = tiny
  batch = _batch(config)
  token_lps = np.asarray(logprobs.token_logprobs(config, params, batch, temperature=1.0)[0])
  shift = np.random.default_rng(2).normal(0, 0.3, token_lps.shape).astype(np.float32)
  batch['old_logprobs'] = np.pad(token_lps + shift, ((0, 0), (1, 0)))
  batch['ref_logprobs'] = np.pad(token_lps - shift, ((0, 0), (1, 0)))
  scored = logprobs.with_score_columns(batch, multiple=4)
  assert scored['score_columns'].shape[1] < batch['tokens'].shape[1] - 1
  for normalize in rlvr.NORMALIZATIONS:
    loss = lambda p, b: rlvr.loss_fn(p, b, None, model_config=config, clip_epsilon=0.2, kl_beta=0.1,
                                     normalize=normalize)
    (full, full_aux), full_grads = jax.value_and_grad(loss, has_aux=True)(params, batch)
    (part, part_aux), part_grads = jax.value_and_grad(loss, has_aux=True)(params, scored)
    np.testing.assert_allclose(part, full, rtol=1e-5)
    for name in ('kl', 'entropy', 'ratio', 'clip_fraction', 'tokens', 'sequences'):
      np.testing.assert_allclose(part_aux[name], full_aux[name], rtol=1e-5, err_msg=name)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), part_grads, full_grads)


def _scored(example, continuation, mask, *, correct, overlong=False, reward=None):
  from luckystar import sampling
  from luckystar.rewards.reward import Verdict
  from luckystar.tokenizer import AssistantTurn
  rollout = sampling.Rollout(token_ids=np.asarray(continuation, np.int32), loss_mask=np.asarray(mask, np.int32),
                             logprobs=-np.ones(len(continuation), np.float32),
                             untruncated_logprobs=-np.arange(1, len(continuation) + 1, dtype=np.float32),
                             actions=[], final_turn=AssistantTurn(response='x'),
                             stop_reason='overlong' if overlong else 'end_of_turn')
  verdict = Verdict(correct=correct, format_ok=True, language_mismatch=False)
  return rollouts.Scored(example, rollout, verdict,
                         None if overlong else (float(correct) if reward is None else reward))


@pytest.mark.fast
def test_training_batch_aligns_prompts_rollouts_and_advantages():
  from luckystar.data import suites
  example = suites.load('korean_mc', 'train')[0]
  prompts = [[2, 10, 11], [2, 12]]
  groups = [[_scored(example, [20, 21], [1, 1], correct=True), _scored(example, [22, 23, 24], [1, 0, 1], correct=False)],
            [_scored(example, [25], [1], correct=True), _scored(example, [26, 27], [1, 1], correct=False, overlong=True)]]
  batch, zero_variance = rlvr.training_batch(prompts, groups, length_multiple=4)
  assert batch['tokens'].shape == (4, 8)
  assert batch['tokens'][1].tolist() == [2, 10, 11, 22, 23, 24, 0, 0]
  assert batch['loss_mask'][1].tolist() == [0, 0, 0, 1, 0, 1, 0, 0]
  assert batch['segment_ids'][2].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
  np.testing.assert_array_equal(batch['old_logprobs'][0, 3:5], [-1, -2])
  np.testing.assert_allclose(batch['advantages'], [1, -1, 0, 0])
  assert batch['used'].tolist() == [1, 1, 0, 0] and zero_variance.tolist() == [False, False]
  assert batch['score_columns'][1, :2].tolist() == [2, 4]            # columns whose next token was generated
  metrics = rlvr.rollout_metrics(groups, zero_variance)
  assert metrics['train/overlong_fraction'] == 0.25 and metrics['train/pass_rate'] == 0.5
  assert metrics['train/reward'] == pytest.approx(2 / 3)


@pytest.mark.fast
def test_eval_set_follows_the_rl_mix_and_is_fixed():
  from luckystar.data import suites
  selected = suites.load('math', 'train')[:30] + suites.load('korean_mc', 'train')[:10]
  heldout = suites.load('math', 'heldout') + suites.load('korean_mc', 'heldout')
  chosen = curriculum.eval_examples(selected, heldout, 20, seed=0)
  assert chosen == curriculum.eval_examples(selected, heldout, 20, seed=0) and len(chosen) == 20
  mix = lambda examples: {key: sum(1 for e in examples if (e.task, e.language) == key) / len(examples)
                          for key in {(e.task, e.language) for e in selected}}
  for key, share in mix(selected).items():
    assert abs(mix(chosen)[key] - share) <= 1 / 20 + 1e-9, key
  assert {e.split for e in chosen} == {'heldout'}


@pytest.mark.fast
def test_allocate_hands_a_short_groups_share_to_the_others():
  assert curriculum.allocate(10, {'a': 1, 'b': 1}, {'a': 9, 'b': 9}) == {'a': 5, 'b': 5}
  assert curriculum.allocate(3, {'a': 1, 'b': 1}, {'a': 9, 'b': 9}) == {'a': 2, 'b': 1}   # a tie: the earlier key
  # 'a' would get 6 of 12 but holds 2: the other 10 go to b and c as 3 : 1 (7.5 : 2.5, the tie to b).
  assert curriculum.allocate(12, {'a': 3, 'b': 2.25, 'c': 0.75}, {'a': 2, 'b': 99, 'c': 99}) == {'a': 2, 'b': 8, 'c': 2}
  assert curriculum.allocate(11, {'a': 3, 'b': 2, 'c': 1}, {'a': 1, 'b': 99, 'c': 99}) == {'a': 1, 'b': 7, 'c': 3}
  assert curriculum.allocate(5, {'a': 1, 'b': 0}, {'a': 9, 'b': 9}) == {'a': 5, 'b': 0}   # weight 0: none
  assert curriculum.allocate(4, {'a': 1, 'b': 1}, {'a': 1, 'b': 3}) == {'a': 1, 'b': 3}   # both full


@pytest.mark.fast
def test_eval_set_keeps_its_size_when_a_group_runs_short():
  """Chat has 62 held-out prompts: a chat-heavy RL mix still gets `count` prompts, the rest from the
  other groups in proportion, and more than the split holds is a config error."""
  from luckystar.data import suites
  selected = suites.load('chat', 'train')[:90] + suites.load('math', 'train')[:10]
  heldout = suites.load('chat', 'heldout') + suites.load('math', 'heldout')
  chosen = curriculum.eval_examples(selected, heldout, 200, seed=0)
  assert len(chosen) == 200 and len(set(chosen)) == 200
  assert sum(e.task == 'chat' for e in chosen) == len(suites.load('chat', 'heldout'))   # all of chat
  with pytest.raises(errors.UserError, match='config.rlvr.eval_prompts=1000'):
    curriculum.eval_examples(selected, heldout, 1000, seed=0)


@pytest.mark.fast
def test_selection_candidates_per_task_budget():
  from luckystar.data import suites
  pool = suites.load('math', 'train')[:200] + suites.load('korean_mc', 'train')[:50]
  chosen = curriculum.selection_candidates(pool, {'math': 10, 'korean_mc': 70}, seed=0)
  assert [e.task for e in chosen].count('math') == 10 and [e.task for e in chosen].count('korean_mc') == 50
  assert chosen == curriculum.selection_candidates(pool, {'math': 10, 'korean_mc': 70}, seed=0)
  assert chosen != curriculum.selection_candidates(pool, {'math': 10, 'korean_mc': 70}, seed=1)
  assert [pool.index(e) for e in chosen] == sorted(pool.index(e) for e in chosen)      # pool order
  assert len(curriculum.selection_candidates(pool, 30, seed=0)) == 30                           # a whole-pool budget
  with pytest.raises(errors.UserError, match='nl2sql'):
    curriculum.selection_candidates(pool, {'nl2sql': 4}, seed=0)


@pytest.mark.fast
def test_train_eval_set_is_reserved_before_selection(monkeypatch):
  """eval_split='train' (the NL2SQL cold start): new questions over the training databases. The eval set is
  drawn first from pool prompts whose gold SQL no RS prompt has, and every pool prompt that shares its gold SQL
  (the three training databases per domain share one wording; the English and Korean question share their SQL)
  leaves RL's pool, so prompt selection may measure all the rest; a reserved eval set is part of the selection
  cache's fingerprint. A registered prompt set (`bundled:<name>`, `luckystar.data.sources`) joins RL's pool, never
  the eval set, and changes the fingerprint. The held-out split is the default and anything else a
  config error."""
  import dataclasses
  import ml_collections
  from luckystar import tokenizer as tokenizer_lib
  from luckystar.data import sources, suites
  from luckystar.data.examples import rs_only
  config = ml_collections.ConfigDict(dict(seed=0, init_from='tiny-sft', sampling=dict(temperature=1.0), rlvr=dict(
      sources='bundled:nl2sql', max_prompt_tokens=384, selection_prompts={'nl2sql': 48}, selection_samples=8,
      select_pass_rate=(0.125, 0.875), eval_prompts=96, eval_split='train')))
  tok = tokenizer_lib.default()
  pool, _ = curriculum.prompt_pool(config.rlvr, 'train', tok, seed=0)
  heldout, rest = curriculum.reserve_eval(config, tok, pool)
  assert (heldout, rest) == curriculum.reserve_eval(config, tok, pool) and len(heldout) == 96
  assert set(heldout) <= set(pool) and set(rest) <= set(pool) and len(rest) >= 150
  assert not {e.answer for e in heldout} & {e.answer for e in rest}
  rs = [e for e in suites.load('nl2sql', 'train') if rs_only(e, 0)]
  assert not {e.answer for e in heldout} & {e.answer for e in rs}
  share = lambda examples: sum(e.language == 'ko' for e in examples) / len(examples)
  assert abs(share(heldout) - share(pool)) <= 1 / 96 + 1e-9                      # the pool's language mix
  assert {e.split for e in heldout} == {'train'}
  # An experiment's prompts: questions over other databases (here the held-out split's, as train prompts).
  extra = [dataclasses.replace(e, id=f'extra-{e.id}', split='train') for e in suites.load('nl2sql', 'heldout')[:16]]
  monkeypatch.setattr(sources, '_PROMPTS', dict(sources._PROMPTS))   # registrations end with the test
  sources.register_prompts('extra', lambda seed: extra)
  without = curriculum._fingerprint(config, tokenizer_lib.default())
  config.rlvr.sources = 'bundled:nl2sql,bundled:extra'
  bigger, reports = curriculum.prompt_pool(config.rlvr, 'train', tok, seed=0)
  assert [r.label for r in reports] == ['bundled:nl2sql', 'bundled:extra'] and reports[1].kept == 16
  extra_ids = {e.id for e in extra}
  rl_only = [e for e in bigger if e.id in extra_ids]
  assert rl_only and bigger == pool + rl_only
  assert not extra_ids & {e.id for e in curriculum.prompt_pool(config.rlvr, 'heldout', tok, seed=0)[0]}   # train only
  same_heldout, bigger_rest = curriculum.reserve_eval(config, tok, bigger)
  assert same_heldout == heldout                                   # the eval set stays on the training databases
  fresh = [e for e in rl_only if e.answer not in {h.answer for h in heldout}]
  assert fresh and [e for e in bigger_rest if e.id in extra_ids] == fresh
  assert curriculum._fingerprint(config, tokenizer_lib.default()) != without   # other prompts
  config.rlvr.sources = 'bundled:nl2sql,bundled:missing'
  with pytest.raises(errors.UserError, match=r"config.rlvr.sources: bundled:missing is neither a task .*'extra'"):
    curriculum.prompt_pool(config.rlvr, 'train', tok, seed=0)
  config.rlvr.sources = 'bundled:nl2sql'
  assert curriculum._fingerprint(config, tokenizer_lib.default()) == without
  fingerprint = curriculum._fingerprint(config, tokenizer_lib.default())
  config.rlvr.eval_prompts = 64
  assert curriculum._fingerprint(config, tokenizer_lib.default()) != fingerprint   # another reserve, another pool
  config.rlvr.eval_split = 'heldout'
  assert 'eval_prompts' not in curriculum._fingerprint(config, tokenizer_lib.default())
  assert {e.split for e in curriculum.eval_pool(config, tok, pool)} == {'heldout'}
  config.rlvr.eval_split = 'test'
  with pytest.raises(errors.UserError, match='config.rlvr.eval_split'):
    curriculum.eval_pool(config, tok, pool)


def test_config_errors_come_before_the_model_loads(tmp_path, monkeypatch):
  """A bad `config.rlvr.eval_split` is reported before the policy loads and prompt selection spends minutes of
  rollouts; an `eval_split` typo used to surface only after selection."""
  from luckystar import config as config_lib
  from luckystar.engine import state as state_lib
  config = config_lib.from_file(SMOKE.split(':')[0], SMOKE.split(':')[1])
  config.rlvr.eval_split = 'hedlout'
  monkeypatch.setattr(state_lib, 'start', lambda *a, **k: pytest.fail('the model loaded before the config check'))
  with pytest.raises(errors.UserError, match=r"config.rlvr.eval_split='hedlout'"):
    rlvr.run(config, str(tmp_path))
  config.rlvr.eval_split = 'heldout'
  config.batch_size = 3   # 12 rollouts over the 8 batch devices of data=-1
  with pytest.raises(errors.UserError, match=r'config.batch_size=3 prompts × config.rlvr.samples_per_prompt=4'):
    rlvr.run(config, str(tmp_path))
  config.batch_size, config.sampling.temperature = 2, 0.0   # logits / 0: every update NaN, silently skipped
  with pytest.raises(errors.UserError, match='config.sampling.temperature=0.0'):
    rlvr.run(config, str(tmp_path))


# ---- the stage end to end ------------------------------------------------------------------------

SMOKE = 'configs/rlvr.py:smoke'


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """configs/rlvr.py:smoke (3 steps, a checkpoint every step) uninterrupted, and killed after step 2."""
  import main_runs
  return main_runs.whole_and_resumed(SMOKE, tmp_path_factory.mktemp('rlvr'), crash_after=2)


def test_killed_and_resumed_rl_run_is_bitwise_equal_to_uninterrupted(runs):
  import main_runs
  from luckystar.engine import metrics
  assert runs['after_crash']['steps'] == [0, 1, 2] and 'resumed from' in runs['resume_log']
  whole, resumed = main_runs.params(runs['whole']), main_runs.params(runs['resumed'])
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(whole), jax.tree.leaves(resumed)):
    assert np.array_equal(np.asarray(a), np.asarray(b)), jax.tree_util.keystr(path)
  rows_whole, rows_resumed = metrics.read(runs['whole']), metrics.read(runs['resumed'])
  assert [r['step'] for r in rows_resumed] == [r['step'] for r in rows_whole] == [0, 1, 2, 3]
  for a, b in zip(rows_whole, rows_resumed):   # the same rollouts and rewards, step by step
    assert {k: v for k, v in a.items() if not k.startswith('perf/')} == \
        {k: v for k, v in b.items() if not k.startswith('perf/')}
  # The policy learned something: rewards varied within a group, so some update was not zero.
  assert any(row.get('train/grad_norm', 0) > 0 for row in rows_whole)
  for name in ('train/reward', 'train/pass_rate', 'train/zero_variance_groups', 'train/overlong_fraction',
               'train/entropy', 'perf/rollout_tokens_per_sec'):
    assert name in rows_whole[1], name
  assert {'eval/correctness', 'eval/language_mismatch', 'eval/sampled/correctness',
          'eval/sampled/language_mismatch'} <= set(rows_whole[0]) & set(rows_whole[-1])


def test_prompt_selection_is_cached_and_checked(runs):
  import json
  selection = json.loads((runs['whole'] / curriculum.SELECTION_FILE).read_text())
  assert selection['kept'] and set(selection['kept']) <= set(selection['pass_rates'])
  assert 'reusing' in runs['resume_log']
  from luckystar.data import examples, suites
  kept = {e.id: e for e in suites.load('chat', 'train')}
  assert not any(examples.rs_only(kept[i], 0) for i in selection['kept'])


def test_smoke_run_shows_reward_and_correctness_and_ends_with_its_summary(runs):
  from luckystar.engine import metrics
  whole = runs['whole'].absolute()
  rows = metrics.read(whole)
  before, after = (f'{100 * rows[i]["eval/correctness"]:.1f}%' for i in (0, -1))
  lines = runs['stdout'].splitlines()
  assert 'rlvr: step 3 of 3' in lines
  assert f'  eval/correctness          {before} → {after}  (step 0 → 3)' in lines
  assert any(line.startswith('  eval/language_mismatch   ') for line in lines)
  assert f'  checkpoints               {whole}/checkpoints' in lines
  assert f'  figure                    {whole}/plots/summary.png' in lines
  assert [p.name for p in (whole / 'plots').iterdir()] == ['summary.png']
  # The resumed run's progress bar (stderr) carries the batch's reward and correctness; its evals have bars.
  bar = runs['resume_log'].replace('\r', '\n')
  assert 'loss=' in bar and 'reward=' in bar and 'correctness=' in bar
  assert 'eval reasoning' in bar and 'eval reasoning sampled' in bar
