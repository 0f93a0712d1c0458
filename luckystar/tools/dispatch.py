"""Which tool an action calls, and the text its result splices into a rollout (`sampling.rollout`'s tool_fn).

A tool_fn is tool_fn(row, action_text) → the tool results (one string, or one per call) or None: there is no
tool to run, and the row ends with its action as the answer.
"""

import json
from typing import Callable, Sequence

from luckystar.tools import CALCULATOR_TOOL, SQL_TOOL
from luckystar.tools import calculator
from luckystar.tools import sql as sql_tool
from luckystar.tools.calls import parse_calls

ToolFn = Callable[[int, str], 'str | Sequence[str] | None']

_TOOL_PARAMETER = {SQL_TOOL: 'query', CALCULATOR_TOOL: 'expression'}


def agent_tools(db_paths: Sequence[str | None], *, timeout_s: float = 2.0, max_chars: int = 2_000) -> ToolFn:
  """The tool_fn of task rollouts: `calculator` for every row, and `execute_sql` actions of row i run
  against db_paths[i] in the SQL sandbox.

  The action must be one call `{"tool_name": ..., "parameters": {...}}` or a list of them (one result a
  call, which the chat format lays out: ours joins them by a blank line). Anything else (another tool, a
  format error, SQL on a row without a database) returns None: there is no tool to run, and the reward
  judges the action. A call with bad parameters gets an `ERROR: ...` result, as a failing query does, so
  the agent can retry.
  """
  def run(row: int, action_text: str) -> list[str] | None:
    calls = parse_calls(action_text)
    db_path = db_paths[row]
    if calls is None or any(call['tool_name'] not in (SQL_TOOL, CALCULATOR_TOOL) or
                            (call['tool_name'] == SQL_TOOL and db_path is None) for call in calls):
      return None
    return [_run_call(call, db_path, timeout_s, max_chars) for call in calls]

  return run


def _run_call(call: dict, db_path: str | None, timeout_s: float, max_chars: int) -> str:
  name = call['tool_name']
  argument = call['parameters'].get(_TOOL_PARAMETER[name])
  if not isinstance(argument, str):
    return (f'ERROR: {name} needs one string parameter "{_TOOL_PARAMETER[name]}", got '
            f'{json.dumps(call["parameters"], ensure_ascii=False)[:200]}')
  if name == SQL_TOOL:
    return sql_tool.format_result(sql_tool.execute(db_path, argument, timeout_s=timeout_s), max_chars)
  result = calculator.evaluate(argument)
  return calculator.format_value(result.value) if result.ok else f'ERROR: {result.error}'
