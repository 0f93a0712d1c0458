"""The RLVR reward: r = correctness − penalty · [response language ≠ prompt language] (paper eq. 1).

Correctness comes from the task's one verifier, reading only the response section
(or the action, for function calling), after a format check: a missing response
or an action that is not valid JSON is incorrect. A sample the verifiers cannot
score has `correct=None` and no reward: callers count it (`train/unscorable`)
and leave it out, never score it 0. Only a gold can make a sample unscorable
(gold SQL fails, a math gold does not parse): a response that times out or
crashes a verifier, or hedges between options, scores as a wrong answer, so
the policy gains nothing by it.
"""

import dataclasses
import functools
import json
from typing import Sequence

from luckystar import tools
from luckystar.data.examples import Example
from luckystar.rewards import chat, choice, function_call, language
from luckystar.rewards import math as math_reward
from luckystar.rewards import sql as sql_reward
from luckystar.tokenizer import AssistantTurn
from luckystar.tools.calls import parse_calls

DEFAULT_LANGUAGE_PENALTY = 0.5


@dataclasses.dataclass(frozen=True)
class Verdict:
  correct: bool | None        # None: unscorable
  format_ok: bool
  language_mismatch: bool
  reward: float | None        # None exactly when correct is None
  judged: bool = False        # the judge, not a rule, decided correctness
  language_judged: bool = False   # the judge, not a rule, decided language_mismatch (a mixed response)


@functools.lru_cache(maxsize=100_000)
def prompt_language(prompt: str) -> str | None:
  """Classified once per prompt, up front; None (ambiguous) means no language penalty."""
  return language.classify_prompt(prompt)


def format_ok(task: str, turn: AssistantTurn, actions: Sequence[str]) -> bool:
  """Every action parses as a tool call; the final answer section is present and non-empty."""
  if any(parse_calls(a) is None for a in actions):
    return False
  if task == 'function_calling':
    return bool(actions)
  return bool(turn.response and turn.response.strip())


def _last_sql(actions: Sequence[str]) -> str | None:
  """The query of the last `execute_sql` call: what the agent's answer rests on."""
  for action in reversed(actions):
    for call in parse_calls(action) or ():
      if call['tool_name'] == tools.SQL_TOOL and isinstance(call['parameters'].get('query'), str):
        return call['parameters']['query']
  return None


def is_correct(example: Example, turn: AssistantTurn, actions: Sequence[str] = (), *, db_path: str | None = None,
               timeout_s: float = 2.0) -> bool | None:
  """The task's rule verifier (no format check here; see `score`)."""
  response = turn.response or ''
  if example.task == 'math':
    return math_reward.is_correct(response, example.answer, timeout_s=timeout_s)
  if example.task == 'korean_mc':
    return choice.is_correct(response, example.answer)
  if example.task == 'chat':
    return chat.is_correct(response, example.answer, prompt=example.prompt)
  if example.task == 'function_calling':
    calls = [c for a in actions for c in parse_calls(a) or ()]
    return function_call.is_correct(calls, json.loads(example.answer), example.meta['functions'])
  if example.task == 'nl2sql':
    query = _last_sql(actions)
    path = db_path or example.meta.get('db_path')
    if path is None:
      raise ValueError(f'example {example.id}: NL2SQL scoring needs db_path')
    if query is None:
      return False
    return sql_reward.is_correct(path, query, example.answer, timeout_s=timeout_s)
  raise ValueError(f'no verifier for task {example.task!r}')


def score(example: Example, turn: AssistantTurn, actions: Sequence[str] = (), *, tool_results: Sequence[str] = (),
          language_penalty: float = DEFAULT_LANGUAGE_PENALTY, db_path: str | None = None, judge=None,
          timeout_s: float = 2.0) -> Verdict:
  """Reward of one finished rollout: `turn` is its final assistant turn, `actions` every action text
  it emitted, in order, `tool_results` the results it read (`Rollout.tool_results`: values it quotes
  from them are data to the language check). `judge` (see rewards.judge) is asked only where the rules
  cannot decide: correctness where the verifier returns None ('equivalent'), the response's language
  where it is mixed ('language'). A failed verdict leaves correctness None (unscorable) and gives no
  language penalty; the judge counts it."""
  well_formed = format_ok(example.task, turn, actions)
  mismatch, language_judged = language.mismatch_verdict(prompt_language(example.prompt), turn.response,
                                                        data=tool_results, judge=judge)
  correct, judged = False, False
  if well_formed:
    correct = is_correct(example, turn, actions, db_path=db_path, timeout_s=timeout_s)
    if correct is None and judge is not None:
      correct = judge(example.prompt, example.answer, turn.response or '', criterion='equivalent')
      judged = correct is not None
  reward = None if correct is None else float(correct) - language_penalty * float(mismatch)
  return Verdict(correct=correct, format_ok=well_formed, language_mismatch=mismatch, reward=reward, judged=judged,
                 language_judged=language_judged)
