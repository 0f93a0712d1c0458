"""KV-cache sampler and the multi-turn tool rollout loop (docs/models.md, docs/rl.md).

The decoder's state holds a fixed number of rows, each a sequence of its own length
(`model.init_cache`: a cursor per row). Appending a right-padded chunk, row b taking
lengths[b] of its tokens, serves every need: a prefill of prompts of different lengths,
a decode step of the rows still running, a tool turn spliced into the rows that called
a tool. `generate` is one jitted `lax.while_loop` of decode steps that ends when every
row has stopped (a stop token or its budget), or once a given number has (so that their
slots can be refilled); rows that stopped keep running in the batch (their outputs are
masked), which keeps the program static. `sample` prefills prompts and generates once.

`rollout` runs the agent loop on top, with continuous batching over fixed slots: a row
that stops at END_ACTION gets its tool called, and its tool turn is appended to the
cache it already has (`Tokenizer.tool_round_trip`, the layout `Tokenizer.render` gives an
assistant turn with an action followed by a tool turn and another assistant turn); a row
that ends hands its slot to the next waiting prompt.

Randomness is per row: the token a row draws at column c of its continuation (tool turns included) uses
the key fold_in(fold_in(rng, row id), c), row ids being global (`sample`'s and `rollout`'s `row_ids`,
default the row's index). A row's draws therefore never depend on which rows share its batch, on padding,
on how the rounds of the tool loop group rows, or (given global ids) on how many processes sample.

Log-probs come in two flavours per generated token: `logprobs`, of the
distribution actually sampled from (after temperature, top-k and top-p; 0 for
greedy, a point mass), and `untruncated_logprobs`, log softmax(logits / T)
(T = 1 for greedy), which is what RL losses recompute from the policy.
"""

import collections
import dataclasses
import functools
import json
import math
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from luckystar import distributed
from luckystar import model as model_lib
from luckystar import tokenizer as tokenizer_lib
from luckystar.model.cohere2 import constrain
from luckystar.tools import CALCULATOR_TOOL, SQL_TOOL
from luckystar.tools import calculator
from luckystar.tools.calls import parse_calls
from luckystar.tools import sql as sql_tool

Array = jax.Array
PAD_ID = 0  # written after a row stops, and used to right-pad chunks (never attended to)
ToolFn = Callable[[int, str], 'str | Sequence[str] | None']


