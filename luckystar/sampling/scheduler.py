"""The multi-turn tool rollout loop, continuously batched over a fixed number of decode slots (docs/rl.md).

Each slot holds one row at a time (its `occupant`) with that row's KV cache, and between decode calls is
given its `feed`: the tokens it appends before it decodes again (a new prompt, a continuing row's last token,
or that token and a spliced tool turn). A row that stops at END_ACTION gets its tool called on the host while
its slot keeps its cache (`rows.take_turn`, `rows.splice`); a row that ends hands its slot to the next
waiting prompt.
"""

import collections
import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from luckystar import distributed
from luckystar import model as model_lib
from luckystar import tokenizer as tokenizer_lib
from luckystar.sampling import decode
from luckystar.sampling import programs
from luckystar.sampling import rows as rows_lib
from luckystar.sampling import shapes
from luckystar.sampling.rows import Rollout
from luckystar.tools.dispatch import ToolFn

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
  """How `rollout` samples, runs tools and shapes its programs: what a stage's config decides
  (`engine.rollouts.rollout_settings` builds it).

  max_new_tokens bounds a whole continuation, spliced tool turns included, so a sequence never exceeds
  prompt + max_new_tokens. A tool result is cut to max_tool_result_tokens tokens; an action after
  max_tool_turns tool calls ends the row. slots: decode slots (default one per row; rounded up to a power of
  two, and to a multiple of the mesh's batch devices). Shapes are fixed for a call (the cache of the longest
  prompt + max_new_tokens rounded up to length_multiple; appended chunks a power of two up to length_multiple,
  then its multiples), so a run reuses a few compiled programs.

  decode_chunk (a server): the decode loop returns to the host every decode_chunk tokens, and the cache and
  appended chunks are powers of two long, so that any budget and prompt length reuse one of a few programs;
  the tokens are the same draws.
  """
  max_new_tokens: int             # one budget for every row (`rollout`'s budgets: one per row)
  temperature: float = 1.0        # these three as `SamplingSettings`
  top_k: int = 0
  top_p: float = 1.0
  max_tool_turns: int = 4
  max_tool_result_tokens: int = 512
  length_multiple: int = 64
  slots: int | None = None
  decode_chunk: int | None = None

  def __post_init__(self):
    _ = self.sampling   # a bad temperature, top_k or top_p fails here, before any rollout

  @property
  def sampling(self) -> decode.SamplingSettings:
    """The decode loop's settings (each value cast as the config may hold an int for a float)."""
    return decode.SamplingSettings(float(self.temperature), int(self.top_k), float(self.top_p))


# A prompt `more` admits: (prompt, budget, key, row id), prompt + budget at most the cache length.
MoreRow = tuple[Sequence[int], int, Array, int]


@dataclasses.dataclass(frozen=True)
class RolloutHooks:
  """Callbacks into `rollout`'s host loop, each optional.

  progress: called with the number of rows that ended, each time some have (a progress bar's update).
  check: called before each decode call; an exception it raises ends the rollout (a server's client that hung
  up). follow (a server's streamed replies and per-row hang-ups): called before each decode call as
  follow(row_index, the row's Rollout so far) for every row not yet ended; False drops the row (its slot goes
  to the next prompt; its Rollout ends with stop_reason 'cancelled').

  more and done (a server's continuous batching; need decode_chunk and one key per prompt): before a decode
  call with slots free that no waiting prompt takes, more(free slots, cache length) gives prompts to admit
  into them (`MoreRow`s); they are rows len(prompts), len(prompts) + 1, ... of the result; once they
  outnumber the slots, the slots grow to `RolloutSettings.slots` (rows kept). done(row_index, its Rollout) is
  called as each row ends, so its caller need not wait for the rest.
  """
  progress: Callable[[int], Any] | None = None
  check: Callable[[], Any] | None = None
  follow: Callable[[int, Rollout], bool] | None = None
  more: Callable[[int, int], Sequence[MoreRow]] | None = None
  done: Callable[[int, Rollout], Any] | None = None


