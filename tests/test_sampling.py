"""KV cache, sampler and tool rollout loop: each checked against the full forward pass or the chat template."""

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from luckystar import model
from luckystar import sampling
from luckystar import tokenizer as tokenizer_lib
from luckystar.model import sharding

S, F = model.SLIDING, model.FULL
VOCAB = 512
NEW_TOKENS = 16
# A window of 4 with prompts of 2..11 tokens and 16 new tokens: every row crosses the window, some
# prompts are longer than the ring buffer; two scanned groups of (sliding, full).
CONFIG = model.get('tiny', vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                   num_kv_heads=2, sliding_window=4, layer_types=(S, F) * 2)
PROMPT_LENGTHS = (2, 7, 11, 5)

apply = jax.jit(model.apply, static_argnums=0)


@pytest.fixture(scope='module')
def params():
  return model.init(CONFIG, jax.random.key(0))


@pytest.fixture(scope='module')
def prompts():
  rng = np.random.default_rng(0)
  return [rng.integers(1, VOCAB, n).tolist() for n in PROMPT_LENGTHS]


def _greedy(params, prompts, max_new_tokens=NEW_TOKENS, **kwargs):
  return jax.device_get(sampling.sample(CONFIG, params, prompts, rng=jax.random.key(0), max_new_tokens=max_new_tokens,
                                        settings=sampling.SamplingSettings(temperature=0.0), **kwargs))


@pytest.fixture(scope='module')
def greedy(params, prompts):
  return _greedy(params, prompts)


def _teacher_forced_logits(params, prompts, out):
  """Full-forward logits [B, NEW_TOKENS, V] that predicted each generated token (right-padded batch)."""
  sequences = [p + out.tokens[b, :out.lengths[b]].tolist() for b, p in enumerate(prompts)]
  padded = np.zeros((len(sequences), max(map(len, sequences))), np.int32)
  for b, seq in enumerate(sequences):
    padded[b, :len(seq)] = seq
  logits = np.asarray(apply(CONFIG, params, padded))
  return np.stack([logits[b, len(p) - 1:len(p) - 1 + NEW_TOKENS] for b, p in enumerate(prompts)])


def _token_logprobs(logits, tokens):
  log_probs = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
  return np.take_along_axis(np.asarray(log_probs), tokens[..., None], axis=-1)[..., 0]


def test_prefill_and_chunked_decode_equal_the_full_forward(params, prompts):
  """A right-padded prefill, then a chunk of 3 new tokens, give the logits of the unpadded forward pass.
  (Single-token decode steps are checked through the sampler below.)"""
  extra = np.random.default_rng(1).integers(1, VOCAB, (len(prompts), 3))
  tokens, lengths = sampling.right_pad(prompts)
  max_length = tokens.shape[1] + 3
  last, cache = jax.jit(model.prefill, static_argnums=(0, 4))(CONFIG, params, tokens, lengths, max_length)
  chunk, cache = jax.jit(model.decode, static_argnums=0)(CONFIG, params, extra, cache)
  np.testing.assert_array_equal(cache['index'], lengths + 3)
  full = np.zeros((len(prompts), max(PROMPT_LENGTHS) + 3), np.int32)
  for b, p in enumerate(prompts):
    full[b, :len(p) + 3] = p + extra[b].tolist()
  logits = np.asarray(apply(CONFIG, params, full))
  want = np.stack([logits[b, len(p) - 1:len(p) + 3] for b, p in enumerate(prompts)])
  np.testing.assert_allclose(np.concatenate([np.asarray(last)[:, None], chunk], axis=1), want, atol=1e-5)
  sliding, full_layer = cache['layers']['layer_0']['k'], cache['layers']['layer_1']['k']
  assert sliding.shape == (2, len(prompts), CONFIG.num_kv_heads, CONFIG.sliding_window, CONFIG.head_dim)  # ring
  assert full_layer.shape == (2, len(prompts), CONFIG.num_kv_heads, max_length, CONFIG.head_dim)


