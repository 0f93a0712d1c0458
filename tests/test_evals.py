"""The evaluation core: every eval/* metric, computed from real greedy rollouts."""

import math
import pytest

import jax
import numpy as np

from luckystar import model, tokenizer as tokenizer_lib
from luckystar.engine import evals as core


def test_evaluate_reports_every_metric_for_a_random_model():
  tok = tokenizer_lib.default()
  config = model.get('tiny', hidden_size=64, intermediate_size=128, num_layers=2,
                     layer_types=(model.SLIDING, model.FULL), sliding_window=16)
  params = model.init(config, jax.random.key(0))
  settings = core.Settings(tasks=('math', 'nl2sql', 'korean_mc'), per_task_language=2, max_new_tokens=12,
                           batch_size=8)
  metrics = core.evaluate(config, params, tok, settings)
  for mode in ('reasoning', 'concise'):
    for name in ('correctness', 'language_mismatch', 'response_length', 'thinking_rate', 'format_ok',
                 'unscorable', 'correctness/math', 'correctness/nl2sql/ko', 'correctness/en', 'response_length/nl2sql'):
      assert f'eval/{mode}/{name}' in metrics, (mode, name)
  assert metrics['eval/reasoning/hybrid_format'] == 0.0 and 'eval/reasoning/hybrid_format/ko' in metrics
  assert metrics['eval/correctness'] == metrics['eval/reasoning/correctness']
  assert 'eval/correctness/korean_mc' in metrics and 'eval/correctness/math/ko' not in metrics
  # A random model cannot follow the format: nothing is correct, lengths are the budget.
  assert metrics['eval/reasoning/correctness'] == 0.0
  assert 0 < metrics['eval/reasoning/response_length'] <= 12
  assert math.isnan(metrics['eval/reasoning/language_mismatch']) or 0 <= metrics['eval/reasoning/language_mismatch'] <= 1


def test_sampled_eval_draws_several_replies_per_prompt():
  """temperature > 0: `samples` rollouts per prompt (pass@1 is their mean), reproducible from the seed."""
  tok = tokenizer_lib.default()
  config = model.get('tiny', hidden_size=32, intermediate_size=64, num_layers=2,
                     layer_types=(model.SLIDING, model.FULL), sliding_window=16)
  params = model.init(config, jax.random.key(0))
  examples = core.select(core.Settings(tasks=('chat',), per_task_language=2))
  settings = core.Settings(max_new_tokens=8, batch_size=8, temperature=1.0, samples=3)
  results = core.run_examples(config, params, tok, examples, 'concise', settings)
  assert [e.id for e, _, _ in results] == [e.id for e in examples for _ in range(3)]
  replies = [r.token_ids.tolist() for _, r, _ in results]
  assert len({tuple(r) for r in replies}) > 1                      # sampled, not greedy
  again = core.run_examples(config, params, tok, examples, 'concise', settings)
  assert [r.token_ids.tolist() for _, r, _ in again] == replies


@pytest.mark.fast
def test_the_eval_set_is_fixed_and_balanced():
  settings = core.Settings(tasks=('math', 'chat'), per_task_language=5)
  chosen = core.select(settings)
  assert chosen == core.select(settings)
  assert len(chosen) == 20 and {e.split for e in chosen} == {'heldout'}


@pytest.mark.fast
def test_hybrid_format_wants_english_thinking_and_the_prompts_language():
  from luckystar.rewards import reward

  def ok(thinking, response, mismatch=False):
    verdict = reward.Verdict(correct=True, format_ok=True, language_mismatch=mismatch, judged=False)
    return core.hybrid_format_ok(thinking, response, verdict)

  assert ok('Add 3 and 4 to get 7.', '정답은 7입니다.')
  assert ok('Add 3 and 4 to get 7.', '7')                         # a bare number is readable in any language
  assert not ok('3과 4를 더하면 7입니다.', '정답은 7입니다.')       # Korean thinking
  assert not ok(None, '정답은 7입니다.')                            # no thinking section
  assert not ok('Add 3 and 4 to get 7.', None)                     # no response
  assert not ok('Add 3 and 4 to get 7.', 'The answer is 7.', mismatch=True)
  # English reasoning that quotes the Korean sentence it is about is English thinking; Korean prose is not.
  quoted = 'The noun "가방" ends in "방", which has final consonant, so the object particle is "을": "우리는 어제 가방을 샀다.". That is option C.'
  assert ok(quoted, '우리는 어제 가방을 샀다. 정답: C')
  assert not ok('명사 "가방"은 받침이 있으므로 "을"을 씁니다.', '정답: C')


