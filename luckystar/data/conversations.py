"""Examples → chat conversations for SFT, in either mode (docs/models.md, docs/training.md hybrid SFT).

Reasoning mode: an English step-by-step thinking section, then the response in the
prompt's language (or, with `thinking_language='ko'`, Korean prompts think in the Korean trace:
the paper's Table 1 ablation). Concise mode: the response only. Function calling answers with an
action; NL2SQL with an action, the sandbox's tool result, then a response; reasoning-mode math the
same way with the calculator. Reasoning-mode chat arithmetic (sums, hours to minutes) calls the
calculator in a fraction `chat_tool_fraction` of its traces and states the answer in the rest, as
data pooled from sources that use tools unevenly would: SFT leaves the policy calling the tool some
of the time, and RLVR, whose reward sees only the answer, teaches it that the tool pays.
"""

import hashlib
import json
from typing import Sequence

import numpy as np

from luckystar import errors, files, tools
from luckystar.errors import UserError
from luckystar.data import nl2sql
from luckystar.data.examples import Example, split_of
from luckystar.rewards import function_call
from luckystar.tokenizer import Tokenizer
from luckystar.tools import calculator
from luckystar.tools import sql as sql_tool

# SFT mixture defaults: 80% reasoning-mode conversations, 20% concise (paper §2.1).
DEFAULT_WEIGHTS = {'reasoning': 0.8, 'concise': 0.2}
# The bundled SFT recipe, not a task list: which registered tasks (`luckystar.tasks`) teach each mode, in the order
# that fixes the mixture's shuffle and so the bundled models. NL2SQL is left to RL (the paper's cold start), as is
# a newly registered task unless named here.
REASONING_TASKS = ('math', 'function_calling', 'korean_mc', 'chat')
CONCISE_TASKS = ('chat', 'korean_mc', 'math', 'function_calling')  # concise tool use: the action alone
# `tiny-base` (the stand-in for an already post-trained chat model, docs/data.md): concise-mode
# conversations per task, and plain bilingual text with loss on every token.
BASE_WEIGHTS = {'chat': 0.35, 'korean_mc': 0.45, 'math': 0.1, 'text': 0.1}
# Reasoning-mode chat arithmetic that calls the calculator (the rest states the answer, which the
# 5M-parameter model gets wrong: it cannot add in its weights). Below 1/2, so `tiny-sft` answers
# greedily without the tool while its samples sometimes use it: the behaviour RLVR can reinforce.
CHAT_TOOL_FRACTION = 0.3
BASE_TEXT_LINES = 20_000
BASE_KOREAN_MC_DRAWS = 6000


def _action(example: Example) -> str:
  """The gold tool call(s) as our action JSON: one object, or a list for parallel calls."""
  calls = [function_call.gold_call(entry, example.meta['functions']) for entry in json.loads(example.answer)]
  return json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)


def _thinking(example: Example, thinking_language: str, calls_calculator: bool) -> str:
  if thinking_language == 'ko' and example.language == 'ko' and example.thinking_ko:
    return example.thinking_ko
  if example.thinking:
    return example.thinking
  if example.task == 'function_calling':
    names = ', '.join(next(iter(entry)) for entry in json.loads(example.answer))
    return f'The request needs a tool call: {names}. I fill in the arguments from the question.'
  if example.task == 'nl2sql':
    return nl2sql_thinking(example.meta.get('values'))
  if calls_calculator:  # chat arithmetic (math traces carry their own thinking)
    return f'This is arithmetic; the calculator gives the exact value of {example.meta["expression"]}.'
  return f'This is a short factual question; the answer is {example.answer}.'


def nl2sql_thinking(values) -> str:
  """An NL2SQL trace's thinking: the question's values, restated next to it, are a short copy away for the query."""
  return f'{naming(values) + " " if values else ""}I will query the database with SQL, then answer from the result.'