def rollout(model: 'model_lib.ModelConfig | decode.Decoder', params: Any, tokenizer: tokenizer_lib.Tokenizer,
            prompts: Sequence[Sequence[int]], *, rng: Array, settings: RolloutSettings,
            budgets: Sequence[int] | None = None, tool_fn: ToolFn | None = None,
            row_ids: Sequence[int] | None = None, hooks: RolloutHooks | None = None) -> list[Rollout]:
  """Generates each prompt's continuation, running tools between turns.

  prompts: rendered with add_generation_prompt=True. A row that stops at END_ACTION gets
  `tool_fn(row_index, action_text)`: the tool results (one string, or one per call), spliced in as
  `Tokenizer.tool_round_trip` before generation resumes; None, or no tool_fn, ends the row. budgets: each
  prompt's own max_new_tokens (default `settings.max_new_tokens` for all).

  Continuous batching (module docstring): a row keeps its slot across its tool turns, so resuming appends
  only its spliced tool turn (tools run on the host between decode calls: a slot waiting on one costs no
  decode work). The decode loop returns to the host once a quarter of the busy slots have stopped (to run
  their tools or refill them) or, with nothing to refill and no tools, once all have.

  rng: one key, or one key per prompt (each row's draws keyed by its own key and row id: rows of several
  seeded requests sampled together, each as it would be alone). row_ids: each prompt's global id (default its
  index), which with its continuation column keys its draws: a row samples the same tokens whatever slot,
  batch or round it runs in.

  Several processes (params sharded over all of them): each calls this with the same prompts and runs the
  same host loop, so all make the same admissions and exits and call the same programs; the decode outputs
  are gathered to every process, and `tool_fn(i, ...)` runs only on row i's owner (`distributed.run_owned`),
  which shares its result. A tool result must therefore be picklable (a string or None).
  """
  if not prompts:
    return []
  hooks = hooks or RolloutHooks()
  rows, ids = _checked_rows(prompts, rng, settings, budgets, row_ids, hooks)
  slots = _Slots(decode.as_decoder(model), params, tokenizer, tool_fn, settings, rows, ids, rng)
  while True:
    if hooks.follow is not None:
      slots.drop_unfollowed(hooks)
    if hooks.more is not None:
      slots.take_more(hooks.more)
    fresh = slots.fill()
    busy = [slot for slot, row in enumerate(slots.occupant) if row is not None]
    if not busy:
      break
    if hooks.check is not None:
      hooks.check()
    slots.take_turns(slots.generate(fresh, busy), busy)
    slots.release(busy, hooks)
  return [rows_lib.finish(row, tokenizer) for row in slots.rows]


def _checked_rows(prompts: Sequence[Sequence[int]], rng: Array, settings: RolloutSettings,
                  budgets: Sequence[int] | None, row_ids: Sequence[int] | None, hooks: RolloutHooks
                  ) -> tuple[list[rows_lib.Row], np.ndarray]:
  """(a Row per prompt, [prompts] int32 row ids), or a ValueError naming the argument at fault."""
  if any(len(p) == 0 for p in prompts):
    raise ValueError('every prompt needs at least one token (render it with add_generation_prompt=True)')
  budgets = decode.row_budgets(settings.max_new_tokens if budgets is None else budgets, len(prompts))
  if rng.ndim and rng.shape != (len(prompts),):
    raise ValueError(f'rng must be one key or one per prompt ({len(prompts)}), got shape {rng.shape}')
  rows = [rows_lib.Row(prompt=list(p), budget=b) for p, b in zip(prompts, budgets)]
  ids = decode.row_values('row_ids', row_ids, len(rows), np.arange(len(rows), dtype=np.int32))
  if hooks.more is not None and not (settings.decode_chunk and rng.ndim):
    raise ValueError('more needs decode_chunk and one key per prompt')
  return rows, ids


