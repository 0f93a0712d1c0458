"""The KV-cache sampler: sampling settings, token choice and the jitted decode loop (docs/models.md).

The decoder's state holds a fixed number of rows, each a sequence of its own length
(`model.init_cache`: a cursor per row). Appending a right-padded chunk, row b taking
lengths[b] of its tokens, serves every need: a prefill of prompts of different lengths,
a decode step of the rows still running, a tool turn spliced into the rows that called
a tool. `generate` is one jitted `lax.while_loop` of decode steps that ends when every
row has stopped (a stop token or its budget), or once a given number has (so that their
slots can be refilled); rows that stopped keep running in the batch (their outputs are
masked), which keeps the program static. `sample` prefills prompts and generates once.

Randomness is per row: the token a row draws at column c of its continuation (tool turns included) uses
the key fold_in(fold_in(rng, row id), c), row ids being global (`sample`'s and `rollout`'s `row_ids`,
default the row's index). A row's draws therefore never depend on which rows share its batch, on padding,
on how the rounds of the tool loop group rows, or (given global ids) on how many processes sample.

Log-probs come in two flavours per generated token: `logprobs`, of the
distribution actually sampled from (after temperature, top-k and top-p; 0 for
greedy, a point mass), and `untruncated_logprobs`, log softmax(logits / T)
(T = 1 for greedy), which is what RL losses recompute from the policy.
"""

import dataclasses
import functools
import math
from typing import Any, NamedTuple, Protocol, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from luckystar import model as model_lib
from luckystar.model.cohere2 import constrain
from luckystar.sampling import shapes

Array = jax.Array
PAD_ID = 0  # written after a row stops, and used to right-pad chunks (never attended to)


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
        greedy=self.temperature == 0, top_k_width=shapes.power_of_two(self.top_k) if self.top_k else 0,
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


# ---- token choice ------------------------------------------------------------------------------

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


# ---- the decode loop ---------------------------------------------------------------------------

@flax.struct.dataclass
class DecodeStart:
  """Where row b of the decode loop starts: from logits[b] (of its last token in the state) or, where
  continuing[b], by first taking in last[b] (its last sampled token, not yet in the state, whose logits then
  follow). logits None: every busy row continues."""
  logits: Array | None   # [B, V] float32
  last: Array            # [B] int32
  continuing: Array      # [B] bool


@flax.struct.dataclass
class DecodeRows:
  """What the decode loop knows of row b, [B] int32 each."""
  budgets: Array   # the most tokens it may generate (0: none, the row is idle)
  row_ids: Array   # its global id and
  offsets: Array   # the continuation column its first new token takes: what its draws are keyed by


def generate(decoder: Decoder, params: Any, state: Any, start: DecodeStart, rows: DecodeRows, stop_ids: Array,
             rng: Array, exit_after: Array, *, max_new_tokens: int, settings: SamplingSettings
             ) -> tuple[SampleOutput, Any]:
  """The decode loop: rows start as `start` says and draw as `rows` and `settings` say.

  A row whose budget exceeds max_new_tokens is still running when the loop ends after max_new_tokens steps (a
  chunk of a longer decode); stop_ids [S] int32 (-1 never matches). Ends when every row has stopped, or once
  `exit_after` rows have stopped (the caller then has slots to refill). A row's last sampled token is never in
  the returned state (a stopped row's stop token included): whoever continues the row feeds it first.
  """
  logits, state = _take_in_last(decoder, params, state, start)
  batch = logits.shape[0]
  rows = jax.tree.map(lambda values: constrain(values.astype(jnp.int32), ('batch',)), rows)
  idle = rows.budgets <= 0
  record = functools.partial(_record, rows=rows, stop_ids=stop_ids, rng=rng, settings=settings)
  carry = record(_empty_carry(state, batch, max_new_tokens, idle), logits)

  def keep_going(carry):
    stopped = jnp.sum(carry['done'] & ~idle)
    return (carry['step'] < max_new_tokens) & ~jnp.all(carry['done']) & (stopped < exit_after)

  def step(carry):  # only the rows still running take their token in
    logits, state = decoder.extend(params, carry['last'][:, None], (~carry['done']).astype(jnp.int32), carry['state'])
    return record({**carry, 'state': state}, logits)

  carry = jax.lax.while_loop(keep_going, step, carry)
  out = SampleOutput(tokens=carry['tokens'], logprobs=carry['logprobs'], untruncated_logprobs=carry['untruncated'],
                     lengths=carry['lengths'], finished=carry['finished'],
                     overlong=~carry['finished'] & (carry['lengths'] >= rows.budgets) & ~idle)
  return out, carry['state']


