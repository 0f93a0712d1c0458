"""Reward terms (docs/rl.md#reward-terms): each term by hand, the default equal to the paper's formula, parsing."""

import pathlib
import types

import numpy as np
import pytest

from luckystar import errors
from luckystar.data.examples import Example
from luckystar.rewards import reward, terms
from luckystar.tokenizer import AssistantTurn

pytestmark = pytest.mark.fast

KO_MATH = Example(id='m-ko', task='math', language='ko', split='heldout',
                  prompt='철수는 사과를 3개 가지고 있고 4개를 더 샀습니다. 모두 몇 개입니까?', answer='7')
EN_MATH = Example(id='m-en', task='math', language='en', split='heldout',
                  prompt='Alice has 3 apples and buys 4 more. How many apples does she have now?', answer='7')
UNSCORABLE = Example(id='m-u', task='math', language='en', split='heldout', prompt='What is one half?',
                     answer='\\frac{1}{')   # the gold does not parse
SETTINGS = terms.Settings(budget=100, overlong_cache=20)


def rollout(continuation: int, generated: int | None = None, overlong: bool = False):
  """A stand-in `sampling.Rollout`: `continuation` tokens, of which `generated` the model's."""
  generated = continuation if generated is None else generated
  mask = np.array([1] * generated + [0] * (continuation - generated), np.int32)
  return types.SimpleNamespace(token_ids=np.zeros(continuation, np.int32), loss_mask=mask, overlong=overlong)


def verdict(correct=True, format_ok=True, mismatch=False):
  return reward.Verdict(correct=correct, format_ok=format_ok, language_mismatch=mismatch)


def test_each_term_by_hand():
  row = rollout(90, generated=30)
  assert terms.correct(KO_MATH, row, verdict(correct=True), SETTINGS) == 1.0
  assert terms.correct(KO_MATH, row, verdict(correct=False), SETTINGS) == 0.0
  assert terms.language_mismatch(KO_MATH, row, verdict(mismatch=True), SETTINGS) == 1.0
  assert terms.language_mismatch(KO_MATH, row, verdict(mismatch=False), SETTINGS) == 0.0
  assert terms.format_term(KO_MATH, row, verdict(format_ok=False), SETTINGS) == 0.0
  assert terms.format_term(KO_MATH, row, verdict(format_ok=True), SETTINGS) == 1.0
  assert terms.length(KO_MATH, row, verdict(), SETTINGS) == 0.3   # 30 generated of 100; tool tokens not counted
  assert terms.overlong_soft(KO_MATH, row, verdict(), SETTINGS) == -0.5   # (80 − 90) / 20


@pytest.mark.parametrize('continuation, expected', [
    (0, 0.0), (50, 0.0), (80, 0.0),          # up to L_max − L_cache: no punishment
    (85, -0.25), (95, -0.75),                # the ramp over the last L_cache tokens
    (100, -1.0), (120, -1.0),                # at L_max (an overlong rollout) and beyond: −1
])
def test_overlong_soft_ramp(continuation, expected):
  assert terms.overlong_soft(EN_MATH, rollout(continuation), verdict(), SETTINGS) == pytest.approx(expected)


CASES = [(KO_MATH, '정답은 7입니다.'), (KO_MATH, 'The answer is 7.'), (KO_MATH, '정답은 8입니다.'),
         (KO_MATH, 'The answer is 8.'), (EN_MATH, 'The answer is 7.'), (EN_MATH, 'The answer is 8.'),
         (EN_MATH, '정답은 7입니다.'), (KO_MATH, ''), (UNSCORABLE, 'The answer is 1/2.')]


@pytest.mark.parametrize('penalty', [None, 1.0, 0.5, 0.0])
def test_default_reward_is_the_papers_formula(penalty):
  """r = correctness − penalty · mismatch (eq. 1; penalty 1 unless set), and no reward for an unscorable sample."""
  built = terms.build(budget=100, language_penalty=penalty, drop_overlong=True)
  weight = 1.0 if penalty is None else penalty
  seen = set()
  for example, response in CASES:
    scored = reward.score(example, AssistantTurn(response=response, ended=True))
    paper = None if scored.correct is None else float(scored.correct) - weight * float(scored.language_mismatch)
    assert built(example, rollout(10), scored) == paper, (example.id, response)
    seen.add((scored.correct, scored.language_mismatch))
  assert seen == {(True, False), (True, True), (False, False), (False, True), (None, False)}


def test_drop_overlong_composes_with_overlong_soft():
  built = terms.build('correct:1,overlong_soft:1', budget=100, overlong_cache=20, drop_overlong=True)
  assert built(EN_MATH, rollout(100, overlong=True), verdict()) is None   # dropped: out of baseline and loss
  assert built(EN_MATH, rollout(90), verdict()) == 0.5                    # near the limit: ramped
  kept = terms.build('correct:1,overlong_soft:1', budget=100, overlong_cache=20)
  assert kept(EN_MATH, rollout(100, overlong=True), verdict()) == 0.0     # kept: the full −1


def test_weights_parse_and_alias():
  assert terms.parse(' correct:1, format:0.1,length:-2e-1 ') == (('correct', 1.0), ('format', 0.1), ('length', -0.2))
  assert terms.weights_of(terms.DEFAULT_REWARD, 0.5) == (('correct', 1.0), ('language_mismatch', -0.5))
  assert terms.weights_of('correct:1,format:0.5', 0.25) == (('correct', 1.0), ('format', 0.5),
                                                            ('language_mismatch', -0.25))
  assert terms.weights_of('correct:1,language_mismatch:-2') == (('correct', 1.0), ('language_mismatch', -2.0))
  assert terms.build(budget=160).settings == terms.Settings(budget=160, overlong_cache=32)


@pytest.mark.parametrize('spec, message', [
    ('correct:1,brevity:1', "unknown term 'brevity'"), ('correct', "'correct' needs a finite weight"),
    ('correct:one', "'correct:one' needs a finite weight"), ('correct:nan', 'needs a finite weight'),
    ('correct:1,correct:2', "term 'correct' named twice"), ('', "unknown term ''"),
])
def test_parse_errors_name_the_key_and_the_terms(spec, message):
  with pytest.raises(errors.UserError, match='config.rlvr.reward') as raised:
    terms.parse(spec)
  assert message in str(raised.value) and 'overlong_soft' in str(raised.value)


def test_a_conflict_names_both_keys():
  with pytest.raises(errors.UserError, match='config.rlvr.language_penalty=0.5 and config.rlvr.reward='):
    terms.weights_of('correct:1,language_mismatch:-2', 0.5)
  with pytest.raises(errors.UserError, match='config.rlvr.overlong_cache=0'):
    terms.build(budget=100, overlong_cache=0)


def test_config_checks_reject_a_bad_reward_before_any_work():
  from luckystar import config as config_lib
  from luckystar.stages import rlvr
  config = config_lib.from_file(pathlib.Path(__file__).parents[1] / 'configs' / 'rlvr.py', 'smoke')
  assert rlvr.reward_of(config).weights == (('correct', 1.0), ('language_mismatch', -1.0))
  config.rlvr.reward = 'correct:1,verbosity:-1'
  with pytest.raises(errors.UserError, match="config.rlvr.reward=.*unknown term 'verbosity'"):
    rlvr.check_config(config)
  with pytest.raises(errors.UserError, match="config.rlvr.reward=.*unknown term 'verbosity'"):
    config_lib.check(config)   # what main runs before --dry_run or a stage