class SamplingProgram(NamedTuple):
  """What of `SamplingSettings` picks the compiled program: greedy (temperature 0), top_k's width (a power of
  two at least top_k; 0: off) and whether top_p truncates."""
  greedy: bool
  top_k_width: int
  nucleus: bool


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  """temperature 0 = greedy; top_k 0 and top_p 1.0 mean off. Applied in that order, as transformers does.

  A pytree whose leaves are the three values and whose static part is `program`: a jitted sampler traces the
  values, so a new temperature, top_p or top_k (within its power-of-two width) reuses the compiled program,
  and the ops for given values are those the Python constants gave (the same bits).
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not (math.isfinite(self.temperature) and self.temperature >= 0 and self.top_k >= 0 and 0 < self.top_p <= 1):
      raise ValueError(f'bad sampling settings {self}: need a finite temperature >= 0, top_k >= 0, 0 < top_p <= 1')
    object.__setattr__(self, 'program', SamplingProgram(
        greedy=self.temperature == 0, top_k_width=_power_of_two(self.top_k) if self.top_k else 0,
        nucleus=self.top_p < 1.0))


def _unflatten_settings(program: SamplingProgram, values: tuple) -> SamplingSettings:
  settings = object.__new__(SamplingSettings)   # no __post_init__: the values may be tracers
  for name, value in zip(('temperature', 'top_k', 'top_p'), values):
    object.__setattr__(settings, name, value)
  object.__setattr__(settings, 'program', program)
  return settings


jax.tree_util.register_pytree_node(
    SamplingSettings, lambda s: ((s.temperature, s.top_k, s.top_p), s.program), _unflatten_settings)


class Decoder(Protocol):
  """What the sampler needs from a model: a hashable object (it is a static jit argument), whose state
  holds `batch` rows, each a sequence of its own length (`model.init_cache`'s layout).

  init: an empty state of `batch` rows able to hold max_length columns each.
  extend: right-padded tokens [B, T], row b appending tokens[b, :lengths[b]] (0: the row is left as it
    was) → (logits [B, V] of each row's last new token, junk where lengths is 0; state).
  reset: rows [B] bool → the state with those rows emptied (they start new sequences).
  take: rows [R] int → a state of those R rows (copies).
  put: rows [R] int, sub (a state of R rows) → the state with row rows[r] replaced by sub's row r; rows
    out of range are dropped.
  """

  def init(self, batch: int, max_length: int) -> Any:
    ...

  def extend(self, params: Any, tokens: Array, lengths: Array, state: Any) -> tuple[Array, Any]:
    ...

  def reset(self, state: Any, rows: Array) -> Any:
    ...

  def take(self, state: Any, rows: Array) -> Any:
    ...

  def put(self, state: Any, rows: Array, sub: Any) -> Any:
    ...


@dataclasses.dataclass(frozen=True)
class CachedDecoder:
  """The luckystar model with its KV cache (`model.init_cache`, `model.decode`)."""
  config: model_lib.ModelConfig

  def init(self, batch, max_length):
    return model_lib.init_cache(self.config, batch, max_length)

  def extend(self, params, tokens, lengths, state):
    logits, state = model_lib.decode(self.config, params, tokens, state, last_only=True, lengths=lengths)
    return logits[:, 0], state

  def reset(self, state, rows):
    return {**state, 'index': jnp.where(rows, 0, state['index'])}

  def take(self, state, rows):
    return {'index': state['index'][rows], 'layers': jax.tree.map(lambda b: b[:, rows], state['layers'])}

  def put(self, state, rows, sub):
    put = lambda buffer, new: buffer.at[:, rows].set(new, mode='drop')
    return {'index': state['index'].at[rows].set(sub['index'], mode='drop'),
            'layers': jax.tree.map(put, state['layers'], sub['layers'])}


def as_decoder(model: 'model_lib.ModelConfig | Decoder') -> Decoder:
  return CachedDecoder(model) if isinstance(model, model_lib.ModelConfig) else model


@flax.struct.dataclass
class SampleOutput:
  """Per row b: tokens[b, :lengths[b]] were generated (a stop token included); the rest is PAD_ID / 0."""
  tokens: Array                 # [B, N] int32
  logprobs: Array               # [B, N] float32, of the distribution sampled from
  untruncated_logprobs: Array   # [B, N] float32, log softmax(logits / temperature)
  lengths: Array                # [B] int32
  finished: Array               # [B] bool: stopped at a stop token
  overlong: Array               # [B] bool: hit its token budget without a stop token


def truncated_logits(scaled: Array, settings: SamplingSettings) -> Array:
  """scaled [B, V] with everything outside the top-k and then the top-p nucleus set to -inf.

  Ties at a threshold are all kept. The nucleus is the smallest head of the (top-k renormalised)
  distribution whose mass reaches top_p; the most likely token is always kept. top_k and top_p may be
  traced; `settings.program` says which of the two apply.
  """
  if width := settings.program.top_k_width:
    # the k-th largest of the top `width` (>= k) values: the same value the top k alone end with
    head = jax.lax.top_k(scaled, min(width, scaled.shape[-1]))[0]
    kth = jax.lax.dynamic_index_in_dim(head, jnp.minimum(settings.top_k, head.shape[-1]) - 1, axis=-1)
    scaled = jnp.where(scaled >= kth, scaled, -jnp.inf)
  if settings.program.nucleus:
    descending = -jnp.sort(-scaled, axis=-1)
    probs = jax.nn.softmax(descending, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    kept = jnp.sum(mass_before < settings.top_p, axis=-1, keepdims=True)   # >= 1
    threshold = jnp.take_along_axis(descending, kept - 1, axis=-1)
    scaled = jnp.where(scaled >= threshold, scaled, -jnp.inf)
  return scaled


def greedy_tokens(logits: Array) -> Array:
  """argmax over the last axis (the first maximum) as two plain reductions: XLA's CPU argmax, a
  variadic reduce, is several times slower than these two and a visible share of a decode step."""
  top = logits.max(-1, keepdims=True)
  first = jnp.min(jnp.where(logits == top, jnp.arange(logits.shape[-1]), logits.shape[-1]), axis=-1)
  return jnp.minimum(first, logits.shape[-1] - 1)  # NaN logits: some valid id rather than out of range


def chosen_logprobs(logits: Array, tokens: Array) -> Array:
  """log softmax(logits)[tokens] for logits [B, V], tokens [B], without materialising the log-softmax."""
  return jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0] - jax.nn.logsumexp(logits, axis=-1)


def row_keys(rng: Array, row_ids: Array, columns: Array) -> Array:
  """[B] keys: row row_ids[b]'s draw at column columns[b] of its continuation (the module docstring's rule).
  rng: one key, or [B] keys, one per row (rows of several requests, each with its own seed)."""
  draw = lambda key, row, column: jax.random.fold_in(jax.random.fold_in(key, row), column)
  if rng.ndim:
    return jax.vmap(draw)(rng, row_ids, columns)
  return jax.vmap(lambda row, column: draw(rng, row, column))(row_ids, columns)


def choose_tokens(logits: Array, keys: Array, settings: SamplingSettings) -> tuple[Array, Array, Array]:
  """logits [B, V] float32, keys [B] (`row_keys`) → (tokens [B], sampled-distribution log-probs [B],
  untruncated log-probs [B])."""
  if settings.program.greedy:
    tokens = greedy_tokens(logits)
    untruncated = chosen_logprobs(logits, tokens)
    return tokens, jnp.zeros_like(untruncated), untruncated
  # XLA turns a division by a constant into this product; written out, a traced temperature gives the same bits
  scaled = logits * (1 / jnp.asarray(settings.temperature, logits.dtype))
  truncated = truncated_logits(scaled, settings)
  # jax.random.categorical's Gumbel-max, its argmax taken as `greedy_tokens` does (same tokens, faster on CPU)
  noise = jax.vmap(lambda key: jax.random.gumbel(key, truncated.shape[1:], truncated.dtype))(keys)
  tokens = greedy_tokens(truncated + noise)
  untruncated = chosen_logprobs(scaled, tokens)
  if not settings.program.top_k_width and not settings.program.nucleus:   # nothing truncated: one log-softmax
    return tokens, untruncated, untruncated
  return tokens, chosen_logprobs(truncated, tokens), untruncated


def generate(decoder: Decoder, params: Any, state: Any, logits: Array | None, last: Array, continuing: Array,
             budgets: Array, stop_ids: Array, rng: Array, row_ids: Array, offsets: Array, exit_after: Array, *,
             max_new_tokens: int, settings: SamplingSettings) -> tuple[SampleOutput, Any]:
  """The decode loop. Row b starts from logits[b] (of its last token in `state`) or, where continuing[b],
  first takes in last[b] (its last sampled token, not yet in `state`, whose logits then follow); logits
  None: every busy row continues.

  budgets [B] int32, the most tokens row b may generate (0: none, the row is idle); a row whose budget exceeds
  max_new_tokens is still running when the loop ends after max_new_tokens steps (a chunk of a longer decode);
  stop_ids [S] int32 (-1 never matches); row_ids [B] and offsets [B] int32: row b's global id and the
  continuation column its first new token takes (what its draws are keyed by). Ends when every row has
  stopped, or once `exit_after` rows have stopped (the caller then has slots to refill). A row's last
  sampled token is never in the returned state (a stopped row's stop token included): whoever continues
  the row feeds it first.
  """
  def take_last(state):
    new, state = decoder.extend(params, last[:, None], continuing.astype(jnp.int32), state)
    return (new if logits is None else jnp.where(continuing[:, None], new, logits)), state

  if logits is None:
    logits, state = take_last(state)
  else:
    logits, state = jax.lax.cond(jnp.any(continuing), take_last, lambda state: (logits, state), state)
  batch = logits.shape[0]
  budgets = constrain(budgets.astype(jnp.int32), ('batch',))
  row_ids, offsets = (constrain(x.astype(jnp.int32), ('batch',)) for x in (row_ids, offsets))

  def record(carry, logits):
    """Samples column `step` from logits and writes it for the rows still running."""
    step = carry['step']
    token, logprob, untruncated = choose_tokens(logits, row_keys(rng, row_ids, offsets + step), settings)
    running = ~carry['done']
    token = jnp.where(running, token, PAD_ID).astype(jnp.int32)
    stopped = running & jnp.isin(token, stop_ids)
    lengths = carry['lengths'] + running
    write = lambda buffer, value: jax.lax.dynamic_update_slice_in_dim(
        buffer, jnp.where(running, value, 0).astype(buffer.dtype)[:, None], step, axis=1)
    return {**carry, 'step': step + 1, 'last': token, 'lengths': lengths,
            'finished': carry['finished'] | stopped, 'done': carry['done'] | stopped | (lengths >= budgets),
            'tokens': write(carry['tokens'], token), 'logprobs': write(carry['logprobs'], logprob),
            'untruncated': write(carry['untruncated'], untruncated)}

  zeros = lambda dtype: constrain(jnp.zeros((batch, max_new_tokens), dtype), ('batch', 'length'))
  idle = budgets <= 0
  carry = {'step': jnp.zeros((), jnp.int32), 'last': jnp.zeros((batch,), jnp.int32), 'state': state,
           'lengths': jnp.zeros((batch,), jnp.int32), 'finished': jnp.zeros((batch,), bool), 'done': idle,
           'tokens': zeros(jnp.int32), 'logprobs': zeros(jnp.float32), 'untruncated': zeros(jnp.float32)}
  carry = record(carry, logits)

  def keep_going(carry):
    stopped = jnp.sum(carry['done'] & ~idle)
    return (carry['step'] < max_new_tokens) & ~jnp.all(carry['done']) & (stopped < exit_after)

  def step(carry):  # only the rows still running take their token in
    logits, state = decoder.extend(params, carry['last'][:, None], (~carry['done']).astype(jnp.int32), carry['state'])
    return record({**carry, 'state': state}, logits)

  carry = jax.lax.while_loop(keep_going, step, carry)
  out = SampleOutput(tokens=carry['tokens'], logprobs=carry['logprobs'], untruncated_logprobs=carry['untruncated'],
                     lengths=carry['lengths'], finished=carry['finished'],
                     overlong=~carry['finished'] & (carry['lengths'] >= budgets) & ~idle)
  return out, carry['state']


@functools.partial(jax.jit, static_argnames=('decoder', 'max_new_tokens'))
def sample_padded(decoder: Decoder, params: Any, tokens: Array, lengths: Array, budgets: Array, stop_ids: Array,
                  rng: Array, row_ids: Array, offsets: Array, *, max_new_tokens: int,
                  settings: SamplingSettings) -> SampleOutput:
  """The jitted sampler on right-padded prompts: row b's prompt is tokens[b, :lengths[b]]; the rest as
  `generate`, which runs until every row has stopped. Under `sharding.activate(mesh)` the batch axis is
  sharded over the mesh's ('data', 'fsdp') axes."""
  tokens = constrain(tokens.astype(jnp.int32), ('batch', 'length'))
  state = decoder.init(tokens.shape[0], tokens.shape[1] + max_new_tokens)
  logits, state = decoder.extend(params, tokens, constrain(lengths.astype(jnp.int32), ('batch',)), state)
  nothing = jnp.zeros(tokens.shape[:1], jnp.int32)
  return generate(decoder, params, state, logits, nothing, nothing.astype(bool), budgets, stop_ids, rng, row_ids,
                  offsets, jnp.int32(tokens.shape[0] + 1), max_new_tokens=max_new_tokens, settings=settings)[0]


@functools.partial(jax.jit, static_argnames=('decoder', 'batch', 'max_length'))
def _init_state(decoder: Decoder, *, batch: int, max_length: int) -> Any:
  return decoder.init(batch, max_length)


@functools.partial(jax.jit, static_argnames=('decoder', 'batch', 'max_length'))
def _grow(decoder: Decoder, state: Any, rows: Array, *, batch: int, max_length: int) -> Any:
  """A state of `batch` rows whose first len(rows) rows are `state`'s, the rest empty."""
  return decoder.put(decoder.init(batch, max_length), rows, state)


@functools.partial(jax.jit, static_argnames=('decoder', 'slots'), donate_argnames=('state',))
def _admit(decoder: Decoder, params: Any, state: Any, tokens: Array, lengths: Array, sources: Array, fresh: Array,
           targets: Array, picks: Array, *, slots: int) -> tuple[Array, Any]:
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


_generate = jax.jit(generate, static_argnames=('decoder', 'max_new_tokens'), donate_argnames=('state',))


def _round_up(value: int, multiple: int) -> int:
  return -(-value // multiple) * multiple


def _bucket(value: int, multiple: int) -> int:
  """value rounded up to a positive multiple: few distinct shapes, few compiled programs."""
  return max(multiple, _round_up(value, multiple))


def right_pad(chunks: Sequence[Sequence[int]], length_multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """Token lists → (tokens [B, T] int32 right-padded with PAD_ID, lengths [B]); T is a positive multiple of
  length_multiple."""
  width = _bucket(max(map(len, chunks), default=0), length_multiple)
  tokens = np.full((len(chunks), width), PAD_ID, np.int32)
  for row, chunk in enumerate(chunks):
    tokens[row, :len(chunk)] = chunk
  return tokens, np.array([len(c) for c in chunks], np.int32)


def sample(model: 'model_lib.ModelConfig | Decoder', params: Any, prompts: Sequence[Sequence[int]], *,
           rng: Array, max_new_tokens: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           stop_ids: Sequence[int] = (), budgets: Sequence[int] | None = None, length_multiple: int = 1,
           row_ids: Sequence[int] | None = None, offsets: Sequence[int] | None = None) -> SampleOutput:
  """Generates up to max_new_tokens per prompt (token id lists of any lengths).

  model: a ModelConfig (the cached luckystar decoder) or any `Decoder`. budgets: per-row limits
  (default max_new_tokens). row_ids: each row's global id (default 0..B-1) and offsets: the continuation
  column each row's first new token takes (default 0), which key its draws (module docstring).
  length_multiple rounds the padded prompt length up, so that calls with
  similar prompts reuse one compiled program. Under `sharding.activate(mesh)` the batch is padded to a
  multiple of the mesh's batch devices (rows with budget 0, dropped from the output), so any number
  of prompts splits over ('data', 'fsdp').
  """
  if max_new_tokens < 1:
    raise ValueError(f'max_new_tokens must be at least 1, got {max_new_tokens}')
  budgets = np.full(len(prompts), max_new_tokens, np.int32) if budgets is None else np.asarray(budgets, np.int32)
  if budgets.shape != (len(prompts),) or budgets.max(initial=0) > max_new_tokens:
    raise ValueError(f'budgets must be {len(prompts)} ints <= max_new_tokens={max_new_tokens}, got {budgets}')
  if not prompts or any(len(p) == 0 for p in prompts):
    raise ValueError('every prompt needs at least one token (render it with add_generation_prompt=True)')
  rows = len(prompts)
  padding = -rows % _batch_devices()
  tokens, lengths = right_pad([*prompts, *[prompts[0]] * padding], length_multiple)
  budgets = np.concatenate([budgets, np.zeros(padding, np.int32)])

  def per_row(name, values, default):  # then zeros for the padding rows (budget 0: they never draw)
    values = default if values is None else np.asarray(values, np.int32)
    if values.shape != (rows,):
      raise ValueError(f'{name} must hold {rows} ints, one per prompt, got shape {values.shape}')
    return np.concatenate([values, np.zeros(padding, np.int32)])

  row_ids = per_row('row_ids', row_ids, np.arange(rows, dtype=np.int32))
  offsets = per_row('offsets', offsets, np.zeros(rows, np.int32))
  settings = SamplingSettings(float(temperature), int(top_k), float(top_p))
  out = sample_padded(as_decoder(model), params, tokens, lengths, budgets, _stop_array(stop_ids), rng, row_ids, offsets,
                      max_new_tokens=int(max_new_tokens), settings=settings)
  return out if not padding else jax.tree.map(lambda x: x[:rows], out)


def _stop_array(stop_ids: Sequence[int]) -> np.ndarray:
  stops = np.full(_bucket(len(stop_ids), 4), -1, np.int32)  # a few sizes, so stop sets share programs
  stops[:len(stop_ids)] = stop_ids
  return stops


def _batch_devices() -> int:
  """How many ways the active mesh (`sharding.activate`) splits the batch axis; 1 without one."""
  mesh = jax.sharding.get_abstract_mesh()
  return 1 if mesh.empty else math.prod(mesh.shape.get(axis, 1) for axis in ('data', 'fsdp'))


# ---- the multi-turn tool loop ------------------------------------------------------------------


@dataclasses.dataclass
class Rollout:
  """One row's continuation after its prompt, all arrays aligned with token_ids.

  loss_mask is 1 on model-generated tokens and 0 on the spliced tool round trips; both log-prob
  arrays are 0 where the mask is 0. stop_reason: 'end_of_turn' (the assistant closed its turn),
  'action' (stopped at END_ACTION and tool_fn returned None: the action is the answer),
  'tool_limit' (an action after max_tool_turns tool calls; the tool was not run), 'overlong'
  (the budget ran out first) or 'cancelled' (`rollout`'s follow dropped it). finished = stop_reason != 'overlong'. thinking: the thinking sections
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
class _Row:
  prompt: list[int]
  budget: int             # the most tokens of its continuation, tool turns included
  ids: list[int] = dataclasses.field(default_factory=list)
  mask: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  untruncated: list[float] = dataclasses.field(default_factory=list)
  actions: list[str] = dataclasses.field(default_factory=list)
  thinking: list[str] = dataclasses.field(default_factory=list)   # of the turns before the current one
  tool_results: list[str] = dataclasses.field(default_factory=list)
  turn_start: int = 0     # where the current assistant turn starts in ids
  calling_thinking: str | None = None   # the thinking of the turn whose tool is being called
  calling_ids: tuple[str, ...] = ()     # the ids that turn's action gave its calls (a numbered-calls format)
  stop_reason: str | None = None


def rollout(model: 'model_lib.ModelConfig | Decoder', params: Any, tokenizer: tokenizer_lib.Tokenizer,
            prompts: Sequence[Sequence[int]], *, rng: Array, max_new_tokens: int | Sequence[int],
            tool_fn: ToolFn | None = None,
            max_tool_turns: int = 4, max_tool_result_tokens: int = 512, temperature: float = 1.0, top_k: int = 0,
            top_p: float = 1.0, length_multiple: int = 64, row_ids: Sequence[int] | None = None,
            slots: int | None = None, progress: Callable[[int], Any] | None = None, decode_chunk: int | None = None,
            check: Callable[[], Any] | None = None, follow: Callable[[int, 'Rollout'], bool] | None = None,
            more: Callable[[int, int], Sequence[tuple[Sequence[int], int, Array, int]]] | None = None,
            done: Callable[[int, 'Rollout'], Any] | None = None) -> list[Rollout]:
  """Generates each prompt's continuation, running tools between turns.

  prompts: rendered with add_generation_prompt=True. A row that stops at END_ACTION gets
  `tool_fn(row_index, action_text)`: the tool results (one string, or one per call), spliced in as
  `Tokenizer.tool_round_trip` (each cut to max_tool_result_tokens tokens) before generation resumes; None, or
  no tool_fn, ends
  the row. max_new_tokens bounds the whole continuation, spliced tool turns included, so a
  sequence never exceeds prompt + max_new_tokens.

  Continuous batching: the rows run in `slots` decode slots (default one per row; rounded up to a power
  of two), each with its own KV cache. A row keeps its slot across its tool turns, so resuming appends
  only its spliced tool turn (tools run on the host between decode calls: a slot waiting on one costs no
  decode work); a row that ends hands its slot to the next waiting prompt. The decode loop
  returns to the host once a quarter of the busy slots have stopped (to run their tools or refill them)
  or, with nothing to refill and no tools, once all have. Shapes are fixed for the call (slots, cache of
  the longest prompt + max_new_tokens rounded up to length_multiple; appended chunks a power of two up
  to length_multiple, then its multiples), so a run reuses a few compiled programs.
  row_ids: each prompt's global id (default its index), which with its continuation column keys its draws:
  a row samples the same tokens whatever slot, batch or round it runs in. progress: called with the number
  of rows that ended, each time some have (a progress bar's update).

  decode_chunk (a server): the decode loop returns to the host every decode_chunk tokens, and the cache and
  appended chunks are powers of two long, so that any budget and prompt length reuse one of a few programs;
  the tokens are the same draws. check: called before each decode call; an exception it raises ends the
  rollout (a server's client that hung up). follow (a server's streamed replies and per-row hang-ups): called
  before each decode call as follow(row_index, the row's Rollout so far) for every row not yet ended; False
  drops the row (its slot goes to the next prompt; its Rollout ends with stop_reason 'cancelled').

  max_new_tokens: one budget, or one per prompt. rng: one key, or one key per prompt (each row's draws keyed
  by its own key and row id: rows of several seeded requests sampled together, each as it would be alone).

  more and done (a server's continuous batching; need decode_chunk and one key per prompt): before a decode
  call with slots free that no waiting prompt takes, more(free slots, cache length) gives prompts to admit into them,
  each (prompt, budget, key, row id), prompt + budget at most the cache length; they are rows len(prompts),
  len(prompts) + 1, ... of the result; once they outnumber the slots, the slots grow to `slots` (rows kept).
  done(row_index, its Rollout) is called as each row ends, so its caller need not wait for the rest.

  Several processes (params sharded over all of them): each calls this with the same prompts and runs the
  same host loop, so all make the same admissions and exits and call the same programs; the decode outputs
  are gathered to every process, and `tool_fn(i, ...)` runs only on row i's owner (`distributed.run_owned`),
  which shares its result. A tool result must therefore be picklable (a string or None).
  """
  if not prompts:
    return []
  if any(len(p) == 0 for p in prompts):
    raise ValueError('every prompt needs at least one token (render it with add_generation_prompt=True)')
  decoder = as_decoder(model)
  settings = SamplingSettings(float(temperature), int(top_k), float(top_p))
  budgets = ([int(max_new_tokens)] * len(prompts) if np.ndim(max_new_tokens) == 0 else list(map(int, max_new_tokens)))
  if len(budgets) != len(prompts) or min(budgets) < 1:
    raise ValueError(f'max_new_tokens must be a positive int or one per prompt ({len(prompts)}), got {max_new_tokens}')
  max_new_tokens = max(budgets)
  if rng.ndim and rng.shape != (len(prompts),):
    raise ValueError(f'rng must be one key or one per prompt ({len(prompts)}), got shape {rng.shape}')
  rows = [_Row(prompt=list(p), budget=b) for p, b in zip(prompts, budgets)]
  ids = np.arange(len(rows), dtype=np.int32) if row_ids is None else np.asarray(list(row_ids), np.int32)
  if ids.shape != (len(rows),):
    raise ValueError(f'row_ids must hold {len(rows)} ints, one per prompt, got shape {ids.shape}')
  if more is not None and not (decode_chunk and rng.ndim):
    raise ValueError('more needs decode_chunk and one key per prompt')
  count = _round_up(_power_of_two(min(slots or len(rows), len(rows))), _batch_devices())
  most = _round_up(_power_of_two(max(slots or len(rows), len(rows))), _batch_devices())   # slots more may grow to
  if decode_chunk:
    width = decode_chunk
    cache = _power_of_two(max(max(len(p) + b for p, b in zip(prompts, budgets)), length_multiple))
  else:
    width = _bucket(max_new_tokens, length_multiple)
    cache = _bucket(max(map(len, prompts)) + width, length_multiple)
  state = _init_state(decoder, batch=count, max_length=cache)
  stops = _stop_array(tokenizer.stop_ids)
  occupant: list[int | None] = [None] * count   # the row each slot runs
  feed: list[list[int]] = [[] for _ in range(count)]   # what a slot appends before it decodes again
  pending = collections.deque(range(len(rows)))
  while True:
    if follow is not None:
      for i in [*(i for i in occupant if i is not None), *pending]:
        if not follow(i, _finish(rows[i], tokenizer)):
          rows[i].stop_reason = 'cancelled'
          if done is not None:
            done(i, _finish(rows[i], tokenizer))
      pending = collections.deque(i for i in pending if rows[i].stop_reason is None)
      for slot in range(count):
        if occupant[slot] is not None and rows[occupant[slot]].stop_reason == 'cancelled':
          occupant[slot], feed[slot] = None, []
    if more is not None and (free := most - sum(i is not None for i in occupant) - len(pending)) > 0:
      for prompt, budget, key, row_id in more(free, cache):
        if not prompt or not 1 <= budget <= cache - len(prompt):
          raise ValueError(f'more: a prompt of {len(prompt)} tokens with budget {budget} does not fit the cache '
                           f'of {cache}')
        rows.append(_Row(prompt=list(prompt), budget=int(budget)))
        pending.append(len(rows) - 1)
        ids, rng = np.append(ids, np.int32(row_id)), jnp.concatenate([rng, jnp.asarray(key)[None]])
      if sum(i is not None for i in occupant) + len(pending) > count:   # all the slots, the rows kept
        grown = most   # straight there: a few programs, whatever the order requests come in
        state = _grow(decoder, state, np.arange(count, dtype=np.int32), batch=grown, max_length=cache)
        occupant, feed, count = occupant + [None] * (grown - count), feed + [[] for _ in range(grown - count)], grown
    fresh = np.zeros(count, bool)
    for slot in range(count):
      if occupant[slot] is None and pending:
        occupant[slot] = pending.popleft()
        feed[slot], fresh[slot] = rows[occupant[slot]].prompt, True
    busy = [slot for slot in range(count) if occupant[slot] is not None]
    if not busy:
      break
    if check is not None:
      check()
    continuing = np.array([bool(occupant[s] is not None and not fresh[s] and len(feed[s]) == 1)
                           for s in range(count)])
    logits = _admit_chunks(decoder, params, state, feed, fresh, continuing, length_multiple, bool(decode_chunk))
    if logits is not None:
      logits, state = logits
    per_slot = lambda f: np.array([f(rows[occupant[s]]) if occupant[s] is not None else 0 for s in range(count)],
                                  np.int32)
    last = np.array([feed[s][-1] if continuing[s] else 0 for s in range(count)], np.int32)
    exit_after = max(1, len(busy) // 4) if pending or tool_fn is not None else len(busy)
    out, state = _generate(decoder, params, state, logits, last, continuing,
                           per_slot(lambda r: r.budget - len(r.ids)), stops,
                           rng[np.array([i or 0 for i in occupant])] if rng.ndim else rng,
                           np.array([ids[i] if i is not None else 0 for i in occupant], np.int32),
                           per_slot(lambda r: len(r.ids)), np.int32(exit_after), max_new_tokens=width,
                           settings=settings)
    out = distributed.to_host(out)
    for slot in busy:
      feed[slot] = _take_turn(rows[occupant[slot]], out, slot, tokenizer, tool_fn, max_tool_turns)
    calling = [slot for slot in busy if feed[slot] is None]   # stopped at an action, with a tool to call
    results = distributed.run_owned(lambda i: tool_fn(i, rows[i].actions[-1]), [occupant[s] for s in calling],
                                    len(rows))
    for slot, result in zip(calling, results):
      feed[slot] = _splice(rows[occupant[slot]], result, tokenizer, max_tool_result_tokens)
    for slot in busy:
      if rows[occupant[slot]].stop_reason is not None:
        if done is not None:
          done(occupant[slot], _finish(rows[occupant[slot]], tokenizer))
        occupant[slot], feed[slot] = None, []
    if progress is not None:
      progress(sum(occupant[slot] is None for slot in busy))
  return [_finish(r, tokenizer) for r in rows]


def _admit_chunks(decoder: Decoder, params: Any, state: Any, feed: list[list[int]], fresh: np.ndarray,
                  continuing: np.ndarray, length_multiple: int, powers_of_two: bool = False
                  ) -> tuple[Array, Any] | None:
  """Runs `_admit` on the slots whose feed is more than a continuing row's last token: new prompts (identical
  ones prefilled once) and spliced tool turns. Sizes are bucketed (rows to a power of two, widths to a power
  of two up to length_multiple, then its multiples, or always a power of two) so that a run reuses a few
  programs. With the rows split over devices, `_admit_in_place` instead. None: nothing to admit."""
  chunk_width = _power_of_two if powers_of_two else lambda width: _chunk_width(width, length_multiple)
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
  if not chunks:
    return None
  slots = len(feed)
  if _batch_devices() > 1:
    # Rows split over devices: gathering a few of them (`_admit`'s take/put) would make XLA copy the whole
    # cache onto every device, so every slot takes its chunk in place (a shared prompt prefilled per sample).
    width = chunk_width(max(map(len, chunks)))
    tokens, lengths = np.full((slots, width), PAD_ID, np.int32), np.zeros(slots, np.int32)
    for slot, pick in zip(targets, picks):
      tokens[slot, :len(chunks[pick])], lengths[slot] = chunks[pick], len(chunks[pick])
    return _admit_in_place(decoder, params, state, tokens, lengths, np.asarray(fresh, bool))
  tokens, lengths = right_pad(chunks)
  rows, width = _power_of_two(len(chunks)), chunk_width(tokens.shape[1])
  tokens = np.pad(tokens, ((0, rows - len(chunks)), (0, width - tokens.shape[1])), constant_values=PAD_ID)
  pad = lambda values, size, fill: np.array(list(values) + [fill] * (size - len(values)), np.int32)
  destinations = _power_of_two(len(targets))
  return _admit(decoder, params, state, tokens, pad(lengths, rows, 0), pad(sources, rows, 0),
                pad(fresh_chunks, rows, 0).astype(bool), pad(targets, destinations, slots),
                pad(picks, destinations, 0), slots=slots)


@functools.partial(jax.jit, static_argnames=('decoder',), donate_argnames=('state',))
def _admit_in_place(decoder: Decoder, params: Any, state: Any, tokens: Array, lengths: Array, fresh: Array
                    ) -> tuple[Array, Any]:
  """`_admit` through the whole batch: slot b appends tokens[b, :lengths[b]] (emptied first where fresh[b]),
  the others are left as they were. Returns (logits [slots, V], zero where nothing landed; state)."""
  tokens = constrain(tokens.astype(jnp.int32), ('batch', 'length'))
  logits, state = decoder.extend(params, tokens, lengths, decoder.reset(state, fresh))
  return jnp.where((lengths > 0)[:, None], logits, 0), state


def _chunk_width(width: int, length_multiple: int) -> int:
  """An appended chunk's bucketed width: a power of two up to length_multiple, then its multiples."""
  return _bucket(width, length_multiple) if width > length_multiple else _power_of_two(width)


def _power_of_two(value: int) -> int:
  return 1 << (max(value, 1) - 1).bit_length()


def _take_turn(row: _Row, out: SampleOutput, slot: int, tokenizer: tokenizer_lib.Tokenizer, tool_fn: ToolFn | None,
               max_tool_turns: int) -> list[int] | None:
  """Appends what slot `slot` generated for `row`; returns the tokens its slot appends before it decodes again
  (its last token), None when the row stopped at an action whose tool is to be called (`_splice`), or sets
  row.stop_reason when the row is done."""
  length = int(out.lengths[slot])
  row.ids += out.tokens[slot, :length].tolist()
  row.mask += [1] * length
  row.logprobs += out.logprobs[slot, :length].tolist()
  row.untruncated += out.untruncated_logprobs[slot, :length].tolist()
  if out.overlong[slot]:
    row.stop_reason = 'overlong'
    return []
  if not out.finished[slot]:   # the loop returned while it ran: it goes on from its last token
    return row.ids[-1:]
  if row.ids[-1] == tokenizer.end_of_turn_id:
    row.stop_reason = 'end_of_turn'
    return []
  turn = tokenizer.parse_assistant(row.ids[row.turn_start:])   # stopped at END_ACTION
  row.actions.append(turn.action or '')
  row.calling_thinking, row.calling_ids = turn.thinking, turn.call_ids
  if len(row.tool_results) == max_tool_turns:
    row.stop_reason = 'tool_limit'
    return []
  if tool_fn is None:
    row.stop_reason = 'action'
    return []
  return None


def _splice(row: _Row, result: str | Sequence[str] | None, tokenizer: tokenizer_lib.Tokenizer,
            max_tool_result_tokens: int) -> list[int]:
  """Splices the tool `result` of the row's last action in (None: there was no tool to run, the row ends);
  returns the tokens its slot appends before it decodes again (its last token, then the tool turn)."""
  if result is None:
    row.stop_reason = 'action'
    return []
  row.thinking += [row.calling_thinking] if row.calling_thinking is not None else []
  body, text = tokenizer.tool_result_ids(result, max_tool_result_tokens, row.calling_ids)
  row.tool_results.append(text)
  splice = tokenizer.tool_round_trip(body)
  if len(row.ids) + len(splice) >= row.budget:  # no room left to answer
    splice = splice[:row.budget - len(row.ids)]
    row.stop_reason = 'overlong'
  row.ids += splice
  row.mask += [0] * len(splice)
  row.logprobs += [0.0] * len(splice)
  row.untruncated += [0.0] * len(splice)
  row.turn_start = len(row.ids)
  return row.ids[-len(splice) - 1:]


def _finish(row: _Row, tokenizer: tokenizer_lib.Tokenizer) -> Rollout:
  final_turn = tokenizer.parse_assistant(row.ids[row.turn_start:])
  thinking = row.thinking + ([final_turn.thinking] if final_turn.thinking is not None else [])
  return Rollout(
      token_ids=np.array(row.ids, np.int32), loss_mask=np.array(row.mask, np.int32),
      logprobs=np.array(row.logprobs, np.float32), untruncated_logprobs=np.array(row.untruncated, np.float32),
      actions=row.actions, final_turn=final_turn, stop_reason=row.stop_reason or 'overlong',
      thinking='\n'.join(thinking) if thinking else None, tool_results=row.tool_results)


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


_TOOL_PARAMETER = {SQL_TOOL: 'query', CALCULATOR_TOOL: 'expression'}


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
