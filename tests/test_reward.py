"""The verdict on a rollout (correctness with its format check, language mismatch, unscorable samples) and the
configs' reward over it, correctness − 0.5·mismatch (`rewards.terms`)."""

import dataclasses
import json

import hypothesis
import hypothesis.strategies as st
import pytest

from luckystar.data import nl2sql, suites
from luckystar.data.examples import Example
from luckystar.rewards import reward, terms
from luckystar.tokenizer import AssistantTurn

pytestmark = pytest.mark.fast

PAPER_REWARD = terms.build(budget=1, language_penalty=0.5)   # the configs' reward; it reads no rollout field


def rl_reward(example, verdict, built=PAPER_REWARD):
  return built(example, None, verdict)

KO_MATH = Example(id='m-ko', task='math', language='ko', split='heldout', prompt='철수는 사과를 3개 가지고 있고 4개를 더 샀습니다. 모두 몇 개입니까?',
                  answer='7')
EN_MATH = Example(id='m-en', task='math', language='en', split='heldout',
                  prompt='Alice has 3 apples and buys 4 more. How many apples does she have now?', answer='7')


@pytest.mark.parametrize('response,correct,mismatch,expected', [
    ('정답은 7입니다.', True, False, 1.0),
    ('The answer is 7.', True, True, 0.5),
    ('정답은 8입니다.', False, False, 0.0),
    ('The answer is 8.', False, True, -0.5),
])
def test_four_correctness_by_language_combinations(response, correct, mismatch, expected):
  verdict = reward.score(KO_MATH, AssistantTurn(thinking='3 + 4 = 7', response=response, ended=True))
  assert (verdict.correct, verdict.language_mismatch, rl_reward(KO_MATH, verdict)) == (correct, mismatch, expected)


def test_penalty_is_a_parameter_and_english_prompts_are_not_penalised_for_english():
  turn = AssistantTurn(response='The answer is 7.', ended=True)
  assert rl_reward(KO_MATH, reward.score(KO_MATH, turn), terms.build(budget=1, language_penalty=0.0)) == 1.0
  assert rl_reward(EN_MATH, reward.score(EN_MATH, turn)) == 1.0


def test_format_check_is_part_of_correctness():
  no_response = AssistantTurn(thinking='the answer is 7', ended=True)
  verdict = reward.score(KO_MATH, no_response)
  assert not verdict.format_ok and verdict.correct is False and rl_reward(KO_MATH, verdict) == 0.0
  bad_action = AssistantTurn(response='정답은 7입니다.', ended=True)
  assert reward.score(KO_MATH, bad_action, actions=['{not json']).correct is False


def test_a_prediction_that_hangs_the_verifier_is_wrong_not_unscorable():
  verdict = reward.score(EN_MATH, AssistantTurn(response='The answer is 9**9**9**9.', ended=True), timeout_s=1.0)
  assert verdict.correct is False and rl_reward(EN_MATH, verdict) == 0.0


BOMB_TIMEOUT_S = 0.15   # every bomb outlives it; the wrong answer before it had the gold checked
VERDICT_TIMEOUT_S = 10.0   # a plain answer is scored on a busy machine too
# Every gold form the math verifier accepts; a, b in 1..99, c = a + b.
GOLD_FORMS = ('{a}', '-{a}', '{a}.{b}', '{a},{b:03d}', '\\frac{{{a}}}{{{b}}}', '\\dfrac{{{a}}}{{{b}}}', '\\sqrt{{{a}}}',
              '{a}\\pi', '[{a}, {c})', '(-{a}, {b}]', 'x={a}', '{a}\\%', '${a}/{b}$', '$\\frac{{{a}}}{{{b}}}$',
              '\\boxed{{{a}}}', '\\boxed{{\\sqrt{{{a}}}}}')
