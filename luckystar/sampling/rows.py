"""A rollout row's bookkeeping on the host: what its decode slot generated, the tool turns spliced in, and the
`Rollout` it ends as (docs/rl.md).

A row that stops at END_ACTION gets its tool called, and its tool turn is appended to the cache it already
has (`Tokenizer.tool_round_trip`, the layout `Tokenizer.render` gives an assistant turn with an action followed
by a tool turn and another assistant turn). Each step returns the row's feed: the tokens its slot appends
before it decodes again (its last sampled token, then any tool turn).
"""

import dataclasses
from typing import Sequence

import numpy as np

from luckystar import tokenizer as tokenizer_lib
from luckystar.sampling.decode import SampleOutput
from luckystar.tools.dispatch import ToolFn


@dataclasses.dataclass
class Rollout:
  """One row's continuation after its prompt, all arrays aligned with token_ids.

  loss_mask is 1 on model-generated tokens and 0 on the spliced tool round trips; both log-prob
  arrays are 0 where the mask is 0. stop_reason: 'end_of_turn' (the assistant closed its turn),
  'action' (stopped at END_ACTION and tool_fn returned None: the action is the answer),
  'tool_limit' (an action after max_tool_turns tool calls; the tool was not run), 'overlong'
  (the budget ran out first) or 'cancelled' (`rollout`'s follow dropped it). finished = stop_reason != 'overlong'.
  thinking: the thinking sections
  of all its assistant turns, joined by a newline (None if none): an agent thinks in the turn that
  calls its tool, so the final turn alone may have none. tool_results: the text of each spliced tool
  result as the model read it (after the max_tool_result_tokens cut), in order; the language check
  reads words the response copies from them as data (`rewards.language`).
  """
  token_ids: np.ndarray             # [L] int32
  loss_mask: np.ndarray             # [L] int32
  logprobs: np.ndarray              # [L] float32
  untruncated_logprobs: np.ndarray  # [L] float32
  actions: list[str]                # the action texts, in order
  final_turn: tokenizer_lib.AssistantTurn   # the last assistant turn, parsed
  stop_reason: str
  thinking: str | None = None
  tool_results: list[str] = dataclasses.field(default_factory=list)

  @property
  def finished(self) -> bool:
    return self.stop_reason != 'overlong'

  @property
  def overlong(self) -> bool:
    return self.stop_reason == 'overlong'


@dataclasses.dataclass
class Row:
  """A row's continuation so far, as lists that grow each round (`finish` makes its `Rollout`)."""
  prompt: list[int]
  budget: int             # the most tokens of its continuation, tool turns included
  token_ids: list[int] = dataclasses.field(default_factory=list)
  loss_mask: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  untruncated_logprobs: list[float] = dataclasses.field(default_factory=list)
  actions: list[str] = dataclasses.field(default_factory=list)
  thinking: list[str] = dataclasses.field(default_factory=list)   # of the turns before the current one
  tool_results: list[str] = dataclasses.field(default_factory=list)
  turn_start: int = 0     # where the current assistant turn starts in token_ids
  calling_thinking: str | None = None   # the thinking of the turn whose tool is being called
  call_ids: tuple[str, ...] = ()        # the ids that turn's action gave its calls (a numbered-calls format)
  stop_reason: str | None = None


def take_turn(row: Row, out: SampleOutput, slot: int, tokenizer: tokenizer_lib.Tokenizer, tool_fn: ToolFn | None,
              max_tool_turns: int) -> list[int] | None:
  """Appends what slot `slot` generated for `row`; returns the row's feed (its last token), None when the row
  stopped at an action whose tool is to be called (`splice`), or sets row.stop_reason when the row is done."""
  length = int(out.lengths[slot])
  row.token_ids += out.tokens[slot, :length].tolist()
  row.loss_mask += [1] * length
  row.logprobs += out.logprobs[slot, :length].tolist()
  row.untruncated_logprobs += out.untruncated_logprobs[slot, :length].tolist()
  if out.overlong[slot]:
    row.stop_reason = 'overlong'
    return []
  if not out.finished[slot]:   # the loop returned while it ran: it goes on from its last token
    return row.token_ids[-1:]
  if row.token_ids[-1] == tokenizer.end_of_turn_id:
    row.stop_reason = 'end_of_turn'
    return []
  turn = tokenizer.parse_assistant(row.token_ids[row.turn_start:])   # stopped at END_ACTION
  row.actions.append(turn.action or '')
  row.calling_thinking, row.call_ids = turn.thinking, turn.call_ids
  if len(row.tool_results) == max_tool_turns:
    row.stop_reason = 'tool_limit'
    return []
  if tool_fn is None:
    row.stop_reason = 'action'
    return []
  return None


def splice(row: Row, result: str | Sequence[str] | None, tokenizer: tokenizer_lib.Tokenizer,
           max_tool_result_tokens: int) -> list[int]:
  """Splices the tool `result` of the row's last action in (None: there was no tool to run, the row ends);
  returns the row's feed (its last token, then the tool turn)."""
  if result is None:
    row.stop_reason = 'action'
    return []
  row.thinking += [row.calling_thinking] if row.calling_thinking is not None else []
  body, text = tokenizer.tool_result_ids(result, max_tool_result_tokens, row.call_ids)
  row.tool_results.append(text)
  tool_turn = tokenizer.tool_round_trip(body)
  if len(row.token_ids) + len(tool_turn) >= row.budget:  # no room left to answer
    tool_turn = tool_turn[:row.budget - len(row.token_ids)]
    row.stop_reason = 'overlong'
  row.token_ids += tool_turn
  row.loss_mask += [0] * len(tool_turn)
  row.logprobs += [0.0] * len(tool_turn)
  row.untruncated_logprobs += [0.0] * len(tool_turn)
  row.turn_start = len(row.token_ids)
  return row.token_ids[-len(tool_turn) - 1:]


def finish(row: Row, tokenizer: tokenizer_lib.Tokenizer) -> Rollout:
  """The row's `Rollout` so far (an unfinished row reads as overlong)."""
  final_turn = tokenizer.parse_assistant(row.token_ids[row.turn_start:])
  thinking = row.thinking + ([final_turn.thinking] if final_turn.thinking is not None else [])
  return Rollout(
      token_ids=np.array(row.token_ids, np.int32), loss_mask=np.array(row.loss_mask, np.int32),
      logprobs=np.array(row.logprobs, np.float32),
      untruncated_logprobs=np.array(row.untruncated_logprobs, np.float32), actions=row.actions,
      final_turn=final_turn, stop_reason=row.stop_reason or 'overlong',
      thinking='\n'.join(thinking) if thinking else None, tool_results=row.tool_results)
