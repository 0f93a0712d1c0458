"""`luckystar.serve` against hostile requests (issue 54): each class of attack gets a 400 (413 for a body past the
size limit) whose message names the field or the limit, new sampling values reuse compiled programs, `/health`
answers behind a full queue, and a request whose client hung up is skipped or stopped.

The queue and disconnect tests drive the ASGI app directly (`asgi_call`): a test client cannot hang up early."""

import asyncio
import dataclasses
import json
import threading

from fastapi.testclient import TestClient
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import luckystar
from luckystar import sampling
from luckystar import serve
from luckystar.engine import loading

CONTEXT = 2048   # tiny-sft's
HANG_GUARD_S = 30   # a broken server never answers; this only ends the test, it measures nothing


@pytest.fixture(scope='module')
def model():
  return luckystar.load('tiny-sft')


@pytest.fixture(scope='module')
def client(model):
  return TestClient(serve.build_app(model, 'tiny-sft'), raise_server_exceptions=False)


def user(text):
  return {'role': 'user', 'content': text}


def post_raw(client, body: bytes, **kwargs):
  return client.post('/v1/chat/completions', content=body, headers={'Content-Type': 'application/json'}, **kwargs)


def assert_error(response, status, *parts):
  assert response.status_code == status, response.text[:500]
  message = response.json()['error']['message']
  for part in parts:
    assert part in message, message[:500]
  return message


# ---- nested JSON ----------------------------------------------------------------------------------

def nested(depth, open_='[', close=']', inner='1'):
  return open_ * depth + inner + close * depth


NESTED = {  # body → what the 400 names
    'messages 100k deep': (b'{"messages": ' + nested(100_000).encode() + b'}', 'nested 100001 levels deep'),
    'top level 50k deep': (nested(50_000).encode(), 'nested 50000 levels deep'),
    'objects in chat_template_kwargs': (
        b'{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": '
        + nested(20_000, '{"a": ', '}').encode() + b'}', 'at most 64'),
    'just past the limit': (b'{"messages": [{"role": "user", "content": "hi"}], "x": '
                            + nested(64).encode() + b'}', 'nested 65 levels deep (at most 64)'),
    'content parts 2k deep': (b'{"messages": [{"role": "user", "content": ' + nested(2_000).encode() + b'}]}',
                              'at most 64'),
    'tool arguments 100k deep': (json.dumps({'messages': [user('hi'), {'role': 'assistant', 'tool_calls': [
        {'id': 'c', 'type': 'function', 'function': {'name': 'calculator', 'arguments': nested(100_000)}}]},
        {'role': 'tool', 'content': '1'}]}).encode(), 'messages[1].tool_calls[0].function.arguments: JSON nested'),
    'NaN temperature': (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
                        'NaN is not a JSON number'),
}


@pytest.mark.fast
@pytest.mark.parametrize('body, names', NESTED.values(), ids=NESTED)
def test_nested_json_is_a_400_naming_the_depth(client, body, names):
  assert_error(post_raw(client, body), 400, names)


# ---- text that is not valid Unicode ----------------------------------------------------------------

def with_surrogate(body: dict, text: str = 'bad \ud800 text') -> bytes:
  """The JSON text of body with a lone surrogate where it says LONE (json.dumps writes it as \\ud800)."""
  return json.dumps(body).replace('LONE', json.dumps(text)[1:-1]).encode()


ASSISTANT_CALL = {'role': 'assistant', 'tool_calls': [{'id': 'c', 'type': 'function', 'function': {
    'name': 'LONE', 'arguments': '{"expression": "1 + 1"}'}}]}