VERIFIER_BOMBS = {
    'latex power tower': '$9^{9^{9^{9}}}$',
    'power tower': '9**9**9**9',
    'factorial': '100000!',
    'latex factorial': '$100000!$',
    'huge sum': '$\\sum_{i=1}^{10^{100}} i$',
    'nested frac': '$' + '\\frac{' * 700 + '1' + '}{2}' * 700 + '$',
    'nested braces': '$' + '{' * 3_000 + '1' + '}' * 3_000 + '$',
    'nested parens': '(' * 4_000 + '1' + ')' * 4_000,
    'unbalanced boxed': '\\boxed{' * 1_400,
    'over-long answer': '정답은 7입니다. ' * 1_500,
    'over-long junk': 'a' * 20_000,
}
WRONG_ANSWER = {'ko': '정답은 987654321입니다.', 'en': 'The answer is 987654321.'}


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(form=st.sampled_from(GOLD_FORMS), a=st.integers(1, 99), b=st.integers(1, 99),
                  bomb=st.sampled_from(sorted(VERIFIER_BOMBS)), example=st.sampled_from([KO_MATH, EN_MATH]))
def test_a_verifier_failure_never_beats_a_wrong_answer(form, a, b, bomb, example):
  example = dataclasses.replace(example, answer=form.format(a=a, b=b, c=a + b))
  wrong = reward.score(example, AssistantTurn(response=WRONG_ANSWER[example.language], ended=True),
                       timeout_s=VERDICT_TIMEOUT_S)
  failed = reward.score(example, AssistantTurn(response=VERIFIER_BOMBS[bomb], ended=True), timeout_s=BOMB_TIMEOUT_S)
  assert wrong.correct is False and rl_reward(example, wrong) == 0.0   # every generated gold is one it accepts
  assert failed.correct is False   # not None: a bomb is no way out of the penalty
  assert rl_reward(example, failed) <= rl_reward(example, wrong)


@pytest.mark.parametrize('response, correct', [
    ('정답은 8이 아니라 7입니다.', True),
    ('정답은 7이 아니라 8입니다.', False),
    ('8은 틀렸고 정답은 7입니다.', True),
    ('7, no wait, 8', False),
])
def test_a_corrected_answer_is_scored_as_corrected(response, correct):
  verdict = reward.score(KO_MATH, AssistantTurn(response=response, ended=True), timeout_s=VERDICT_TIMEOUT_S)
  assert verdict.correct is correct


def test_a_hedged_choice_is_wrong_not_unscorable():
  mc = suites.load('korean_mc', 'heldout')[0]
  other = 'A' if mc.answer != 'A' else 'B'
  for response in (f'정답은 {mc.answer} 또는 {other}입니다.', f'정답은 {other}입니다. 아니면 {mc.answer}일 수도 있습니다.',
                   f'정답은 {mc.answer}입니다. {other}도 정답일 수 있습니다.'):
    verdict = reward.score(mc, AssistantTurn(response=response, ended=True))
    assert (verdict.correct, rl_reward(mc, verdict)) == (False, 0.0), response


def test_unscorable_gold_gives_no_reward_and_the_judge_is_asked():
  example = Example(id='m', task='math', language='en', split='heldout', prompt='What is one half?',
                    answer='\\frac{1}{')  # unparsable gold
  turn = AssistantTurn(response='The answer is 1/2.', ended=True)
  verdict = reward.score(example, turn)
  assert verdict.correct is None and rl_reward(example, verdict) is None
  # The library's own judge (a stub model behind it): it refuses a criterion it has no template for.
  from luckystar.rewards import judge as judge_lib
  prompts = []
  judge = judge_lib.ModelJudge(lambda prompt: prompts.append(prompt) or 'YES')
  verdict = reward.score(example, turn, judge=judge)
  assert verdict.correct is True and verdict.judged and len(prompts) == 1
  assert judge_lib.CRITERIA['equivalent'] in prompts[0] and 'The answer is 1/2.' in prompts[0]


