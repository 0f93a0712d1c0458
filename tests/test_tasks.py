"""The task registry (`luckystar.tasks`): a task registered in-process, with its own generator and verifier and no
other list touched, is a bundled suite and an RL source, renders, gets its tools, is scored, and is an eval suite."""

import datetime
import json
import random
import re
import types

import numpy as np
import pytest

from luckystar import tasks
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import conversations, suites
from luckystar.data.examples import Example, dedupe, split_of
from luckystar.engine import curriculum
from luckystar.engine import evals, prompts, rollouts
from luckystar.rewards import reward, terms
from luckystar.tokenizer import AssistantTurn

pytestmark = pytest.mark.fast

NAME = 'toy_dates'   # date arithmetic: what a "Try an idea" task looks like


def dates_suite(seed: int, count: int = 200) -> list[Example]:
  """'What date is N days after D?' in English and Korean, split by the prompt as every suite is."""
  rng = random.Random(seed)
  examples = []
  for i in range(count):
    start = datetime.date(2024, 1, 1) + datetime.timedelta(days=rng.randrange(366))
    days = rng.randrange(1, 60)
    answer = (start + datetime.timedelta(days=days)).isoformat()
    language = ('en', 'ko')[i % 2]
    prompt = (f'What date is {days} days after {start}?' if language == 'en' else
              f'{start}에서 {days}일 후는 언제입니까?')
    response = f'The answer is {answer}.' if language == 'en' else f'정답은 {answer}입니다.'
    examples.append(Example(id=f'{NAME}-{i}', task=NAME, language=language, split=split_of(prompt, seed),
                            prompt=prompt, answer=answer, response=response,
                            thinking=f'Count {days} days forward from {start}.'))
  return dedupe(examples)


def verify_dates(example: Example, response: str, actions, timeout_s: float) -> bool:
  """The last ISO date of the response is the gold."""
  del actions, timeout_s
  dates = re.findall(r'\d{4}-\d{2}-\d{2}', response)
  return bool(dates) and dates[-1] == example.answer


@pytest.fixture
def registered(monkeypatch):
  """The one registry line, for this test only (monkeypatch takes it out again)."""
  monkeypatch.setitem(tasks.TASKS, NAME, tasks.Task(tasks.by_seed(dates_suite), verify_dates))


def _gold_text(example: Example) -> str:
  """The gold reply as a text model writes it: our thinking and response sections."""
  (think, end_think), (respond, end_respond) = (tokenizer_lib.SECTION_TOKENS[s] for s in ('thinking', 'response'))
  return f'{think}{example.thinking}{end_think}{respond}{example.response}{end_respond}'


def test_a_registered_task_is_a_bundled_suite_and_an_rl_source(registered):
  from luckystar.stages import rlvr
  train = suites.load(NAME, 'train')
  assert train and {e.task for e in train} == {NAME} and {e.language for e in train} == {'en', 'ko'}
  heldout = suites.load(NAME, 'heldout')
  assert heldout and not {e.prompt for e in train} & {e.prompt for e in heldout}
  # config.rlvr.sources = 'bundled:toy_dates': RL's prompt pool, and its held-out set by default.
  pool, (report,) = prompts.from_sources(f'bundled:{NAME}', key=curriculum.SOURCES_KEY, split='train', seed=0,
                                         tokenizer=None)
  assert [e.id for e in pool] == [e.id for e in train] and report.kept == len(train)
  assert curriculum.tasks(types.SimpleNamespace(sources=f'bundled:math,bundled:{NAME}')) == ['math', NAME]


def test_a_registered_task_renders_gets_the_calculator_and_is_scored(registered):
  tok = tokenizer_lib.default()
  example = suites.load(NAME, 'train')[0]
  built = terms.build(budget=1, language_penalty=0.5)   # the configs' reward
  for mode in tokenizer_lib.MODES:
    assert rollouts.render_prompt(tok, example, mode)[-1] == tok.special_ids['<|ASSISTANT|>']
    ids, mask = tok.render(conversations.messages(example, mode), mode)   # its SFT conversation
    assert sum(mask) > 0
    turn = tok.parse_assistant(ids[len(ids) - ids[::-1].index(tok.special_ids['<|ASSISTANT|>']):])
    verdict = reward.score(example, turn)
    assert (verdict.correct, verdict.format_ok, built(example, None, verdict)) == (True, True, 1.0), (mode, turn)
  wrong = reward.score(example, AssistantTurn(response='The answer is 1999-01-01.', ended=True))
  assert (wrong.correct, wrong.format_ok) == (False, True)
  assert reward.score(example, AssistantTurn(thinking='no answer', ended=True)).format_ok is False
  # No database: the calculator runs, SQL is no tool of this row.
  assert tasks.database(example) is None
  tool_fn = rollouts.task_tools([example])
  call = lambda name, key, text: json.dumps({'tool_name': name, 'parameters': {key: text}})
  assert tool_fn(0, call('calculator', 'expression', '6*7')) == ['42']
  assert tool_fn(0, call('execute_sql', 'query', 'SELECT 1')) is None


def test_a_registered_task_is_an_eval_suite_and_in_the_task_eval(registered):
  from luckystar.stages import eval as eval_stage
  tok = tokenizer_lib.default()
  settings = eval_stage.Settings.from_config({'suites': (NAME,), 'modes': ('reasoning',), 'per_suite_language': 3,
                                              'pass_k_samples': 0})
  heldout = eval_stage.suite_examples(NAME, settings, tok)
  assert len(heldout) == 6 and {e.split for e in heldout} == {'heldout'}
  by_prompt = {e.prompt: e for e in heldout}
  oracle = evals.text_respond(lambda messages, mode: _gold_text(by_prompt[messages[-1]['content']]), tok)
  results = eval_stage.evaluate(oracle, tok, settings, progress=False)
  assert results['suites'][NAME]['reasoning']['correctness'] == 1.0 and eval_stage.headline(NAME) == 'correctness'
  assert not eval_stage.has_pass_k(NAME)
  # engine.evals, the other stages' task eval: a default task, and in the hybrid-format figure.
  assert NAME in evals.Settings().tasks
  results = []
  for example in heldout:
    turn, actions = evals.parse_text(_gold_text(example))
    rollout = types.SimpleNamespace(final_turn=turn, thinking=turn.thinking, actions=actions, tool_results=(),
                                    loss_mask=np.ones(8, np.int32))   # the fields of sampling.Rollout it reads
    results.append((example, rollout, reward.score(example, turn, actions)))
  figures = evals.summarize(results, 'reasoning')
  assert figures[f'eval/reasoning/correctness/{NAME}'] == 1.0 and figures['eval/reasoning/hybrid_format'] == 1.0


def test_an_unregistered_task_is_named_as_unknown():
  from luckystar import errors
  from luckystar.stages import eval as eval_stage
  assert NAME not in tasks.TASKS
  with pytest.raises(ValueError, match=f"unknown task '{NAME}'; registered: .*'math'"):
    suites.load(NAME)
  with pytest.raises(errors.UserError, match=f'unknown suite {NAME!r}'):
    eval_stage.Settings.from_config({'suites': (NAME,)})
  example = Example(id='x', task=NAME, language='en', split='train', prompt='?', answer='1')
  with pytest.raises(ValueError, match='unknown task'):
    reward.score(example, AssistantTurn(response='1', ended=True))