class _Slots:
  """The host loop's state: every row so far, and per decode slot its occupant (the index of the row it holds,
  None: free) and its feed (the tokens it appends before it decodes again)."""

  def __init__(self, decoder: decode.Decoder, params: Any, tokenizer: tokenizer_lib.Tokenizer,
               tool_fn: ToolFn | None, settings: RolloutSettings, rows: list[rows_lib.Row], row_ids: np.ndarray,
               rng: Array):
    self.decoder, self.params, self.tokenizer, self.tool_fn = decoder, params, tokenizer, tool_fn
    self.settings, self.rows, self.row_ids, self.rng = settings, rows, row_ids, rng
    self.waiting = collections.deque(range(len(rows)))   # rows not yet given a slot
    wanted, devices = settings.slots or len(rows), shapes.batch_devices()
    count = shapes.round_up(shapes.power_of_two(min(wanted, len(rows))), devices)
    self.most = shapes.round_up(shapes.power_of_two(max(wanted, len(rows))), devices)   # slots `more` may grow to
    self.width, self.cache = _widths(settings, [len(row.prompt) for row in rows], [row.budget for row in rows])
    self.state = programs.init_state(decoder, batch=count, max_length=self.cache)
    self.stops = shapes.stop_array(tokenizer.stop_ids)
    self.occupant: list[int | None] = [None] * count
    self.feed: list[list[int] | None] = [[] for _ in range(count)]

  def drop_unfollowed(self, hooks: RolloutHooks) -> None:
    """Cancels the rows `hooks.follow` no longer follows and frees their slots."""
    for i in [*(i for i in self.occupant if i is not None), *self.waiting]:
      if not hooks.follow(i, rows_lib.finish(self.rows[i], self.tokenizer)):
        self.rows[i].stop_reason = 'cancelled'
        if hooks.done is not None:
          hooks.done(i, rows_lib.finish(self.rows[i], self.tokenizer))
    self.waiting = collections.deque(i for i in self.waiting if self.rows[i].stop_reason is None)
    for slot, i in enumerate(self.occupant):
      if i is not None and self.rows[i].stop_reason == 'cancelled':
        self.occupant[slot], self.feed[slot] = None, []

  def take_more(self, more: Callable[[int, int], Sequence[MoreRow]]) -> None:
    """Admits the rows `more` gives for the free slots, growing the slots to `most` once they do not fit."""
    held = sum(i is not None for i in self.occupant)
    if (free := self.most - held - len(self.waiting)) <= 0:
      return
    for prompt, budget, key, row_id in more(free, self.cache):
      if not prompt or not 1 <= budget <= self.cache - len(prompt):
        raise ValueError(f'more: a prompt of {len(prompt)} tokens with budget {budget} does not fit the cache '
                         f'of {self.cache}')
      self.rows.append(rows_lib.Row(prompt=list(prompt), budget=int(budget)))
      self.waiting.append(len(self.rows) - 1)
      self.row_ids = np.append(self.row_ids, np.int32(row_id))
      self.rng = jnp.concatenate([self.rng, jnp.asarray(key)[None]])
    count = len(self.occupant)
    if held + len(self.waiting) > count:   # all the slots, the rows kept
      grown = self.most   # straight there: a few programs, whatever the order requests come in
      self.state = programs.grow_state(self.decoder, self.state, np.arange(count, dtype=np.int32), batch=grown,
                                       max_length=self.cache)
      self.occupant += [None] * (grown - count)
      self.feed += [[] for _ in range(grown - count)]

  def fill(self) -> np.ndarray:
    """Gives free slots to waiting rows, their prompts as feed → [slots] bool: the slots just filled."""
    fresh = np.zeros(len(self.occupant), bool)
    for slot in range(len(self.occupant)):
      if self.occupant[slot] is None and self.waiting:
        self.occupant[slot] = self.waiting.popleft()
        self.feed[slot], fresh[slot] = self.rows[self.occupant[slot]].prompt, True
    return fresh

  def generate(self, fresh: np.ndarray, busy: list[int]) -> decode.SampleOutput:
    """One decode call over the slots: each takes in its feed and generates until enough rows have stopped.
    Returns the call's output on the host."""
    count = len(self.occupant)
    continuing = np.array([bool(self.occupant[s] is not None and not fresh[s] and len(self.feed[s]) == 1)
                           for s in range(count)])
    logits, self.state = _admit_feeds(self.decoder, self.params, self.state, self.feed, fresh, continuing,
                                      self.settings)
    per_slot = lambda f: np.array([f(self.rows[i]) if i is not None else 0 for i in self.occupant], np.int32)
    last = np.array([self.feed[s][-1] if continuing[s] else 0 for s in range(count)], np.int32)
    exit_after = max(1, len(busy) // 4) if self.waiting or self.tool_fn is not None else len(busy)
    start = decode.DecodeStart(logits=logits, last=last, continuing=continuing)
    rows = decode.DecodeRows(budgets=per_slot(lambda r: r.budget - len(r.token_ids)),
                             row_ids=np.array([self.row_ids[i] if i is not None else 0 for i in self.occupant],
                                              np.int32),
                             offsets=per_slot(lambda r: len(r.token_ids)))
    keys = self.rng[np.array([i or 0 for i in self.occupant])] if self.rng.ndim else self.rng
    out, self.state = programs.decode_round(self.decoder, self.params, self.state, start, rows, self.stops, keys,
                                            np.int32(exit_after), max_new_tokens=self.width,
                                            settings=self.settings.sampling)
    return distributed.to_host(out)

  def take_turns(self, out: decode.SampleOutput, busy: list[int]) -> None:
    """Records what each busy slot generated, and runs the tools of the rows that stopped at an action."""
    settings = self.settings
    for slot in busy:
      self.feed[slot] = rows_lib.take_turn(self.rows[self.occupant[slot]], out, slot, self.tokenizer, self.tool_fn,
                                           settings.max_tool_turns)
    calling = [slot for slot in busy if self.feed[slot] is None]   # stopped at an action, with a tool to call
    results = distributed.run_owned(lambda i: self.tool_fn(i, self.rows[i].actions[-1]),
                                    [self.occupant[s] for s in calling], len(self.rows))
    for slot, result in zip(calling, results):
      self.feed[slot] = rows_lib.splice(self.rows[self.occupant[slot]], result, self.tokenizer,
                                        settings.max_tool_result_tokens)

  def release(self, busy: list[int], hooks: RolloutHooks) -> None:
    """Frees the slots whose rows ended (`hooks.done` told of each)."""
    for slot in busy:
      if self.rows[self.occupant[slot]].stop_reason is not None:
        if hooks.done is not None:
          hooks.done(self.occupant[slot], rows_lib.finish(self.rows[self.occupant[slot]], self.tokenizer))
        self.occupant[slot], self.feed[slot] = None, []
    if hooks.progress is not None:
      hooks.progress(sum(self.occupant[slot] is None for slot in busy))


def _widths(settings: RolloutSettings, prompt_lengths: list[int], budgets: list[int]) -> tuple[int, int]:
  """(the decode loop's width, the cache length) for a call: bucketed, so that a run reuses a few programs."""
  if settings.decode_chunk:
    longest = max(length + budget for length, budget in zip(prompt_lengths, budgets))
    return settings.decode_chunk, shapes.power_of_two(max(longest, settings.length_multiple))
  width = shapes.bucket(max(budgets), settings.length_multiple)
  return width, shapes.bucket(max(prompt_lengths) + width, settings.length_multiple)


def _admit_feeds(decoder: decode.Decoder, params: Any, state: Any, feed: list[list[int]], fresh: np.ndarray,
                 continuing: np.ndarray, settings: RolloutSettings) -> tuple[Array | None, Any]:
  """Appends the feeds that are more than a continuing row's last token: new prompts (identical ones prefilled
  once) and spliced tool turns → (logits [slots, V] or None where nothing was admitted, state).

  Sizes are bucketed (rows to a power of two, widths to a power of two up to length_multiple, then its
  multiples, or with decode_chunk always a power of two) so that a run reuses a few programs. With the rows
  split over devices, `programs.admit_in_place`, else `programs.admit`."""
  if settings.decode_chunk:
    chunk_width = shapes.power_of_two
  else:
    chunk_width = lambda width: shapes.chunk_width(width, settings.length_multiple)
  chunks, sources, fresh_chunks, targets, picks = _chunks(feed, fresh, continuing)
  if not chunks:
    return None, state
  slots = len(feed)
  if shapes.batch_devices() > 1:
    # Rows split over devices: gathering a few of them (`admit`'s take/put) would make XLA copy the whole
    # cache onto every device, so every slot takes its chunk in place (a shared prompt prefilled per sample).
    width = chunk_width(max(map(len, chunks)))
    tokens, lengths = np.full((slots, width), decode.PAD_ID, np.int32), np.zeros(slots, np.int32)
    for slot, pick in zip(targets, picks):
      tokens[slot, :len(chunks[pick])], lengths[slot] = chunks[pick], len(chunks[pick])
    return programs.admit_in_place(decoder, params, state, tokens, lengths, np.asarray(fresh, bool))
  tokens, lengths = decode.right_pad(chunks)
  rows, width = shapes.power_of_two(len(chunks)), chunk_width(tokens.shape[1])
  tokens = np.pad(tokens, ((0, rows - len(chunks)), (0, width - tokens.shape[1])), constant_values=decode.PAD_ID)
  pad = lambda values, size, fill: np.array(list(values) + [fill] * (size - len(values)), np.int32)
  destinations = shapes.power_of_two(len(targets))
  return programs.admit(decoder, params, state, tokens, pad(lengths, rows, 0), pad(sources, rows, 0),
                        pad(fresh_chunks, rows, 0).astype(bool), pad(targets, destinations, slots),
                        pad(picks, destinations, 0), slots=slots)


def _chunks(feed: list[list[int]], fresh: np.ndarray, continuing: np.ndarray
            ) -> tuple[list[list[int]], list[int], list[bool], list[int], list[int]]:
  """The feeds to admit as distinct chunks → (chunks, the slot each extends, whether it is a fresh prompt, the
  target slots, the chunk each target takes): a prompt fed to several fresh slots is one chunk."""
  chunks, sources, fresh_chunks, targets, picks, shared = [], [], [], [], [], {}
  for slot, tokens in enumerate(feed):
    if not tokens or continuing[slot]:
      continue
    if fresh[slot] and tuple(tokens) in shared:   # another sample of a prompt admitted in this call
      picks.append(shared[tuple(tokens)])
    else:
      if fresh[slot]:
        shared[tuple(tokens)] = len(chunks)
      picks.append(len(chunks))
      chunks.append(tokens)
      sources.append(slot)
      fresh_chunks.append(bool(fresh[slot]))
    targets.append(slot)
  return chunks, sources, fresh_chunks, targets, picks