def test_the_judge_decides_what_no_rule_can_correctness_and_language():
  # '98 values' is prose (a word of 3+ letters), not math: no prediction against it can be verified.
  example = Example(id='champ', task='math', language='ko', split='heldout', prompt='서로 다른 값은 모두 몇 개입니까?',
                    answer='98 values')
  mixed = AssistantTurn(response='98 values, 즉 98개입니다 because each value counts', ended=True)
  asked = []

  def judge(equivalent, korean):
    def call(question, reference, candidate, *, criterion):
      asked.append((criterion, question, reference, candidate))
      return {'equivalent': equivalent, 'language': korean}[criterion]
    return call

  assert reward.score(example, mixed) == reward.Verdict(correct=None, format_ok=True, language_mismatch=False)
  verdict = reward.score(example, mixed, judge=judge(True, False))
  assert (verdict.correct, verdict.judged, verdict.language_mismatch, verdict.language_judged,
          rl_reward(example, verdict)) == (True, True, True, True, 0.5)
  assert sorted(asked) == [('equivalent', example.prompt, '98 values', mixed.response),
                           ('language', '', 'Korean', mixed.response)]
  # A failed verdict (None): unscorable and no penalty, as without a judge; the judge counts its failures.
  verdict = reward.score(example, mixed, judge=judge(None, None))
  assert (verdict.correct, rl_reward(example, verdict), verdict.judged, verdict.language_mismatch,
          verdict.language_judged) == (None, None, False, False, False)
  # Rules decide first: a Korean response is not sent to the judge for its language.
  asked.clear()
  verdict = reward.score(example, AssistantTurn(response='정답은 98개입니다.', ended=True), judge=judge(False, False))
  assert [criterion for criterion, *_ in asked] == ['equivalent']
  assert (verdict.correct, verdict.language_mismatch, verdict.language_judged, rl_reward(example, verdict)) == (
      False, False, False, 0.0)


@pytest.fixture(scope='module')
def nl2sql_example(tmp_path_factory):
  db_dir = tmp_path_factory.mktemp('nl2sql')
  examples = suites.load('nl2sql', 'heldout', db_dir=db_dir)
  example = next(e for e in examples if e.language == 'ko' and e.difficulty == 2)
  return example, nl2sql.build_databases(db_dir)[example.meta['db_id']]


def test_nl2sql_scores_the_last_executed_query(nl2sql_example):
  example, path = nl2sql_example
  assert example.meta['db_path'] == str(path)   # the database its verifier and its execute_sql calls use
  call = lambda query: json.dumps({'tool_name': 'execute_sql', 'parameters': {'query': query}})
  turn = AssistantTurn(thinking='I ran the query.', response='결과는 위와 같습니다.', ended=True)
  right = reward.score(example, turn, [call('SELECT 1'), call(example.answer)])
  assert right.correct is True and rl_reward(example, right) == 1.0
  wrong = reward.score(example, turn, [call(example.answer), call('SELECT 1')])
  assert wrong.correct is False
  no_query = reward.score(example, turn, [])
  assert no_query.correct is False
  with pytest.raises(ValueError, match='needs meta\\["db_path"\\]'):
    reward.score(dataclasses.replace(example, meta={}), turn, [call(example.answer)])


def test_function_calling_and_multiple_choice(tmp_path):
  fc = next(e for e in suites.load('function_calling', 'heldout') if e.meta['category'] == 'simple')
  (truth,) = json.loads(fc.answer)
  name, args = next(iter(truth.items()))
  action = json.dumps({'tool_name': name, 'parameters': {k: v[0] for k, v in args.items() if v[0] != ''}},
                      ensure_ascii=False)
  assert reward.score(fc, AssistantTurn(action=action, ended=True), [action]).correct is True
  assert reward.score(fc, AssistantTurn(ended=True), []).correct is False
  mc = suites.load('korean_mc', 'heldout')[0]
  assert rl_reward(mc, reward.score(mc, AssistantTurn(response=f'정답: {mc.answer}', ended=True))) == 1.0