def _take_in_last(decoder: Decoder, params: Any, state: Any, start: DecodeStart) -> tuple[Array, Any]:
  """(logits [B, V] each row draws its first token from, state): the continuing rows take their last token in."""
  def take_last(state):
    new, state = decoder.extend(params, start.last[:, None], start.continuing.astype(jnp.int32), state)
    return (new if start.logits is None else jnp.where(start.continuing[:, None], new, start.logits)), state

  if start.logits is None:
    return take_last(state)
  return jax.lax.cond(jnp.any(start.continuing), take_last, lambda state: (start.logits, state), state)


def _empty_carry(state: Any, batch: int, max_new_tokens: int, idle: Array) -> dict[str, Any]:
  """The decode loop's carry before its first token: nothing written, the idle rows already done."""
  zeros = lambda dtype: constrain(jnp.zeros((batch, max_new_tokens), dtype), ('batch', 'length'))
  return {'step': jnp.zeros((), jnp.int32), 'last': jnp.zeros((batch,), jnp.int32), 'state': state,
          'lengths': jnp.zeros((batch,), jnp.int32), 'finished': jnp.zeros((batch,), bool), 'done': idle,
          'tokens': zeros(jnp.int32), 'logprobs': zeros(jnp.float32), 'untruncated': zeros(jnp.float32)}


def _record(carry: dict[str, Any], logits: Array, *, rows: DecodeRows, stop_ids: Array, rng: Array,
            settings: SamplingSettings) -> dict[str, Any]:
  """Samples column `step` from logits and writes it for the rows still running."""
  step = carry['step']
  token, logprob, untruncated = choose_tokens(logits, row_keys(rng, rows.row_ids, rows.offsets + step), settings)
  running = ~carry['done']
  token = jnp.where(running, token, PAD_ID).astype(jnp.int32)
  stopped = running & jnp.isin(token, stop_ids)
  lengths = carry['lengths'] + running
  write = lambda buffer, value: jax.lax.dynamic_update_slice_in_dim(
      buffer, jnp.where(running, value, 0).astype(buffer.dtype)[:, None], step, axis=1)
  return {**carry, 'step': step + 1, 'last': token, 'lengths': lengths,
          'finished': carry['finished'] | stopped, 'done': carry['done'] | stopped | (lengths >= rows.budgets),
          'tokens': write(carry['tokens'], token), 'logprobs': write(carry['logprobs'], logprob),
          'untruncated': write(carry['untruncated'], untruncated)}


# ---- sampling prompts --------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=('decoder', 'max_new_tokens'))
def sample_padded(decoder: Decoder, params: Any, tokens: Array, lengths: Array, rows: DecodeRows, stop_ids: Array,
                  rng: Array, *, max_new_tokens: int, settings: SamplingSettings) -> SampleOutput:
  """The jitted sampler on right-padded prompts: row b's prompt is tokens[b, :lengths[b]]; the rest as
  `generate`, which runs until every row has stopped. Under `sharding.activate(mesh)` the batch axis is
  sharded over the mesh's ('data', 'fsdp') axes."""
  tokens = constrain(tokens.astype(jnp.int32), ('batch', 'length'))
  state = decoder.init(tokens.shape[0], tokens.shape[1] + max_new_tokens)
  logits, state = decoder.extend(params, tokens, constrain(lengths.astype(jnp.int32), ('batch',)), state)
  nothing = jnp.zeros(tokens.shape[:1], jnp.int32)
  return generate(decoder, params, state, DecodeStart(logits, nothing, nothing.astype(bool)), rows, stop_ids, rng,
                  jnp.int32(tokens.shape[0] + 1), max_new_tokens=max_new_tokens, settings=settings)[0]


