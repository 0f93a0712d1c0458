"""KV-cache sampler and the multi-turn tool rollout loop (docs/models.md, docs/rl.md).

  decode.py     sampling settings, token choice, `generate` (the jitted decode loop) and `sample`
  rows.py       a rollout row's host bookkeeping: its turns, spliced tool turns and the `Rollout` it ends as
  scheduler.py  `rollout`: the tool loop, continuously batched over decode slots (`RolloutSettings`)
  programs.py   the jitted programs `rollout` calls, public for AOT plans (`luckystar.aot_plan`)
  shapes.py     bucketed sizes, so that a run reuses a few compiled programs

Tool dispatch (`agent_tools`, the tool_fn of task rollouts) lives in `luckystar.tools.dispatch`.
"""

from luckystar.sampling.decode import (PAD_ID, CachedDecoder, Decoder, DecodeRows, DecodeStart, SampleOutput,
                                       SamplingProgram, SamplingSettings, as_decoder, chosen_logprobs,
                                       choose_tokens, generate, greedy_tokens, right_pad, row_keys, sample,
                                       sample_padded, truncated_logits)
from luckystar.sampling.programs import admit, admit_in_place, decode_round, grow_state, init_state
from luckystar.sampling.rows import Rollout
from luckystar.sampling.scheduler import MoreRow, RolloutHooks, RolloutSettings, rollout
from luckystar.sampling.shapes import stop_array
from luckystar.tools.dispatch import ToolFn, agent_tools
