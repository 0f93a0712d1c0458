"""The verdict on one finished rollout: correct, well formed, in the prompt's language (paper eq. 1's inputs).

Correctness comes from the task's one verifier (`luckystar.tasks`), reading only the response section
(or the action, for function calling), after a format check: a missing response
or an action that is not valid JSON is incorrect. A sample the verifiers cannot
score has `correct=None`: it gets no reward, and callers count it (`train/unscorable`)
and leave it out, never score it 0. Only a gold can make a sample unscorable
(gold SQL fails, a math gold does not parse): a response that times out or
crashes a verifier, or hedges between options, scores as a wrong answer, so
the policy gains nothing by it. The reward itself, r = correctness − penalty · mismatch by default, is
built from the verdict in one place: `rewards.terms`.
"""

import dataclasses
import functools
from typing import Sequence

from luckystar import tasks
from luckystar.data.examples import Example
from luckystar.rewards import language
from luckystar.tokenizer import AssistantTurn
from luckystar.tools.calls import parse_calls


@dataclasses.dataclass(frozen=True)
class Verdict:
  correct: bool | None        # None: unscorable
  format_ok: bool
  language_mismatch: bool
  judged: bool = False        # the judge, not a rule, decided correctness
  language_judged: bool = False   # the judge, not a rule, decided language_mismatch (a mixed response)


@functools.lru_cache(maxsize=100_000)
def prompt_language(prompt: str) -> str | None:
  """Classified once per prompt, up front; None (ambiguous) means no language penalty."""
  return language.classify_prompt(prompt)


def format_ok(task: str, turn: AssistantTurn, actions: Sequence[str]) -> bool:
  """Every action parses as a tool call; the answer is there: the final answer section, non-empty, or for a task
  that answers with its action (function calling) an action."""
  if any(parse_calls(a) is None for a in actions):
    return False
  if tasks.get(task).answers_with_action:
    return bool(actions)
  return bool(turn.response and turn.response.strip())


def is_correct(example: Example, turn: AssistantTurn, actions: Sequence[str] = (), *, timeout_s: float = 2.0
               ) -> bool | None:
  """The task's rule verifier (`luckystar.tasks`; no format check here, see `score`)."""
  return tasks.get(example.task).verify(example, turn.response or '', actions, timeout_s)


def score(example: Example, turn: AssistantTurn, actions: Sequence[str] = (), *, tool_results: Sequence[str] = (),
          judge=None, timeout_s: float = 2.0) -> Verdict:
  """The verdict on one finished rollout: `turn` is its final assistant turn, `actions` every action text
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
    correct = is_correct(example, turn, actions, timeout_s=timeout_s)
    if correct is None and judge is not None:
      correct = judge(example.prompt, example.answer, turn.response or '', criterion='equivalent')
      judged = correct is not None
  return Verdict(correct=correct, format_ok=well_formed, language_mismatch=mismatch, judged=judged,
                 language_judged=language_judged)