def right_pad(chunks: Sequence[Sequence[int]], length_multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """Token lists → (tokens [B, T] int32 right-padded with PAD_ID, lengths [B]); T is a positive multiple of
  length_multiple."""
  width = shapes.bucket(max(map(len, chunks), default=0), length_multiple)
  tokens = np.full((len(chunks), width), PAD_ID, np.int32)
  for row, chunk in enumerate(chunks):
    tokens[row, :len(chunk)] = chunk
  return tokens, np.array([len(c) for c in chunks], np.int32)


def row_budgets(max_new_tokens: int | Sequence[int], count: int) -> list[int]:
  """One budget per row: max_new_tokens, one int for all `count` rows or one per row, each at least 1."""
  budgets = [int(max_new_tokens)] * count if np.ndim(max_new_tokens) == 0 else list(map(int, max_new_tokens))
  if len(budgets) != count or min(budgets, default=1) < 1:
    raise ValueError(f'max_new_tokens must be a positive int or one per prompt ({count}), got {max_new_tokens}')
  return budgets


def row_values(name: str, values: Sequence[int] | None, count: int, default: np.ndarray) -> np.ndarray:
  """[count] int32: `values`, one int per prompt (`default` where None), checked."""
  values = default if values is None else np.asarray(list(values), np.int32)
  if values.shape != (count,):
    raise ValueError(f'{name} must hold {count} ints, one per prompt, got shape {values.shape}')
  return values


def sample(model: 'model_lib.ModelConfig | Decoder', params: Any, prompts: Sequence[Sequence[int]], *,
           rng: Array, max_new_tokens: int | Sequence[int], settings: SamplingSettings = SamplingSettings(),
           stop_ids: Sequence[int] = (), length_multiple: int = 1, row_ids: Sequence[int] | None = None,
           offsets: Sequence[int] | None = None) -> SampleOutput:
  """Generates up to max_new_tokens per prompt (token id lists of any lengths).

  model: a ModelConfig (the cached luckystar decoder) or any `Decoder`. max_new_tokens: one budget, or one per
  prompt (the output is as wide as the largest). row_ids: each row's global id (default 0..B-1) and offsets:
  the continuation column each row's first new token takes (default 0), which key its draws (module
  docstring). length_multiple rounds the padded prompt length up, so that calls with
  similar prompts reuse one compiled program. Under `sharding.activate(mesh)` the batch is padded to a
  multiple of the mesh's batch devices (rows with budget 0, dropped from the output), so any number
  of prompts splits over ('data', 'fsdp').
  """
  if not prompts or any(len(p) == 0 for p in prompts):
    raise ValueError('every prompt needs at least one token (render it with add_generation_prompt=True)')
  budgets = np.array(row_budgets(max_new_tokens, len(prompts)), np.int32)
  count = len(prompts)
  padding = -count % shapes.batch_devices()
  tokens, lengths = right_pad([*prompts, *[prompts[0]] * padding], length_multiple)
  pad = lambda values: np.concatenate([values, np.zeros(padding, np.int32)])   # budget 0: they never draw
  row_ids = row_values('row_ids', row_ids, count, np.arange(count, dtype=np.int32))
  offsets = row_values('offsets', offsets, count, np.zeros(count, np.int32))
  rows = DecodeRows(budgets=pad(budgets), row_ids=pad(row_ids), offsets=pad(offsets))
  out = sample_padded(as_decoder(model), params, tokens, lengths, rows, shapes.stop_array(stop_ids), rng,
                      max_new_tokens=int(budgets.max()), settings=settings)
  return out if not padding else jax.tree.map(lambda x: x[:count], out)
