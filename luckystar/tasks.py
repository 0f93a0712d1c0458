"""The verifiable tasks, one record each: where a task's prompts come from, how a reply is verified, what it needs.

Every task list reads TASKS: `data.suites.load` (so `bundled:<name>` in `config.rlvr.sources` and the RL held-out
set), `rewards.reward.score` (format check and verifier), `engine.rollouts.task_tools` (the SQL database),
`engine.evals` (default tasks, the hybrid-format figure) and the eval stage's suites. A new task is its module
(a suite generator and a verifier) plus one line here:

    'dates': Task(by_seed(dates.suite), dates.verify),

This module sits in the tasks layer beside `data/` and `rewards/` rather than in either: an entry names a
generator from one and a verifier from the other, and both `data.suites` and `rewards.reward` read it, so it
imports their leaf modules and neither package imports the other through it.
"""

import dataclasses
import json
import pathlib
from typing import Callable, Iterable, Sequence

from luckystar import tools
from luckystar.data import chat, function_calling, korean_mc, math_problems, nl2sql
from luckystar.data.examples import Example
from luckystar.rewards import chat as chat_reward
from luckystar.rewards import choice, function_call
from luckystar.rewards import math as math_reward
from luckystar.rewards import sql as sql_reward
from luckystar.tools.calls import parse_calls

# suite(seed, *, db_dir, count_tokens) → the examples of every split. db_dir: where a task builds its files (None:
# its default); count_tokens: the model tokenizer's text → token count, for length curation (None: no curation).
SuiteFn = Callable[..., Iterable[Example]]
# verify(example, response, actions, timeout_s) → correct? (None: unscorable, only a bad gold may say so). response:
# the final answer section ('' if none); actions: every action text of the rollout, in order. The format check
# (`rewards.reward.format_ok`) has run.
VerifyFn = Callable[[Example, str, Sequence[str], float], bool | None]


@dataclasses.dataclass(frozen=True)
class Task:
  """One verifiable task (module docstring)."""
  suite: SuiteFn
  verify: VerifyFn
  answers_with_action: bool = False   # the tool call is the answer: the format check wants an action, no response
  database: Callable[[Example], str | None] | None = None   # the SQLite file its execute_sql calls run against
  headline: str | None = 'correctness'   # the eval stage's figure for its held-out suite; None: no such suite
  pass_k: bool = False                  # the eval stage also samples pass@k of it in reasoning mode
  hybrid_format: bool = True            # in eval/reasoning/hybrid_format: English thinking, then a response


def by_seed(generate: Callable[[int], Iterable[Example]]) -> SuiteFn:
  """The suite of a generator that needs only the seed (it builds no files and is not curated by length)."""
  return lambda seed, **_: generate(seed)


# ---- what the built-in tasks need beyond their generator and rule verifier -------------------------------------

def _nl2sql_suite(seed: int, *, db_dir: str | pathlib.Path | None = None,
                  count_tokens: Callable[[str], int] | None = None, **_) -> list[Example]:
  """Questions over databases built on first use under `db_dir` (`nl2sql.default_dir()`), curated by
  `nl2sql.curate` when `count_tokens` is given."""
  examples = nl2sql.suite(nl2sql.build_databases(db_dir, seed), seed=seed)
  return nl2sql.curate(examples, count_tokens)[0] if count_tokens else examples


def _db_path(example: Example) -> str | None:
  return example.meta.get('db_path')


def _last_sql(actions: Sequence[str]) -> str | None:
  """The query of the last `execute_sql` call: what the agent's answer rests on."""
  for action in reversed(actions):
    for call in parse_calls(action) or ():
      if call['tool_name'] == tools.SQL_TOOL and isinstance(call['parameters'].get('query'), str):
        return call['parameters']['query']
  return None


def _verify_nl2sql(example: Example, response: str, actions: Sequence[str], timeout_s: float) -> bool:
  """The last query's result against the gold's, on the example's database."""
  del response
  path = _db_path(example)
  if path is None:
    raise ValueError(f'example {example.id}: NL2SQL scoring needs meta["db_path"], its database')
  query = _last_sql(actions)
  return False if query is None else sql_reward.is_correct(path, query, example.answer, timeout_s=timeout_s)


def _verify_function_calling(example: Example, response: str, actions: Sequence[str], timeout_s: float) -> bool:
  """Every call of every action against the gold calls (`rewards.function_call`)."""
  del response, timeout_s
  calls = [c for a in actions for c in parse_calls(a) or ()]
  return function_call.is_correct(calls, json.loads(example.answer), example.meta['functions'])


def _verify_math(example: Example, response: str, actions: Sequence[str], timeout_s: float) -> bool | None:
  del actions
  return math_reward.is_correct(response, example.answer, timeout_s=timeout_s)


def _verify_korean_mc(example: Example, response: str, actions: Sequence[str], timeout_s: float) -> bool:
  del actions, timeout_s
  return choice.is_correct(response, example.answer)


def _verify_chat(example: Example, response: str, actions: Sequence[str], timeout_s: float) -> bool | None:
  del actions, timeout_s
  return chat_reward.is_correct(response, example.answer, prompt=example.prompt)


# ---- the registry: its order is the order of every default task list ------------------------------------------

TASKS: dict[str, Task] = {
    'math': Task(by_seed(math_problems.suite), _verify_math, headline='pass@1', pass_k=True),
    'nl2sql': Task(_nl2sql_suite, _verify_nl2sql, database=_db_path, headline='execution accuracy',
                   hybrid_format=False),
    'function_calling': Task(by_seed(function_calling.suite), _verify_function_calling, answers_with_action=True,
                             headline=None, hybrid_format=False),   # its eval suite is BFCL's real questions
    'korean_mc': Task(by_seed(korean_mc.suite), _verify_korean_mc, headline='accuracy'),
    'chat': Task(by_seed(chat.suite), _verify_chat),
}


def get(name: str) -> Task:
  """The task `name`, or a ValueError naming the registered ones."""
  task = TASKS.get(name)
  if task is None:
    raise ValueError(f'unknown task {name!r}; registered: {tuple(TASKS)} (luckystar.tasks.TASKS)')
  return task


def database(example: Example) -> str | None:
  """The SQLite file `example`'s execute_sql calls run against, or None (no SQL: the calculator alone)."""
  task = get(example.task)
  return task.database(example) if task.database else None


def eval_suites() -> tuple[str, ...]:
  """The tasks whose held-out split is an eval-stage suite, in registry order."""
  return tuple(name for name, task in TASKS.items() if task.headline)