def test_greedy_equals_argmax_of_the_full_forward(params, prompts, greedy):
  """By causality, one forward pass over prompt + generated tokens gives every step's logits."""
  assert (greedy.lengths == NEW_TOKENS).all() and greedy.overlong.all() and not greedy.finished.any()
  logits = _teacher_forced_logits(params, prompts, greedy)
  np.testing.assert_array_equal(greedy.tokens, logits.argmax(-1))
  np.testing.assert_allclose(greedy.untruncated_logprobs, _token_logprobs(logits, greedy.tokens), atol=1e-5)
  assert (greedy.logprobs == 0).all()  # greedy samples from a point mass


def test_logprobs_equal_teacher_forced_logprobs(params, prompts):
  out = jax.device_get(sampling.sample(CONFIG, params, prompts, rng=jax.random.key(3), max_new_tokens=NEW_TOKENS,
                                       settings=sampling.SamplingSettings(temperature=1.0)))
  logits = _teacher_forced_logits(params, prompts, out)
  want = _token_logprobs(logits, out.tokens)
  np.testing.assert_allclose(out.logprobs, want, atol=1e-5)
  np.testing.assert_allclose(out.untruncated_logprobs, want, atol=1e-5)
  assert want.std() > 0.1, 'log-probs too uniform for a meaningful check'


