"""`python -m luckystar.serve` over a real socket with the `openai` client: streamed replies (server-sent
events) add up to the non-streamed greedy ones in both modes, Korean included; a client that hangs up mid-stream
stops its generation; n > 1 choices; and concurrent requests share the continuous-batching engine with replies
equal to the sequential ones (a bounded loopback load test that ends by itself)."""

import concurrent.futures
import json
import urllib.request

import pytest

import serve_process

openai = pytest.importorskip('openai')   # the `test` extra

QUESTIONS = ['What is 17 + 25?', 'Name a colour.', '서울은 어느 나라의 수도인가요?', '한국어로 인사해 주세요.']
MAX_TOKENS = 48
CLIENTS, REQUESTS_PER_CLIENT = 16, 4


@pytest.fixture(scope='module')
def server():
  with serve_process.start_server('tiny-sft') as running:
    yield running


@pytest.fixture(scope='module')
def client(server):
  return openai.OpenAI(base_url=server.base_url + '/v1', api_key='unused', max_retries=0, timeout=300)


def ask(client, question, mode, **fields):
  return client.chat.completions.create(
      model='tiny-sft', messages=[{'role': 'user', 'content': question}], temperature=0,
      extra_body={'mode': mode}, **{'max_tokens': MAX_TOKENS, **fields})


@pytest.mark.parametrize('mode', ['concise', 'reasoning'])
@pytest.mark.parametrize('question', QUESTIONS[::2])
def test_streamed_reply_adds_up_to_the_whole_reply(client, question, mode):
  whole = ask(client, question, mode).choices[0]
  chunks = list(ask(client, question, mode, stream=True, stream_options={'include_usage': True}))
  assert chunks[0].choices[0].delta.role == 'assistant'
  deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
  content = ''.join(d.content or '' for d in deltas)
  reasoning = ''.join(getattr(d, 'reasoning_content', None) or '' for d in deltas)
  assert content == whole.message.content
  assert reasoning == (getattr(whole.message, 'reasoning_content', None) or '')
  assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.finish_reason
  assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_a_long_reply_streams_as_it_decodes(client):
  """A reasoning trace longer than a decode chunk arrives in several deltas, not all at the end."""
  question = ('Emma has 16 pencils, buys 35 more, and then gives 17 to a friend. How many pencils does Emma have '
              'now?')
  chunks = list(ask(client, question, 'reasoning', stream=True, max_tokens=128))
  texts = [c for c in chunks if c.choices and (c.choices[0].delta.content or
                                               getattr(c.choices[0].delta, 'reasoning_content', None))]
  assert len(texts) >= 2


def test_a_client_that_hangs_up_mid_stream_stops_generation(server, client):
  stream = client.chat.completions.create(
      model='tiny-sft', messages=[{'role': 'user', 'content': 'Tell me a story.'}], temperature=5.0, seed=1,
      max_tokens=1500, stream=True)
  next(iter(stream))
  stream.close()
  # The next request is answered: the hung-up reply stopped at its next decode chunk instead of running 1500 tokens
  # (the scheduler would otherwise hold the engine; equal settings would batch, so use others).
  reply = ask(client, QUESTIONS[0], 'concise')
  assert reply.choices[0].message.content
  assert any('luckystar.serve: stopped' in line and 'client' in line for line in server.stderr), server.stderr[-5:]


def test_n_choices_each_with_its_index(client):
  reply = client.chat.completions.create(
      model='tiny-sft', messages=[{'role': 'user', 'content': QUESTIONS[1]}], temperature=1.0, seed=3, n=3,
      max_tokens=MAX_TOKENS)
  assert [c.index for c in reply.choices] == [0, 1, 2]
  again = client.chat.completions.create(
      model='tiny-sft', messages=[{'role': 'user', 'content': QUESTIONS[1]}], temperature=1.0, seed=3, n=3,
      max_tokens=MAX_TOKENS)
  assert [c.message.content for c in again.choices] == [c.message.content for c in reply.choices]
  greedy = ask(client, QUESTIONS[0], 'concise', n=2)
  assert greedy.choices[0].message.content == greedy.choices[1].message.content


def test_concurrent_requests_equal_sequential_ones(client):
  """CLIENTS clients × REQUESTS_PER_CLIENT greedy requests at once: every one answered, each equal to the reply the
  same request gets alone."""
  cases = [(QUESTIONS[i % len(QUESTIONS)], ('concise', 'reasoning')[i % 2], 8 + 8 * (i % 5))
           for i in range(CLIENTS * REQUESTS_PER_CLIENT)]
  sequential = {case: ask(client, case[0], case[1], max_tokens=case[2]).choices[0].message.content
                for case in set(cases)}

  def one_client(k):
    return [(case, ask(client, case[0], case[1], max_tokens=case[2]).choices[0].message.content)
            for case in cases[k::CLIENTS]]

  with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
    answers = [pair for answers in pool.map(one_client, range(CLIENTS)) for pair in answers]
  assert len(answers) == len(cases)
  for case, content in answers:
    assert content == sequential[case], case


def test_concurrent_seeded_requests_equal_sequential_ones(client):
  """Sampled requests with seeds (some the same seed, n 1 or 2) at once: each joins the running rollout with its own
  seed and row ids, so its choices are the ones it gets alone."""
  cases = [(QUESTIONS[i % len(QUESTIONS)], i % 3, 1 + i % 2) for i in range(12)]

  def choices(case):
    question, seed, n = case
    reply = client.chat.completions.create(model='tiny-sft', messages=[{'role': 'user', 'content': question}],
                                           temperature=0.8, seed=seed, n=n, max_tokens=16)
    return [choice.message.content for choice in reply.choices]

  alone = {case: choices(case) for case in cases}
  with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
    together = list(pool.map(choices, cases))
  assert together == [alone[case] for case in cases]
