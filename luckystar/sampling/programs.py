"""The jitted programs `rollout`'s host loop calls, public so that an AOT plan (`luckystar.aot_plan`) lowers
and compiles exactly these: `init_state` (an empty decoder state), `admit` or `admit_in_place` (chunks
appended to some slots: prompts, tool turns), `decode_round` (the decode loop until some rows stop) and
`grow_state` (more slots). A state argument named `state` is donated: the caller's copy is consumed.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp

from luckystar.model.cohere2 import constrain
from luckystar.sampling import decode

Array = jax.Array


@functools.partial(jax.jit, static_argnames=('decoder', 'batch', 'max_length'))
def init_state(decoder: decode.Decoder, *, batch: int, max_length: int) -> Any:
  """An empty state of `batch` slots of max_length columns (laid out by the decoder's own constraints)."""
  return decoder.init(batch, max_length)


@functools.partial(jax.jit, static_argnames=('decoder', 'batch', 'max_length'))
def grow_state(decoder: decode.Decoder, state: Any, rows: Array, *, batch: int, max_length: int) -> Any:
  """A state of `batch` rows whose first len(rows) rows are `state`'s, the rest empty."""
  return decoder.put(decoder.init(batch, max_length), rows, state)


@functools.partial(jax.jit, static_argnames=('decoder', 'slots'), donate_argnames=('state',))
def admit(decoder: decode.Decoder, params: Any, state: Any, tokens: Array, lengths: Array, sources: Array,
          fresh: Array, targets: Array, picks: Array, *, slots: int) -> tuple[Array, Any]:
  """Appends chunks to a few rows of `state`, computing only those rows.

  Chunk r (tokens[r, :lengths[r]]) extends a copy of row sources[r], emptied first where fresh[r]; slot
  targets[d] then takes chunk picks[d]'s row (one chunk can fill several slots: the samples of a prompt
  share its prefill; targets out of range are dropped). Returns (logits [slots, V], zero where no chunk
  landed; state of `slots` rows).
  """
  sub = decoder.reset(decoder.take(state, sources), fresh)
  chunk_logits, sub = decoder.extend(params, tokens, lengths, sub)
  state = decoder.put(state, targets, decoder.take(sub, picks))
  logits = jnp.zeros((slots, chunk_logits.shape[1]), chunk_logits.dtype)
  return logits.at[targets].set(chunk_logits[picks], mode='drop'), state


@functools.partial(jax.jit, static_argnames=('decoder',), donate_argnames=('state',))
def admit_in_place(decoder: decode.Decoder, params: Any, state: Any, tokens: Array, lengths: Array, fresh: Array
                   ) -> tuple[Array, Any]:
  """`admit` through the whole batch: slot b appends tokens[b, :lengths[b]] (emptied first where fresh[b]),
  the others are left as they were. Returns (logits [slots, V], zero where nothing landed; state)."""
  tokens = constrain(tokens.astype(jnp.int32), ('batch', 'length'))
  logits, state = decoder.extend(params, tokens, lengths, decoder.reset(state, fresh))
  return jnp.where((lengths > 0)[:, None], logits, 0), state


decode_round = jax.jit(decode.generate, static_argnames=('decoder', 'max_new_tokens'), donate_argnames=('state',))
"""`decode.generate` jitted, its state donated: one decode call of the host loop, `rollout/decode` of an AOT plan."""