@pytest.mark.fast
def test_korean_mismatch_rate_reads_responses_as_the_verdict_does():
  """A Korean prompt answered only with values copied from the tool has no language: it leaves the
  denominator, as it leaves the penalty."""
  from luckystar.data.examples import Example
  from luckystar.rewards import reward
  from luckystar.tokenizer import AssistantTurn
  example = Example(id='q', task='chat', language='ko', split='heldout', prompt='가장 많이 팔린 제품 두 개는 무엇인가요?',
                    answer='Wireless Mouse')
  result = 'product\nWireless Mouse\nOffice Chair\n(2 rows)'

  def reply(response, tool_results):
    reply = core.TextReply(final_turn=AssistantTurn(response=response, ended=True), actions=[],
                          loss_mask=np.ones(3), tool_results=tool_results)
    return example, reply, reward.score(example, reply.final_turn, tool_results=tool_results)

  copied = reply('Wireless Mouse, Office Chair', (result,))
  english = reply('The best sellers are Wireless Mouse and Office Chair.', (result,))
  assert not copied[2].language_mismatch and english[2].language_mismatch
  assert core.korean_mismatch_rate([copied, english]) == 1.0       # 1 of 1 parsable, not 1 of 2
  assert core.korean_mismatch_rate([reply('Wireless Mouse, Office Chair', ())]) == 1.0   # not from a tool: English


@pytest.mark.fast
def test_every_gold_korean_mc_trace_meets_the_hybrid_format():
  from luckystar.data import conversations, suites
  from luckystar.rewards import reward
  from luckystar.tokenizer import AssistantTurn
  for example in suites.load('korean_mc', 'heldout')[:40]:
    turn = conversations.messages(example, 'reasoning')[-1]
    verdict = reward.score(example, AssistantTurn(thinking=turn['thinking'], response=turn['response']), [])
    assert verdict.correct and core.hybrid_format_ok(turn['thinking'], turn['response'], verdict), turn


# ---- the LLM judge, passed through (a stub that records its questions) ------------------------------

def _judge_stub(asked, equivalent=True, in_language=False):
  def judge(question, reference, candidate, *, criterion):
    asked.append(criterion)
    return {'equivalent': equivalent, 'language': in_language}[criterion]
  return judge


def _unverifiable_example():
  from luckystar.data.examples import Example
  # '98 values' is prose, not math: rules return None for every prediction against it.
  return Example(id='champ', task='math', language='ko', split='heldout', prompt='서로 다른 값은 모두 몇 개입니까?',
                 answer='98 values')


MIXED = '98 values, 즉 98개입니다 because each value counts'   # neither Korean nor English by script


@pytest.mark.fast
def test_evaluate_scores_with_the_judge(monkeypatch):
  import types
  from luckystar.tokenizer import AssistantTurn
  example = _unverifiable_example()

  def model_respond(model_config, params, tokenizer, settings):
    return lambda examples, mode, temperature, seed: [types.SimpleNamespace(
        final_turn=AssistantTurn(response=MIXED, ended=True), actions=[], loss_mask=np.ones(5), overlong=False,
        tool_results=(), thinking=None) for _ in examples]

  monkeypatch.setattr(core, 'model_respond', model_respond)
  settings = core.Settings(modes=('concise',))
  without = core.evaluate(None, None, None, settings, examples=[example])
  assert without['eval/concise/unscorable'] == 1.0 and math.isnan(without['eval/concise/correctness'])
  assert math.isnan(without['eval/concise/language_mismatch'])   # mixed: rules cannot say, left out
  asked = []
  judged = core.evaluate(None, None, None, settings, examples=[example], judge=_judge_stub(asked))
  assert sorted(asked) == ['equivalent', 'language']
  assert judged['eval/concise/correctness'] == 1.0 and judged['eval/concise/unscorable'] == 0.0
  assert judged['eval/concise/language_mismatch'] == 1.0          # the judge said: not Korean
  ((_, _, verdict),) = core.run_examples(None, None, None, [example], 'concise', settings,
                                         judge=_judge_stub(asked, in_language=True))
  assert verdict.judged and verdict.language_judged and not verdict.language_mismatch


@pytest.mark.fast
def test_generate_and_score_passes_the_judge(monkeypatch):
  import types
  from luckystar.engine import rollouts
  from luckystar.rewards import terms
  from luckystar.tokenizer import AssistantTurn
  example = _unverifiable_example()

  def rollout(model_config, params, tokenizer, prompts, **options):
    return [types.SimpleNamespace(final_turn=AssistantTurn(response=MIXED, ended=True), actions=[], tool_results=(),
                                  overlong=False) for _ in prompts]

  monkeypatch.setattr(rollouts.sampling, 'rollout', rollout)
  settings = rollouts.sampling.RolloutSettings(max_new_tokens=8, max_tool_turns=1, max_tool_result_tokens=8)
  options = dict(samples_per_prompt=2, settings=settings,
                 reward=terms.build(budget=8, language_penalty=0.5, drop_overlong=True))
  (group,) = rollouts.generate_and_score(None, None, None, [example], [[1, 2]], jax.random.key(0), **options)
  assert [s.reward for s in group] == [None, None] and not any(s.survived for s in group)
  asked = []
  (group,) = rollouts.generate_and_score(None, None, None, [example], [[1, 2]], jax.random.key(0),
                                         judge=_judge_stub(asked), **options)
  assert sorted(asked) == ['equivalent', 'equivalent', 'language', 'language']
  assert [s.reward for s in group] == [0.5, 0.5] and all(s.verdict.judged for s in group)
  # sample_groups hands its keyword options, judge included, to generate_and_score.
  asked.clear()
  ((_, _, group),) = rollouts.sample_groups(None, None, tokenizer_lib.default(), [example], jax.random.key(0),
                                            batch_rows=2, judge=_judge_stub(asked), **options)
  assert len(asked) == 4 and all(s.verdict.judged for s in group)