def naming(values) -> str:
  """The thinking line that restates a question's values, spelled as the question spells them (`nl2sql.spell`)."""
  return f'The question names {", ".join(map(nl2sql.spell, values))}.'


def prompt(example: Example) -> list[dict]:
  """The messages before the assistant's turn: the task context (if any), earlier turns (`meta['history']`, a
  multi-turn benchmark's second question) and the question."""
  return ([{'role': 'system', 'content': example.system}] if example.system else []) + [
      *example.meta.get('history', ()), {'role': 'user', 'content': example.prompt}]


def uses_calculator(example: Example, mode: str, chat_tool_fraction: float = CHAT_TOOL_FRACTION) -> bool:
  """Whether `example`'s trace in `mode` calls the calculator: reasoning-mode math with an expression,
  and reasoning-mode chat arithmetic when a stable hash of its id falls below `chat_tool_fraction`."""
  if mode != 'reasoning' or not example.meta.get('expression'):
    return False
  if example.task == 'chat':
    digest = hashlib.sha256(f'chat-tool:{example.id}'.encode()).digest()
    return int.from_bytes(digest[:8], 'big') / 2**64 < chat_tool_fraction
  return example.task == 'math'


def messages(example: Example, mode: str, *, thinking_language: str = 'en', db_path: str | None = None,
             chat_tool_fraction: float = CHAT_TOOL_FRACTION) -> list[dict]:
  """The conversation an SFT example teaches. NL2SQL needs `db_path` to run its gold query.

  Function calling answers with its action. NL2SQL, and the traces `uses_calculator` picks (reasoning
  math, some reasoning chat arithmetic), call their tool, see its result and answer from it; concise
  mode answers directly."""
  conversation = prompt(example)
  calls_calculator = uses_calculator(example, mode, chat_tool_fraction)
  thinking = {'thinking': _thinking(example, thinking_language, calls_calculator)} if mode == 'reasoning' else {}
  if example.task == 'function_calling':
    return conversation + [{'role': 'assistant', **thinking, 'action': _action(example)}]
  if example.task == 'nl2sql':
    result = sql_tool.execute(db_path or example.meta['db_path'], example.answer)
    if not result.ok:
      raise ValueError(f'example {example.id}: gold SQL fails: {result.error}')
    first_cell = result.rows[0][0] if result.rows and result.rows[0] else None
    response = (f'결과는 {first_cell}입니다.' if example.language == 'ko' else f'The result is {first_cell}.')
    return conversation + _tool_round_trip(thinking, tools.SQL_TOOL, {'query': example.answer},
                                           sql_tool.format_result(result), response)
  response = example.response or example.answer
  if calls_calculator:
    result = calculator.evaluate(example.meta['expression'])
    if not result.ok or calculator.format_value(result.value) != example.answer:
      raise ValueError(f'example {example.id}: its expression {example.meta["expression"]!r} does not give the '
                       f'answer {example.answer!r} ({result.error or calculator.format_value(result.value)})')
    return conversation + _tool_round_trip(thinking, tools.CALCULATOR_TOOL, {'expression': example.meta['expression']},
                                           example.answer, response)
  return conversation + [{'role': 'assistant', **thinking, 'response': response}]


def _tool_round_trip(thinking: dict, tool_name: str, parameters: dict, result: str, response: str) -> list[dict]:
  """An assistant turn that calls one tool, the tool's result, and the answer turn after it."""
  action = json.dumps({'tool_name': tool_name, 'parameters': parameters}, ensure_ascii=False)
  return [{'role': 'assistant', **thinking, 'action': action}, {'role': 'tool', 'content': result},
          {'role': 'assistant', 'response': response}]


