"""Examples → chat conversations for SFT, in either mode (DESIGN §4, §5 hybrid SFT).

Reasoning mode: an English step-by-step thinking section, then the response in the
prompt's language (or, with `thinking_language='ko'`, the Korean trace: the paper's
Table 1 ablation). Concise mode: the response only. Function calling answers with an
action; NL2SQL with an action, the sandbox's tool result, then a response.
"""

import json
from typing import Sequence

import numpy as np

from luckystar import tools
from luckystar.data.examples import Example
from luckystar.rewards import function_call
from luckystar.tokenizer import Tokenizer
from luckystar.tools import sql as sql_tool

# SFT mixture defaults: 80% reasoning-mode conversations, 20% concise (paper §2.1).
DEFAULT_WEIGHTS = {'reasoning': 0.8, 'concise': 0.2}
REASONING_TASKS = ('math', 'function_calling', 'korean_mc')
CONCISE_TASKS = ('chat', 'korean_mc', 'math')


def _action(example: Example) -> str:
  """The gold tool call(s) as our action JSON: one object, or a list for parallel calls."""
  calls = [function_call.gold_call(entry, example.meta['functions']) for entry in json.loads(example.answer)]
  return json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)


def _thinking(example: Example, thinking_language: str) -> str:
  if thinking_language == 'ko' and example.thinking_ko:
    return example.thinking_ko
  if example.thinking:
    return example.thinking
  if example.task == 'function_calling':
    names = ', '.join(next(iter(entry)) for entry in json.loads(example.answer))
    return f'The request needs a tool call: {names}. I fill in the arguments from the question.'
  if example.task == 'nl2sql':
    return 'I will query the database with SQL, then answer from the result.'
  return f'This is a short factual question; the answer is {example.answer}.'


def prompt(example: Example) -> list[dict]:
  """The messages before the assistant's turn: the task context (if any) and the question."""
  return ([{'role': 'system', 'content': example.system}] if example.system else []) + [
      {'role': 'user', 'content': example.prompt}]


def messages(example: Example, mode: str, *, thinking_language: str = 'en', db_path: str | None = None
             ) -> list[dict]:
  """The conversation an SFT example teaches. NL2SQL needs `db_path` to run its gold query."""
  conversation = prompt(example)
  thinking = {'thinking': _thinking(example, thinking_language)} if mode == 'reasoning' else {}
  if example.task == 'function_calling':
    return conversation + [{'role': 'assistant', **thinking, 'action': _action(example)}]
  if example.task == 'nl2sql':
    result = sql_tool.execute(db_path or example.meta['db_path'], example.answer)
    if not result.ok:
      raise ValueError(f'example {example.id}: gold SQL fails: {result.error}')
    action = json.dumps({'tool_name': tools.SQL_TOOL, 'parameters': {'query': example.answer}}, ensure_ascii=False)
    first_cell = result.rows[0][0] if result.rows and result.rows[0] else None
    response = (f'결과는 {first_cell}입니다.' if example.language == 'ko' else f'The result is {first_cell}.')
    return conversation + [{'role': 'assistant', **thinking, 'action': action},
                           {'role': 'tool', 'content': sql_tool.format_result(result)},
                           {'role': 'assistant', 'response': response}]
  response = example.response or example.answer
  return conversation + [{'role': 'assistant', **thinking, 'response': response}]


def render_example(tokenizer: Tokenizer, example: Example, mode: str, *, thinking_language: str = 'en',
                   db_path: str | None = None) -> dict[str, np.ndarray]:
  """{'tokens', 'loss_mask'} int32 arrays: the rendered conversation, loss on assistant tokens only."""
  ids, mask = tokenizer.render(messages(example, mode, thinking_language=thinking_language, db_path=db_path), mode)
  return {'tokens': np.asarray(ids, np.int32), 'loss_mask': np.asarray(mask, np.int32)}


def sft_sources(tokenizer: Tokenizer, *, seed: int = 0, split: str = 'train',
                reasoning_tasks: Sequence[str] = REASONING_TASKS, concise_tasks: Sequence[str] = CONCISE_TASKS,
                extra_reasoning: Sequence[dict] = ()) -> tuple[dict[str, list], dict[str, float]]:
  """The hybrid SFT mixture: ({'reasoning': [...], 'concise': [...]}, DEFAULT_WEIGHTS); each element is
  `render_example`'s dict. `extra_reasoning` adds pre-rendered conversations (rejection-sampled traces)."""
  from luckystar.data import suites  # suites build databases; only needed here
  sources = {'reasoning': list(extra_reasoning), 'concise': []}
  for mode, tasks in (('reasoning', reasoning_tasks), ('concise', concise_tasks)):
    for task in tasks:
      for example in suites.load(task, split, seed=seed):
        sources[mode].append(render_example(tokenizer, example, mode))
  return sources, dict(DEFAULT_WEIGHTS)