def test_truncated_sampling_logprobs(params, prompts):
  temperature, top_k, top_p = 0.7, 20, 0.6
  out = jax.device_get(sampling.sample(CONFIG, params, prompts, rng=jax.random.key(4), max_new_tokens=NEW_TOKENS,
                                       settings=sampling.SamplingSettings(temperature, top_k, top_p)))
  scaled = _teacher_forced_logits(params, prompts, out) / temperature
  np.testing.assert_allclose(out.untruncated_logprobs, _token_logprobs(scaled, out.tokens), atol=1e-5)
  # The truncated distribution, rebuilt in numpy: top-k, renormalise, smallest head with mass >= top_p.
  order = np.argsort(-scaled, axis=-1)[..., :top_k]
  head = np.take_along_axis(scaled, order, axis=-1)
  probs = np.exp(head - head.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  kept = (np.cumsum(probs, -1) - probs) < top_p
  renormalised = np.where(kept, probs, 0) / np.where(kept, probs, 0).sum(-1, keepdims=True)
  rank = (order == out.tokens[..., None]).argmax(-1)
  assert np.take_along_axis(kept, rank[..., None], -1).all(), 'sampled a token outside the top-k/top-p set'
  np.testing.assert_allclose(out.logprobs, np.log(np.take_along_axis(renormalised, rank[..., None], -1)[..., 0]),
                             atol=1e-5)
  assert (kept.sum(-1) > 1).any() and (kept.sum(-1) < top_k).any(), 'the nucleus never bit'


def test_top_k_1_equals_greedy(params, prompts, greedy):
  out = jax.device_get(sampling.sample(CONFIG, params, prompts, rng=jax.random.key(5), max_new_tokens=NEW_TOKENS,
                                       settings=sampling.SamplingSettings(temperature=1.3, top_k=1)))
  np.testing.assert_array_equal(out.tokens, greedy.tokens)
  np.testing.assert_allclose(out.logprobs, 0, atol=1e-6)


def test_stop_tokens_and_budgets_stop_rows_independently(params, prompts, greedy):
  stops = [greedy.tokens[0, 3], greedy.tokens[2, 5]]
  budgets = [NEW_TOKENS, NEW_TOKENS, NEW_TOKENS, 6]
  out = _greedy(params, prompts, stop_ids=stops, max_new_tokens=budgets)
  for b in range(len(prompts)):
    hits = np.flatnonzero(np.isin(greedy.tokens[b, :budgets[b]], stops))
    length = hits[0] + 1 if hits.size else budgets[b]
    assert out.lengths[b] == length
    assert out.finished[b] == bool(hits.size) and out.overlong[b] == (not hits.size)
    np.testing.assert_array_equal(out.tokens[b, :length], greedy.tokens[b, :length])
    assert (out.tokens[b, length:] == sampling.PAD_ID).all() and (out.untruncated_logprobs[b, length:] == 0).all()
  assert out.finished[0] and out.lengths[0] <= 4 and out.overlong[3] and out.lengths[3] == 6


def test_a_rows_draws_do_not_depend_on_its_batch(params, prompts):
  """At temperature 1, row r draws the same tokens alone, in another order or beside other rows (row_ids
  carry its global id), and a continuation resumed at an offset draws what the whole one drew there."""
  def draw(batch, **kwargs):
    return jax.device_get(sampling.sample(CONFIG, params, batch, rng=jax.random.key(7), max_new_tokens=NEW_TOKENS,
                                          length_multiple=16, **kwargs))
  whole = draw(prompts)
  assert len({tuple(row) for row in whole.tokens}) == len(prompts)    # rows differ: the draws are per row
  subset = draw([prompts[3], prompts[1]], row_ids=[3, 1])
  np.testing.assert_array_equal(subset.tokens, whole.tokens[[3, 1]])
  np.testing.assert_allclose(subset.logprobs, whole.logprobs[[3, 1]], atol=1e-5)
  assert not np.array_equal(draw([prompts[3], prompts[1]]).tokens, subset.tokens)   # ids 0, 1: other draws
  cut = 5   # resume row 2 after its first `cut` tokens: the rest equals the whole continuation's rest
  resumed = draw([prompts[2] + whole.tokens[2, :cut].tolist()], row_ids=[2], offsets=[cut])
  np.testing.assert_array_equal(resumed.tokens[0, :NEW_TOKENS - cut], whole.tokens[2, cut:])


def test_sharded_sampling_gives_the_same_greedy_tokens():
  """Batch split over a (2, 2, 2) mesh: greedy tokens equal the argmax of the one-device full forward.

  One scanned group here (the other tests use two): its cache has a leading axis of size 1.
  """
  assert jax.device_count() == 8, 'tests/conftest.py sets 8 fake CPU devices'
  config = CONFIG.replace(num_layers=3, layer_types=(S, S, F))
  params = model.init(config, jax.random.key(1))
  mesh = sharding.make_mesh((2, 2, 2))
  rng = np.random.default_rng(2)
  batch = [rng.integers(1, VOCAB, n).tolist() for n in (3, 9, 5, 12, 1, 7, 4, 10)]
  with sharding.activate(mesh):
    out = sampling.sample(config, jax.device_put(params, model.param_shardings(config, mesh)), batch,
                          rng=jax.random.key(0), max_new_tokens=NEW_TOKENS,
                          settings=sampling.SamplingSettings(temperature=0.0))
  assert out.tokens.addressable_shards[0].data.shape[0] == 2  # the batch is split over data x fsdp
  tokens = np.asarray(out.tokens)
  full = np.zeros((len(batch), 12 + NEW_TOKENS), np.int32)
  for b, p in enumerate(batch):
    full[b, :len(p) + NEW_TOKENS] = p + tokens[b].tolist()
  logits = np.asarray(apply(config, params, full))  # one device
  np.testing.assert_array_equal(
      tokens, np.stack([logits[b, len(p) - 1:len(p) - 1 + NEW_TOKENS].argmax(-1) for b, p in enumerate(batch)]))
  cache_shardings = model.cache_shardings(config, mesh)
  empty_cache = jax.eval_shape(lambda: model.init_cache(config, 8, 16))
  assert jax.tree.structure(cache_shardings) == jax.tree.structure(empty_cache)
  assert cache_shardings['layers']['layer_2']['k'].spec == jax.sharding.PartitionSpec(
      None, ('data', 'fsdp'), 'tensor', None, None)  # batch over data x fsdp, kv heads over tensor


# ---- the tool loop, driven by a scripted model ------------------------------------------------

TOKENIZER = tokenizer_lib.default()
SPECIAL = TOKENIZER.special_ids
THINK, END_THINK = SPECIAL['<|START_THINKING|>'], SPECIAL['<|END_THINKING|>']
ACT, END_ACT = SPECIAL['<|START_ACTION|>'], SPECIAL['<|END_ACTION|>']
RESP, END_RESP = SPECIAL['<|START_RESPONSE|>'], SPECIAL['<|END_RESPONSE|>']
EOT = TOKENIZER.end_of_turn_id
enc = TOKENIZER.encode

# Per row (its user message), the assistant's tokens in each turn (the last turn repeats).
SCRIPTS = {
    'a': ([THINK, *enc('look up'), END_THINK, ACT, *enc('{"q": 1}'), END_ACT],
          [RESP, *enc('done'), END_RESP, EOT]),                     # action, tool result, answer
    'b': ([RESP, *enc('hi'), END_RESP, EOT],),                      # answers at once
    'c': ([ACT, *enc('{"final": 1}'), END_ACT],),                   # an action with no tool to run
    'd': ([ACT, *enc('{"again": 1}'), END_ACT],),                   # calls tools forever
    'e': (),                                                        # rambles forever
}
FILLER = enc('x')[0]


@dataclasses.dataclass(frozen=True)
class ScriptedDecoder:
  """A fake LM whose next token follows SCRIPTS, as a pure function of the prefix.

  The row is the token after <|USER|>, the turn is the number of <|TOOL|> tokens, the step is the
  distance from the last <|ASSISTANT|>. Logits are 3 on the scripted token plus a wobble that
  depends on the position and the last token, so log-probs differ from token to token and
  misaligned bookkeeping shows.
  """
  max_turns: int = 2
  max_steps: int = 32
  boost: float = 3.0   # the scripted token's logit over the wobble (11: sampled ≈ 80% of the time at T=1)

  def table(self):
    markers = {enc(row)[0]: kind for kind, row in enumerate(SCRIPTS)}
    table = np.full((len(SCRIPTS), self.max_turns, self.max_steps), FILLER, np.int32)
    for kind, turns in enumerate(SCRIPTS.values()):
      for turn in range(self.max_turns):
        if turns:
          script = turns[min(turn, len(turns) - 1)]
          table[kind, turn, :len(script)] = script
    kind_of = np.zeros(TOKENIZER.vocab_size, np.int32)
    kind_of[list(markers)] = list(markers.values())
    return jnp.asarray(table), jnp.asarray(kind_of)

  def logits(self, buffer, index):
    """buffer [B, L] with columns c < index[b] filled → next-token logits [B, V]."""
    table, kind_of = self.table()
    columns = jnp.arange(buffer.shape[1])
    filled = columns < index[:, None]
    user = jnp.argmax((buffer == SPECIAL['<|USER|>']) & filled, axis=1)
    kind = kind_of[jnp.take_along_axis(buffer, user[:, None] + 1, axis=1)[:, 0]]
    turn = jnp.minimum(jnp.sum((buffer == SPECIAL['<|TOOL|>']) & filled, axis=1), self.max_turns - 1)
    header = jnp.max(jnp.where((buffer == SPECIAL['<|ASSISTANT|>']) & filled, columns, -1), axis=1)
    step = jnp.minimum(index - header - 1, self.max_steps - 1)
    token = table[kind, turn, step]
    last = jnp.take_along_axis(buffer, jnp.maximum(index - 1, 0)[:, None], axis=1)[:, 0]
    hashed = (jnp.arange(TOKENIZER.vocab_size) * 7 + index[:, None] * 13 + last[:, None] * 3) % 17  # exact
    wobble = hashed.astype(jnp.float32) / 32
    return wobble + self.boost * jax.nn.one_hot(token, TOKENIZER.vocab_size)

  def init(self, batch, max_length):
    return jnp.zeros((batch, max_length), jnp.int32), jnp.zeros((batch,), jnp.int32)

  def extend(self, params, tokens, lengths, state):
    buffer, index = state
    offset = jnp.arange(buffer.shape[1]) - index[:, None]
    written = (offset >= 0) & (offset < lengths[:, None])
    chunk = jnp.take_along_axis(tokens.astype(buffer.dtype), jnp.clip(offset, 0, tokens.shape[1] - 1), axis=1)
    state = (jnp.where(written, chunk, buffer), index + lengths)
    return self.logits(*state), state

  def reset(self, state, rows):
    return state[0], jnp.where(rows, 0, state[1])

  def take(self, state, rows):
    return state[0][rows], state[1][rows]

  def put(self, state, rows, sub):
    return tuple(whole.at[rows].set(part, mode='drop') for whole, part in zip(state, sub))


def _prompt(row):
  return TOKENIZER.render([{'role': 'user', 'content': row}], 'concise', add_generation_prompt=True)[0]


LONG_RESULT = 'many rows ' * 20


def _tool(calls):
  def tool_fn(row, action):
    calls.append((row, action))
    return {0: 'result: 42', 2: None}.get(row, LONG_RESULT)
  return tool_fn


@pytest.fixture(scope='module')
def rollouts():
  calls = []
  settings = sampling.RolloutSettings(max_new_tokens=80, max_tool_turns=2, max_tool_result_tokens=6, temperature=0.0,
                                      length_multiple=32)
  out = sampling.rollout(ScriptedDecoder(), None, TOKENIZER, [_prompt(row) for row in SCRIPTS], rng=jax.random.key(0),
                         settings=settings, tool_fn=_tool(calls))
  return out, calls


@pytest.mark.fast
def test_tool_round_trip_layout_equals_the_chat_template():
  ids, _ = TOKENIZER.render([{'role': 'user', 'content': 'q'}, {'role': 'assistant', 'action': '{}'},
                             {'role': 'tool', 'content': 'result: 42'}], 'concise', add_generation_prompt=True)
  closing = TOKENIZER.tool_round_trip(enc('result: 42'))
  assert ids[-len(closing) - 1] == END_ACT and ids[-len(closing):] == closing


@pytest.mark.fast
def test_rollout_equals_the_rendered_conversation(rollouts):
  out, calls = rollouts
  first = out[0]
  ids, mask = TOKENIZER.render([
      {'role': 'user', 'content': 'a'},
      {'role': 'assistant', 'thinking': 'look up', 'action': '{"q": 1}'},
      {'role': 'tool', 'content': 'result: 42'},
      {'role': 'assistant', 'response': 'done'}], 'concise')
  prompt = _prompt('a')
  assert prompt + first.token_ids.tolist() == ids
  # The template trains the END_OF_TURN after an action; in a rollout the loop inserts it (mask 0).
  closing_eot = len(prompt) + first.token_ids.tolist().index(END_ACT) + 1
  mask[closing_eot] = 0
  np.testing.assert_array_equal(first.loss_mask, mask[len(prompt):])
  assert first.actions == ['{"q": 1}'] and first.final_turn.response == 'done' and first.final_turn.ended
  assert first.thinking == 'look up' and first.final_turn.thinking is None  # thought in the turn that called
  assert first.stop_reason == 'end_of_turn' and first.finished and not first.overlong
  assert (0, '{"q": 1}') in calls


@pytest.mark.fast
def test_rollout_rows_finish_independently(rollouts):
  out, calls = rollouts
  assert [r.stop_reason for r in out] == ['end_of_turn', 'end_of_turn', 'action', 'tool_limit', 'overlong']
  assert out[1].final_turn.response == 'hi' and out[1].actions == [] and out[1].loss_mask.all()
  assert out[1].thinking == out[1].final_turn.thinking
  assert out[2].actions == ['{"final": 1}'] and out[2].final_turn.action == '{"final": 1}' and out[2].loss_mask.all()
  assert out[2].token_ids[-1] == END_ACT
  assert out[4].overlong and not out[4].finished and len(out[4].token_ids) == 80 and out[4].loss_mask.all()
  assert sorted(row for row, _ in calls) == [0, 2, 3, 3]  # row 3: max_tool_turns tool calls, then it stops


@pytest.mark.fast
def test_tool_turns_are_masked_truncated_and_limited(rollouts):
  out, _ = rollouts
  looping = out[3]
  assert looping.actions == ['{"again": 1}'] * 3
  truncated = TOKENIZER.tool_round_trip(enc(LONG_RESULT)[:6])
  ids, mask = looping.token_ids.tolist(), looping.loss_mask
  masked = [i for i, m in enumerate(mask) if not m]
  assert len(masked) == 2 * len(truncated)
  assert [ids[i] for i in masked] == truncated * 2
  assert looping.tool_results == [TOKENIZER.decode(enc(LONG_RESULT)[:6])] * 2  # as the model read them
  assert out[0].tool_results == ['result: 42'] and out[1].tool_results == out[2].tool_results == []
  for r in out:
    assert (r.logprobs[r.loss_mask == 0] == 0).all() and (r.untruncated_logprobs[r.loss_mask == 0] == 0).all()


@pytest.mark.fast
def test_rollout_logprobs_align_with_the_tokens(rollouts):
  """Each model token's log-prob equals the scripted model's, recomputed on the unpadded prefix."""
  out, _ = rollouts
  decoder = ScriptedDecoder()
  width = 256

  @jax.jit
  def teacher_forced(buffers, indices):
    one = lambda buffer, index: decoder.logits(buffer[None], index[None])[0]
    return jax.nn.log_softmax(jax.vmap(one)(buffers, indices))

  for row, r in zip(SCRIPTS, out):
    sequence = np.array(_prompt(row) + r.token_ids.tolist())
    starts = np.flatnonzero(r.loss_mask) + len(_prompt(row))   # the columns the model generated
    buffers = np.zeros((len(starts), width), np.int32)
    buffers[:, :len(sequence)] = sequence
    log_probs = np.asarray(teacher_forced(buffers, starts))
    want = log_probs[np.arange(len(starts)), sequence[starts]]
    np.testing.assert_allclose(r.untruncated_logprobs[r.loss_mask == 1], want, atol=1e-5)
    assert (r.logprobs == 0).all()  # greedy
    assert np.ptp(want) > 0.1


@pytest.mark.fast
def test_overlong_when_a_tool_result_leaves_no_room():
  settings = sampling.RolloutSettings(max_new_tokens=20, max_tool_turns=2, max_tool_result_tokens=50, temperature=0.0,
                                      length_multiple=32)
  out = sampling.rollout(ScriptedDecoder(), None, TOKENIZER, [_prompt('d')], rng=jax.random.key(0), settings=settings,
                         tool_fn=_tool([]))[0]
  assert out.overlong and len(out.token_ids) == 20 and out.actions == ['{"again": 1}']


@pytest.mark.fast
def test_agent_tools_run_sql_on_the_rows_database_and_the_calculator_everywhere(tmp_path):
  import sqlite3
  db = tmp_path / 'shop.sqlite'
  with sqlite3.connect(db) as conn:
    conn.execute('CREATE TABLE items (name TEXT, price INT)')
    conn.executemany('INSERT INTO items VALUES (?, ?)', [('pen', 3), ('book', 12)])
  tool_fn = sampling.agent_tools([str(db), None], timeout_s=5.0)
  query = '{"tool_name": "execute_sql", "parameters": {"query": "SELECT name FROM items WHERE price > 5"}}'
  assert tool_fn(0, query) == ['name\nbook\n(1 rows)']
  assert tool_fn(0, query.replace('SELECT', 'DELETE FROM items --'))[0].startswith('ERROR: not allowed')
  assert tool_fn(0, '{"tool_name": "execute_sql", "parameters": {}}')[0].startswith('ERROR: execute_sql needs')
  assert tool_fn(0, '{"tool_name": "math.factorial", "parameters": {"number": 5}}') is None
  assert tool_fn(0, 'not json') is None
  assert tool_fn(1, query) is None   # a row without a database
  calculate = '{"tool_name": "calculator", "parameters": {"expression": "(71 + 85 + 91) / 3"}}'
  assert tool_fn(0, calculate) == tool_fn(1, calculate) == ['247/3']
  assert tool_fn(1, f'[{calculate}, {calculate}]') == ['247/3', '247/3']   # one result a call
  assert tool_fn(1, calculate.replace('(71', "__import__('os').getcwd() + (71"))[0].startswith('ERROR: only numbers')
  assert tool_fn(1, '{"tool_name": "calculator", "parameters": {"expr": "1"}}')[0].startswith('ERROR: calculator needs')
  assert tool_fn(1, f'[{calculate}, {query}]') is None  # SQL has no database on this row: nothing runs


# sha256 of each row's tokens as the previous rollout path drew them (every resuming row prefilled anew
# each round, one batch for all rows), before slots kept their caches across tool turns.
PREVIOUS_PATH_TOKENS = ['82b8abae56faa05a', 'b4c9d0d38777c265', '2158163ff3810c9d', '99b91a585aa8ac55',
                        '80ecc1feb6da338a']


def test_sampled_rollouts_do_not_depend_on_slots_or_which_rows_share_a_round():
  """Across tool turns at temperature 1 (scripts with tool calls, followed ≈ 80% of the time): every row
  rolled out alone (its row id kept), or with fewer slots than rows (slots refilled as rows end), equals
  the same row in the whole batch token for token, and the previous rollout path's tokens."""
  decoder, prompts = ScriptedDecoder(boost=11.0), [_prompt(row) for row in SCRIPTS]
  settings = sampling.RolloutSettings(max_new_tokens=80, max_tool_turns=2, max_tool_result_tokens=6, temperature=1.0,
                                      length_multiple=32)
  options = dict(rng=jax.random.key(1))
  whole = sampling.rollout(decoder, None, TOKENIZER, prompts, settings=settings, tool_fn=_tool([]), **options)
  assert [len(r.actions) for r in whole] == [1, 0, 1, 3, 0]   # tool turns happened, unevenly
  assert [hashlib.sha256(r.token_ids.tobytes()).hexdigest()[:16] for r in whole] == PREVIOUS_PATH_TOKENS
  alone = [sampling.rollout(decoder, None, TOKENIZER, [prompt], settings=settings,
                            tool_fn=lambda _, action, i=i: _tool([])(i, action), row_ids=[i], **options)[0]
           for i, prompt in enumerate(prompts)]
  for slots in (1, 2):
    few = sampling.rollout(decoder, None, TOKENIZER, prompts, settings=dataclasses.replace(settings, slots=slots),
                           tool_fn=_tool([]), **options)
    for got in (alone, few):
      for a, b in zip(got, whole):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)
        assert (a.stop_reason, a.actions) == (b.stop_reason, b.actions)