UNENCODABLE = {  # body with LONE → the field the 400 names
    'user content': ({'messages': [{'role': 'system', 'content': 'Be brief.'}, user('LONE')]}, 'messages[1].content'),
    'system': ({'messages': [{'role': 'system', 'content': 'LONE'}, user('hi')]}, 'messages[0].content'),
    'model name': ({'model': 'LONE', 'messages': [user('hi')]}, 'model:'),
    'tool name': ({'messages': [user('hi'), ASSISTANT_CALL, {'role': 'tool', 'content': '2'}]},
                  'messages[1].tool_calls[0].function.name'),
    'guided choice': ({'messages': [user('hi')], 'guided_choice': ['YES', 'LONE']}, 'guided_choice[1]'),
    'structured choice': ({'messages': [user('hi')], 'structured_outputs': {'choice': ['LONE']}},
                          'structured_outputs.choice[0]'),
    'content part': ({'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'LONE'}]}]},
                     'messages[0].content[0].text'),
    'reasoning content': ({'messages': [user('hi'), {'role': 'assistant', 'content': 'ok',
                                                     'reasoning_content': 'LONE'}, user('and?')]},
                          'messages[1].reasoning_content'),
    'an ignored field': ({'messages': [user('hi')], 'user': 'LONE'}, 'user:'),
}


@pytest.mark.fast
@pytest.mark.parametrize('body, field', UNENCODABLE.values(), ids=UNENCODABLE)
def test_unencodable_text_is_a_400_naming_the_field(client, body, field):
  assert_error(post_raw(client, with_surrogate(body)), 400, field, 'not valid Unicode')


@pytest.mark.fast
def test_unencodable_tool_arguments_and_keys_are_400s(client):
  call = {'id': 'c', 'type': 'function', 'function': {'name': 'calculator', 'arguments': '{"expression": "LONE"}'}}
  body = {'messages': [user('hi'), {'role': 'assistant', 'tool_calls': [call]}, {'role': 'tool', 'content': '2'}]}
  # the arguments are JSON text holding an escaped surrogate: valid text, whose JSON is not
  arguments = json.dumps(body).replace('LONE', '\\\\ud800').encode()
  assert_error(post_raw(client, arguments), 400, 'messages[1].tool_calls[0].function.arguments', 'lone surrogate')
  key = json.dumps({'messages': [{'role': 'user', 'content': 'hi', 'LONE': 1}]}).replace('LONE', '\\ud800')
  assert_error(post_raw(client, key.encode()), 400, 'messages[0] (a key)', 'not valid Unicode')


# ---- requests that would exhaust memory or time -----------------------------------------------------

def words(tokens):
  """Text of about `tokens` tokens for tiny-sft's tokenizer ('word ' is two)."""
  return 'word ' * (tokens // 2)


def chat(*messages, **fields) -> bytes:
  return json.dumps({'messages': list(messages), **fields}).encode()


HI = user('hi')
MEMORY = {  # the body (built when the test runs) → status, what the message names
    'a 200,000-character choice': (lambda: chat(user('Is it?'), guided_choice=['YES', 'x' * 200_000]), 400,
                                   ['guided_choice[1]', f'maximum context length is {CONTEXT}']),
    'a choice longer than the context': (lambda: chat(user('Is it?'), structured_outputs={
        'choice': [words(CONTEXT)]}), 400, ['structured_outputs.choice[0]', f'{CONTEXT} tokens']),
    'prompt + choice past the context': (lambda: chat(user(words(1200)), guided_choice=['NO', words(1000)]), 400,
                                         ['guided_choice[1]', f'{CONTEXT} tokens']),
    '2,000 choices': (lambda: chat(user('Pick one.'), guided_choice=[f'c{i}' for i in range(2000)]), 400,
                      ['guided_choice: 2000 choices', f'the {serve.MAX_CHOICES}']),
    'one choice past the limit': (lambda: chat(user('Pick one.'), guided_choice=[
        f'c{i}' for i in range(serve.MAX_CHOICES + 1)]), 400, ['guided_choice', f'the {serve.MAX_CHOICES}']),
    'a 5 MB prompt': (lambda: chat(user('word ' * 1_000_000)), 413, ['4,194,304 bytes', '--max_request_bytes']),
    '300,000 messages': (lambda: chat(*[HI] * 300_000), 413, ['4,194,304 bytes']),
    'a prompt past the context with a choice': (lambda: chat(user(words(2100)), guided_choice=['A']), 400,
                                                ['messages:', f'maximum context length is {CONTEXT}']),
    'max_tokens of a million': (lambda: chat(HI, max_tokens=10**6), 400,
                                ['max_tokens:', f'maximum context length is {CONTEXT}']),
    'max_completion_tokens of 2**62': (lambda: chat(HI, max_completion_tokens=2**62), 400,
                                       ['max_completion_tokens:', f'maximum context length is {CONTEXT}']),
    'max_tokens of 5,000 digits': (lambda: chat(HI, max_tokens=0).replace(b'0}', b'9' * 5000 + b'}'), 400,
                                   ['max_tokens']),
    'temperature 1e400 (inf)': (lambda: chat(HI, temperature=0).replace(b'0}', b'1e400}'), 400,
                                ['1e400', 'not a finite number']),
}


@pytest.mark.parametrize('body, status, names', MEMORY.values(), ids=MEMORY)
def test_requests_past_a_limit_are_refused_naming_it(client, body, status, names):
  assert_error(post_raw(client, body()), status, *names)


@pytest.mark.fast
def test_a_chunked_body_past_the_limit_is_refused(model):
  """No Content-Length: the limit holds while the body streams in."""
  small = TestClient(serve.build_app(model, 'tiny-sft', max_request_bytes=1000))
  pieces = (piece for piece in [b'{"messages": [{"role": "user", "content": "', b'x' * 600, b'y' * 600, b'"}]}'])
  assert_error(post_raw(small, pieces), 413, 'larger than 1,000 bytes')
  assert post_raw(small, json.dumps({'messages': [user('hi')], 'max_tokens': 1}).encode()).status_code == 200


def test_many_long_choices_are_scored_in_bounded_passes(model):
  """reply_logprobs splits its rows so a pass holds at most _SCORED_LOGITS logits, with the same scores."""
  messages = [user('Which one?')]
  choices = [words(300 + 10 * i) for i in range(12)]   # with the prompt, padded to 512 tokens
  whole = model.reply_logprobs(messages, choices, 'concise')
  old = loading._SCORED_LOGITS
  loading._SCORED_LOGITS = 4 * 512 * model.config.vocab_size   # 4-row passes instead of one of 16 rows
  try:
    split = model.reply_logprobs(messages, choices, 'concise')
  finally:
    loading._SCORED_LOGITS = old
  np.testing.assert_allclose(split, whole, rtol=1e-5)
  assert np.argmax(split) == np.argmax(whole)


# ---- compiled programs per sampling value -----------------------------------------------------------

def programs(*functions):
  return sum(f._cache_size() for f in functions)


DECODE = (sampling.decode_round, sampling.admit, sampling.init_state)


def reply(client, **fields):
  body = {'messages': [user('What is 17 + 25?')], 'seed': 0, **fields}
  response = client.post('/v1/chat/completions', json=body)
  assert response.status_code == 200, response.text
  return response.json()


@pytest.fixture(scope='module')
def warm_client(model):
  """A server that has answered a sampled, a greedy and a guided request (their programs compiled)."""
  client = TestClient(serve.build_app(model, 'tiny-sft'))
  for fields in ({'temperature': 1.0}, {'temperature': 0}, {'guided_choice': ['A', 'B']}):
    reply(client, max_tokens=8, **fields)
  return client


def each(field, values, **fields):
  return [{'max_tokens': 8, **fields, field: value} for value in values]


TEMPERATURES = [0.3, 0.45, 0.6, 0.7, 0.85, 1.1, 1.3, 1.7]
RECOMPILES = {  # 8 requests' fields → how many more programs they may compile in all
    'temperature': (each('temperature', TEMPERATURES), 0),
    'top_p': (each('top_p', [0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 0.95, 0.99], temperature=0.8), 1),   # the nucleus's
    'top_k within a width': (each('top_k', range(9, 17), temperature=0.8), 1),   # top-k of width 16
    'top_k past the vocabulary': (each('top_k', [8000, 8001, 9000, 10**4, 10**5, 10**6, 10**9, 2**40],
                                       temperature=0.8), 0),
    'temperature under 1e-5 (greedy)': (each('temperature', [1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-12, 1e-20, 1e-30]),
                                        0),
    # 64-token prompt + budget from 129 to 577 tokens: caches of 256, 512 and 1024 (init, admit, decode each)
    'max_tokens, greedy': (each('max_tokens', [65, 129, 193, 257, 321, 385, 449, 513], temperature=0), 3 * 3),
    'max_completion_tokens and temperature': (
        [{'max_completion_tokens': tokens, 'temperature': t}
         for tokens, t in zip([70, 80, 90, 100, 110, 120, 130, 140], TEMPERATURES)], 3),   # one cache, 256
}


@pytest.mark.parametrize('requests, bound', RECOMPILES.values(), ids=RECOMPILES)
def test_new_sampling_values_reuse_compiled_programs(warm_client, requests, bound):
  before = programs(*DECODE)
  for fields in requests:
    reply(warm_client, **fields)
  assert programs(*DECODE) - before <= bound


def test_guided_choices_of_new_lengths_reuse_programs(warm_client):
  before = programs(loading._next_token_logprobs)
  for length in range(80, 600, 64):   # 8 lengths 64 tokens apart, with the prompt: 256, 512 or 1024 padded
    reply(warm_client, guided_choice=['A', words(length)])
  assert programs(loading._next_token_logprobs) - before <= 3


def static_choose_tokens(logits, keys, temperature, top_k, top_p):
  """The sampler with its settings as Python constants, as it was before they were traced (the reference)."""
  if temperature == 0:
    tokens = sampling.greedy_tokens(logits)
    untruncated = sampling.chosen_logprobs(logits, tokens)
    return tokens, jnp.zeros_like(untruncated), untruncated
  scaled = logits / temperature
  truncated = scaled
  if top_k:
    kth = jax.lax.top_k(truncated, min(top_k, truncated.shape[-1]))[0][:, -1:]
    truncated = jnp.where(truncated >= kth, truncated, -jnp.inf)
  if top_p < 1.0:
    descending = -jnp.sort(-truncated, axis=-1)
    probs = jax.nn.softmax(descending, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    kept = jnp.sum(mass_before < top_p, axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(descending, kept - 1, axis=-1)
    truncated = jnp.where(truncated >= threshold, truncated, -jnp.inf)
  noise = jax.vmap(lambda key: jax.random.gumbel(key, truncated.shape[1:], truncated.dtype))(keys)
  tokens = sampling.greedy_tokens(truncated + noise)
  untruncated = sampling.chosen_logprobs(scaled, tokens)
  if top_k == 0 and top_p == 1.0:
    return tokens, untruncated, untruncated
  return tokens, sampling.chosen_logprobs(truncated, tokens), untruncated


SETTINGS = [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 0, 1.0), (0.7, 20, 1.0), (0.7, 0, 0.9),
            (1.3, 50, 0.8), (0.6, 1, 1.0), (0.9, 7, 0.95)]


def test_traced_settings_give_the_bits_of_python_constants(model):
  """Training rollouts stay bit-identical: for each setting, the traced sampler's tokens and log-probs equal
  those of the sampler compiled with the setting as constants, on tiny-sft's logits."""
  prompts = [model.tokenizer.render([user(q)], mode, add_generation_prompt=True)[0]
             for q in ('What is 17 + 25?', 'Name a colour.') for mode in ('concise', 'reasoning')]
  width = max(map(len, prompts))
  ids = np.array([p + [0] * (width - len(p)) for p in prompts], np.int32)
  logits = model.logits(ids)[np.arange(len(prompts)), [len(p) - 1 for p in prompts]]   # [B, V]
  logits = jnp.concatenate([logits, logits * 0.5 + 1.0, logits[:, ::-1]])
  keys = sampling.row_keys(jax.random.key(3), jnp.arange(len(logits)), jnp.arange(len(logits)))
  traced = jax.jit(sampling.choose_tokens)
  for temperature, top_k, top_p in SETTINGS:
    want = jax.jit(static_choose_tokens, static_argnums=(2, 3, 4))(logits, keys, temperature, top_k, top_p)
    got = traced(logits, keys, sampling.SamplingSettings(temperature, top_k, top_p))
    for name, w, g in zip(('tokens', 'logprobs', 'untruncated'), want, got):
      assert np.array_equal(np.asarray(w), np.asarray(g)), (temperature, top_k, top_p, name)
  # the programs: greedy; plain; top-k width 32, 1 and 8 (each with or without the nucleus); nucleus alone
  assert traced._cache_size() <= 7


def test_chunked_decoding_gives_the_same_reply(model):
  """The server's decode (a few tokens per call, power-of-two cache) equals Model.chat's, bit for bit, tool turns
  included."""
  question = [user('Emma has 16 pencils, buys 35 more, and then gives 17 to a friend. How many pencils does Emma '
                   'have now?')]
  for temperature, top_k, top_p in [(0.0, 0, 1.0), (0.7, 20, 0.9)]:
    kwargs = dict(max_new_tokens=100, temperature=temperature, top_k=top_k, top_p=top_p, seed=2)
    whole = model.chat(question, 'reasoning', **kwargs).rollout
    chunked = model.chat(question, 'reasoning', decode_chunk=8, **kwargs).rollout   # DECODE_CHUNK's mechanism
    assert len(whole.token_ids) > 3 * 8, 'one chunk would not show the resumption'
    for name in ('token_ids', 'logprobs', 'untruncated_logprobs'):
      assert np.array_equal(getattr(whole, name), getattr(chunked, name)), (temperature, name)


# ---- the ASGI app driven directly: a queue, and clients that leave ------------------------------------

async def asgi_call(app, method, path, body: bytes = b'', *, leave: asyncio.Event | None = None,
                    on_leave=None, more_body=False):
  """(status, JSON reply) of one request. leave: once set, the client has hung up (the app's next receive says
  so; on_leave() runs on the event loop right after the app has taken that in). more_body: the body is cut
  short (the client leaves mid-upload)."""
  scope = {'type': 'http', 'asgi': {'version': '3.0'}, 'http_version': '1.1', 'method': method, 'scheme': 'http',
           'path': path, 'raw_path': path.encode(), 'root_path': '', 'query_string': b'',
           'headers': [(b'host', b'test'), (b'content-type', b'application/json')]
           + ([(b'content-length', str(len(body)).encode())] if not more_body else []),
           'client': ('127.0.0.1', 50000), 'server': ('127.0.0.1', 80)}
  body_sent, messages = False, []
  never = asyncio.Event()

  async def receive():
    nonlocal body_sent
    if not body_sent:
      body_sent = True
      return {'type': 'http.request', 'body': body, 'more_body': more_body}
    await (leave or never).wait()
    if on_leave is not None:
      asyncio.get_running_loop().call_soon(on_leave)
    return {'type': 'http.disconnect'}

  async def send(message):
    messages.append(message)

  await app(scope, receive, send)
  status = messages[0]['status']
  return status, json.loads(b''.join(m.get('body', b'') for m in messages[1:]) or b'null')


def counting(model):
  """A copy of model whose chat and reply_logprobs count their calls (in .calls)."""
  spy = dataclasses.replace(model)
  spy.calls = []
  for name in ('chat', 'reply_logprobs'):
    def call(*args, _name=name, **kwargs):
      spy.calls.append(_name)
      return getattr(model, _name)(*args, **kwargs)
    setattr(spy, name, call)
  return spy


def completion(**fields) -> bytes:
  return json.dumps({'messages': [user('What is 17 + 25?')], 'max_tokens': 4, 'temperature': 0, **fields}).encode()


QUEUED = {  # what 48 queued requests ask (more than the 40 worker threads) → the quick endpoint polled
    'greedy, /health': (completion(), '/health'),
    'sampled, /health': (completion(temperature=0.9), '/health'),
    'guided choice, /health': (completion(guided_choice=['YES', 'NO']), '/health'),
    'greedy, /v1/models': (completion(), '/v1/models'),
    'tool turns, /health': (json.dumps({'messages': [user('2+2?'), {'role': 'assistant', 'tool_calls': [
        {'id': 'c', 'type': 'function', 'function': {'name': 'calculator', 'arguments': '{"expression": "2+2"}'}}]},
        {'role': 'tool', 'content': '4'}], 'max_tokens': 4}).encode(), '/health'),
}


@pytest.mark.parametrize('body, path', QUEUED.values(), ids=QUEUED)
def test_quick_endpoints_answer_behind_a_full_queue(model, body, path):
  app = serve.build_app(model, 'tiny-sft')
  lock = app.state.completions.lock

  async def main():
    lock.acquire()   # a long reply runs: every completion queues
    try:
      queued = [asyncio.create_task(asgi_call(app, 'POST', '/v1/chat/completions', body)) for _ in range(48)]
      await asyncio.sleep(0)   # let them start
      answers = [await asyncio.wait_for(asgi_call(app, 'GET', path), HANG_GUARD_S) for _ in range(3)]
    finally:
      lock.release()
    statuses = [status for status, _ in await asyncio.gather(*queued)]
    return answers, statuses

  answers, statuses = asyncio.run(main())
  assert [status for status, _ in answers] == [200] * 3
  assert answers[0][1] == ({'status': 'ok'} if path == '/health' else app.state.completions.models())
  assert set(statuses) == {200}


LEAVERS = {  # what a client asks before it hangs up while its request waits for the model
    'greedy': completion(),
    'sampled': completion(temperature=0.9, max_tokens=64),
    'guided choice': completion(guided_choice=['YES', 'NO']),
    'with a tool turn': json.dumps({'messages': [user('2+2?'), {'role': 'assistant', 'tool_calls': [
        {'id': 'c', 'type': 'function', 'function': {'name': 'calculator', 'arguments': '{"expression": "2+2"}'}}]},
        {'role': 'tool', 'content': '4'}], 'max_tokens': 8}).encode(),
}


@pytest.mark.parametrize('body', LEAVERS.values(), ids=LEAVERS)
def test_a_request_whose_client_left_while_queued_is_skipped(model, body):
  spy = counting(model)
  app = serve.build_app(spy, 'tiny-sft')
  lock = app.state.completions.lock

  held = threading.Event()

  def release():
    held.clear()
    lock.release()

  async def main():
    lock.acquire()   # released once the app has seen the client leave
    held.set()
    left = asyncio.Event()
    request = asyncio.create_task(asgi_call(app, 'POST', '/v1/chat/completions', body, leave=left,
                                            on_leave=release))
    left.set()
    try:
      return await asyncio.wait_for(request, HANG_GUARD_S)
    finally:
      if held.is_set():   # it never noticed: let its thread go
        release()

  status, reply = asyncio.run(main())
  assert status == 499 and 'closed the connection' in reply['error']['message']
  assert spy.calls == []


def test_a_queue_of_leavers_costs_nothing(model):
  """Ten queued requests whose clients all left run no model call; the next request runs at once."""
  spy = counting(model)
  app = serve.build_app(spy, 'tiny-sft')
  lock = app.state.completions.lock

  async def main():
    lock.acquire()
    left, seen = asyncio.Event(), []
    on_leave = lambda: (seen.append(1), len(seen) == 10 and lock.release())
    leavers = [asyncio.create_task(asgi_call(app, 'POST', '/v1/chat/completions', completion(max_tokens=64),
                                             leave=left, on_leave=on_leave)) for _ in range(10)]
    left.set()
    try:
      statuses = [status for status, _ in await asyncio.wait_for(asyncio.gather(*leavers), HANG_GUARD_S)]
    finally:
      if len(seen) < 10:   # it never noticed: let its threads go
        lock.release()
    stayer = await asyncio.wait_for(asgi_call(app, 'POST', '/v1/chat/completions', completion()), HANG_GUARD_S)
    return statuses, stayer

  statuses, (status, reply) = asyncio.run(main())
  assert statuses == [499] * 10 and status == 200 and reply['choices'][0]['message']['content']
  assert spy.calls == ['chat']


def test_a_client_that_leaves_mid_upload_costs_nothing(model):
  spy = counting(model)
  app = serve.build_app(spy, 'tiny-sft')

  async def main():
    left = asyncio.Event()
    left.set()
    return await asyncio.wait_for(asgi_call(app, 'POST', '/v1/chat/completions', completion()[:20], leave=left,
                                            more_body=True), HANG_GUARD_S)

  status, reply = asyncio.run(main())
  assert status == 499 and 'before sending the whole body' in reply['error']['message']
  assert spy.calls == []


def test_a_reply_whose_client_left_stops_at_the_next_chunk(model):
  """A long sampled reply: the client hangs up after the first decode chunk; generation stops there."""
  spy = dataclasses.replace(model)
  checks, seen_leave, chunks_done = [], threading.Event(), []
  leave_now = threading.Event()

  def chat(*args, check=None, **kwargs):
    def counted():
      checks.append(1)
      if len(checks) == 2:   # the first chunk is decoded: the client hangs up now
        leave_now.set()
        assert seen_leave.wait(HANG_GUARD_S)
      check()
    result = model.chat(*args, check=counted, **kwargs)
    chunks_done.append(len(result.rollout.token_ids))
    return result
  spy.chat = chat
  app = serve.build_app(spy, 'tiny-sft')
  # temperature 5 on tiny-sft: nearly uniform draws, so the reply would run its whole budget
  body = completion(temperature=5.0, max_tokens=1024, seed=0)

  async def main():
    left = asyncio.Event()
    loop = asyncio.get_running_loop()
    request = asyncio.create_task(asgi_call(app, 'POST', '/v1/chat/completions', body, leave=left,
                                            on_leave=seen_leave.set))
    await loop.run_in_executor(None, leave_now.wait, HANG_GUARD_S)
    left.set()
    return await asyncio.wait_for(request, HANG_GUARD_S * 4)

  status, reply = asyncio.run(main())
  assert status == 499, reply
  assert len(checks) == 2 and chunks_done == []   # stopped at the check after one chunk, never finished
  uninterrupted = model.chat([user('What is 17 + 25?')], serve.DEFAULT_MODE, max_new_tokens=1024,
                             temperature=5.0, seed=0, tools=serve._no_tools, decode_chunk=serve.DECODE_CHUNK)
  assert len(uninterrupted.rollout.token_ids) > 4 * serve.DECODE_CHUNK   # what the check saved