def render_example(tokenizer: Tokenizer, example: Example, mode: str, *, thinking_language: str = 'en',
                   db_path: str | None = None, chat_tool_fraction: float = CHAT_TOOL_FRACTION
                   ) -> dict[str, np.ndarray]:
  """{'tokens', 'loss_mask'} int32 arrays: the rendered conversation, loss on assistant tokens only."""
  ids, mask = tokenizer.render(messages(example, mode, thinking_language=thinking_language, db_path=db_path,
                                        chat_tool_fraction=chat_tool_fraction), mode)
  return {'tokens': np.asarray(ids, np.int32), 'loss_mask': np.asarray(mask, np.int32)}


def sft_sources(tokenizer: Tokenizer, *, seed: int = 0, split: str = 'train',
                reasoning_tasks: Sequence[str] = REASONING_TASKS, concise_tasks: Sequence[str] = CONCISE_TASKS,
                extra_reasoning: Sequence[dict] = (), thinking_language: str = 'en',
                chat_tool_fraction: float = CHAT_TOOL_FRACTION) -> tuple[dict[str, list], dict[str, float]]:
  """The hybrid SFT mixture: ({'reasoning': [...], 'concise': [...]}, DEFAULT_WEIGHTS); each element is
  `render_example`'s dict. `extra_reasoning` adds pre-rendered conversations (rejection-sampled traces);
  `thinking_language='ko'` gives Korean prompts their Korean trace (Table 1's ablation);
  `chat_tool_fraction` is the share of reasoning chat arithmetic that calls the calculator."""
  from luckystar.data import suites  # suites build databases; only needed here
  sources = {'reasoning': list(extra_reasoning), 'concise': []}
  for mode, tasks in (('reasoning', reasoning_tasks), ('concise', concise_tasks)):
    for task in tasks:
      for example in suites.load(task, split, seed=seed, tokenizer=tokenizer):
        sources[mode].append(render_example(tokenizer, example, mode, thinking_language=thinking_language,
                                            chat_tool_fraction=chat_tool_fraction))
  return sources, dict(DEFAULT_WEIGHTS)


def text_document(tokenizer: Tokenizer, text: str) -> dict[str, np.ndarray]:
  """Plain text as a language-modelling document: BOS, the text, EOS; loss on every token after BOS."""
  ids = [tokenizer.bos_id, *tokenizer.encode(text), tokenizer.eos_id]
  return {'tokens': np.asarray(ids, np.int32), 'loss_mask': np.asarray([0] + [1] * (len(ids) - 1), np.int32)}


def base_sources(tokenizer: Tokenizer, *, seed: int = 0, split: str = 'train', text_lines: int = BASE_TEXT_LINES
                 ) -> tuple[dict[str, list], dict[str, float]]:
  """`tiny-base`'s mixture: ({'chat', 'korean_mc', 'math': concise-mode conversations, 'text': plain
  documents}, BASE_WEIGHTS). No reasoning mode, no tools: the agent tasks stay unlearned (the paper's
  cold start). Korean MC draws BASE_KOREAN_MC_DRAWS questions (new option orders of the split's
  sentences). Text lines are `corpus.template_text` (Faker's Korean/English data in templates),
  split by the same hash rule as the suites."""
  from luckystar.data import corpus, korean_mc, suites  # suites build databases; corpus needs Faker
  sources = {task: [render_example(tokenizer, e, 'concise')
                    for e in suites.load(task, split, seed=seed, tokenizer=tokenizer)]
             for task in ('chat', 'math')}
  # Korean MC: more option orders of the same split's sentences (the suite's own examples come first),
  # so the letter must be read from the options rather than remembered per prompt.
  sources['korean_mc'] = [render_example(tokenizer, e, 'concise')
                          for e in korean_mc.suite(seed, count=BASE_KOREAN_MC_DRAWS) if e.split == split]
  sources['text'] = [text_document(tokenizer, line) for line in corpus.template_text(seed, text_lines)
                     if split_of(line, seed) == split]
  return sources, dict(BASE_WEIGHTS)


# ---- the rejection-sampling teacher and its traces (docs/rl.md) ---------------------------------------