@dataclasses.dataclass(frozen=True)
class Nudged:
  """The cached model with END_ACTION's logit raised, so that a random model calls tools."""
  inner: sampling.CachedDecoder
  bias: float = 7.0

  def init(self, batch, max_length):
    return self.inner.init(batch, max_length)

  def extend(self, params, tokens, lengths, state):
    logits, state = self.inner.extend(params, tokens, lengths, state)
    return logits.at[:, END_ACT].add(self.bias), state

  def reset(self, state, rows):
    return self.inner.reset(state, rows)

  def take(self, state, rows):
    return self.inner.take(state, rows)

  def put(self, state, rows, sub):
    return self.inner.put(state, rows, sub)


def test_rollouts_keep_their_cache_across_tool_turns_and_slots():
  """A real model whose rows call tools (results of different lengths), 2 samples of each prompt, in 2 slots
  for 8 rows: each row's log-probs equal the full forward pass over its whole conversation (its cache holds
  exactly the prompt, prefilled once for both samples, its turns and the spliced tool turns, wherever its
  slot was refilled), and its tokens equal a run with a slot per row."""
  config = CONFIG.replace(vocab_size=TOKENIZER.vocab_size)
  params = model.init(config, jax.random.key(5))
  decoder = Nudged(sampling.CachedDecoder(config))
  rng = np.random.default_rng(5)
  prompts = [prompt for n in (3, 9, 14, 6) for prompt in [rng.integers(16, 8000, n).tolist()] * 2]
  tool_fn = lambda row, action: 'x ' * (row + 1)
  settings = sampling.RolloutSettings(max_new_tokens=40, max_tool_turns=2, temperature=1.0, length_multiple=16)
  options = dict(rng=jax.random.key(2), tool_fn=tool_fn)
  ended = []
  few = sampling.rollout(decoder, params, TOKENIZER, prompts, settings=dataclasses.replace(settings, slots=2),
                         hooks=sampling.RolloutHooks(progress=ended.append), **options)
  assert sum(ended) == len(prompts) and len(ended) > 2   # reported as rows end
  assert sum(len(r.tool_results) for r in few) >= 4 and len({len(r.token_ids) for r in few}) > 1
  for a, b in zip(few, sampling.rollout(decoder, params, TOKENIZER, prompts, settings=settings, **options)):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
  for prompt, r in zip(prompts, few):
    sequence = np.array(prompt + r.token_ids.tolist())
    logits = np.array(apply(config, params, sequence[None]))[0]
    logits[:, END_ACT] += decoder.bias
    generated = np.flatnonzero(r.loss_mask) + len(prompt)
    want = _token_logprobs(logits[generated - 1], sequence[generated])
    np.testing.assert_allclose(r.untruncated_logprobs[r.loss_mask == 1], want, atol=2e-4)


def test_sharded_rollouts_with_refilled_slots_equal_one_device():
  """Rollouts with tool turns in 4 slots for 8 rows, the batch split over a (2, 2, 2) mesh (slots refilled
  and tool turns appended through the sharded cache): the same tokens as on one device."""
  config = CONFIG.replace(vocab_size=TOKENIZER.vocab_size)
  params = model.init(config, jax.random.key(6))
  decoder = Nudged(sampling.CachedDecoder(config))
  rng = np.random.default_rng(6)
  prompts = [rng.integers(16, 8000, n).tolist() for n in (3, 9, 14, 6, 2, 11, 5, 8)]
  options = dict(rng=jax.random.key(3), tool_fn=lambda row, action: 'y ' * (row % 3 + 1),
                 settings=sampling.RolloutSettings(max_new_tokens=24, max_tool_turns=2, temperature=1.0,
                                                   length_multiple=16, slots=4))
  alone = sampling.rollout(decoder, params, TOKENIZER, prompts, **options)
  mesh = sharding.make_mesh((2, 2, 2))
  with sharding.activate(mesh):
    sharded = sampling.rollout(decoder, jax.device_put(params, model.param_shardings(config, mesh)), TOKENIZER,
                               prompts, **options)
  assert sum(len(r.tool_results) for r in alone) >= 4
  for a, b in zip(sharded, alone):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_allclose(a.untruncated_logprobs, b.untruncated_logprobs, atol=1e-5)