# The teacher learns every task in reasoning mode, NL2SQL included: its gold traces run over the
# teacher split's own databases, which the student never sees, and over the extra teacher databases
# of mixed wordings (`nl2sql.teacher_suite`) that make it read names off the schema.
TEACHER_REASONING_TASKS = ('nl2sql', *REASONING_TASKS)


def teacher_sources(tokenizer: Tokenizer, *, seed: int = 0, chat_tool_fraction: float = CHAT_TOOL_FRACTION
                    ) -> tuple[dict[str, list], dict[str, float]]:
  """The teacher's SFT mixture, from the 'teacher' split only (its questions and NL2SQL databases are
  disjoint from the student's train and held-out splits) plus the NL2SQL of `nl2sql.teacher_suite`,
  curated like the suites': ({'reasoning': [...], 'concise': [...]}, DEFAULT_WEIGHTS), each element
  `render_example`'s dict. NL2SQL golds run through the sandbox."""
  extra, _ = nl2sql.curate(nl2sql.teacher_suite(seed=seed), lambda text: len(tokenizer.encode(text)))
  return sft_sources(tokenizer, seed=seed, split='teacher', reasoning_tasks=TEACHER_REASONING_TASKS,
                     concise_tasks=CONCISE_TASKS, chat_tool_fraction=chat_tool_fraction,
                     extra_reasoning=[render_example(tokenizer, e, 'reasoning') for e in extra])


RS_TRACE_FIELDS = ('example_id', 'task', 'language', 'sample_index', 'teacher', 'mode', 'tokenizer', 'tokens',
                   'loss_mask')


def read_rs_traces(path: str, tokenizer: Tokenizer) -> list[dict[str, np.ndarray]]:
  """A rejection-sampling trace file (`luckystar.stages.rejection_sampling` writes `rs_traces.jsonl`:
  one JSON object per line with RS_TRACE_FIELDS) → [{'tokens', 'loss_mask'}] int32 arrays, ready as
  `sft_sources(..., extra_reasoning=...)`. A malformed line raises UserError naming file:line, and so
  does a trace of another tokenizer (its `tokenizer` fingerprint, `Tokenizer.made`)."""
  vocab_size = tokenizer.vocab_size
  try:
    records = files.read_jsonl(path, what='rejection-sampling trace file')
  except errors.MissingFile:
    raise errors.MissingFile(f'{path}: no such rejection-sampling trace file (config.sft.rs_traces); '
                             'run the rejection_sampling stage first, or set it to "" for none') from None
  traces = []
  for number, record in records:
    try:
      if not isinstance(record, dict) or record.get('mode') != 'reasoning':
        raise ValueError('expected a JSON object with "mode": "reasoning"')
      tokens, mask = record['tokens'], record['loss_mask']
      if (not isinstance(tokens, list) or not isinstance(mask, list) or not tokens or len(tokens) != len(mask)
          or not all(type(t) is int and 0 <= t < vocab_size for t in tokens)
          or not all(m in (0, 1) for m in mask) or not any(mask)):
        raise ValueError(f'"tokens" must be token ids below {vocab_size} and "loss_mask" as many 0/1 values '
                         f'with at least one 1')
      if not tokenizer.made(record.get('tokenizer')):
        raise ValueError(f'its tokens are of tokenizer {record.get("tokenizer")}, not of config.init_from\'s '
                         f'({tokenizer.fingerprint}); sample the traces again with this tokenizer')
    except (ValueError, KeyError) as e:  # json.JSONDecodeError is a ValueError
      reason = f'missing field {e}' if isinstance(e, KeyError) else str(e)
      raise UserError(f'{path}:{number}: not a rejection-sampling trace ({reason}); expected a line '
                      'written by the rejection_sampling stage') from None
    traces.append({'tokens': np.asarray(tokens, np.int32), 'loss_mask': np.asarray(mask, np.int32)})
  return traces

