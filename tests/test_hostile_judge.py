"""The HTTP judge against a hostile server on 127.0.0.1 (issue 54): nested, unencodable, oversized and dripped
replies each end as the verdict None, counted in judge/failures with its reason and the judge's URL."""

import json
import socket
import socketserver
import threading
import time
import types

import pytest

from luckystar.rewards import judge as judge_lib

pytestmark = pytest.mark.fast

QUESTION, REFERENCE, CANDIDATE = '3의 제곱은?', '9', 'nine'
HUGE_BYTES = 50 << 20          # what a hostile server offers; the cap must stop reading long before
HANDLER_LIFETIME_S = 4.0       # every scripted reply ends by itself, even if the client never leaves
DRIP_INTERVAL_S = 0.05         # a byte this often: each read succeeds long before timeout_s
DRIP_TIMEOUT_S = 0.5
DEADLINE_FACTOR = 5            # a generous bound on a deadline honoured: a correctness check, not a benchmark
_CHUNK = 64 << 10


# ---- the hostile server ------------------------------------------------------------------------------------

class HostileServer(socketserver.ThreadingTCPServer):
  """Reads one HTTP request per connection, then sends the next scripted reply: raw chunks, optionally one
  every `delay_s`, so the reply can be malformed, endless or slow. Records requests and bytes sent."""
  daemon_threads = True
  allow_reuse_address = True

  def __init__(self):
    super().__init__(('127.0.0.1', 0), _RawHandler)
    self.script, self.requests, self.sent = [], [], []
    self.stop = threading.Event()

  @property
  def base_url(self):
    return f'http://127.0.0.1:{self.server_address[1]}'


class _RawHandler(socketserver.BaseRequestHandler):

  def handle(self):
    server, sock = self.server, self.request
    data = b''
    while b'\r\n\r\n' not in data and len(data) < 1 << 16:
      if not (piece := sock.recv(4096)):
        return
      data += piece
    head, _, body = data.partition(b'\r\n\r\n')
    length = next((int(line.split(b':', 1)[1]) for line in head.split(b'\r\n')
                   if line.lower().startswith(b'content-length:')), 0)
    while len(body) < length and (piece := sock.recv(4096)):
      body += piece
    server.requests.append(json.loads(body))
    chunks, delay_s = server.script.pop(0) if server.script else (_reply(_completion('YES')), 0.0)
    server.sent.append(0)
    start = time.monotonic()
    try:
      for chunk in chunks:
        if server.stop.is_set() or time.monotonic() - start > HANDLER_LIFETIME_S:
          return
        sock.sendall(chunk)
        server.sent[-1] += len(chunk)
        if delay_s:
          server.stop.wait(delay_s)
    except OSError:
      pass   # the client gave up (the cap or its deadline): what these tests want


@pytest.fixture(scope='module')
def hostile():
  server = HostileServer()
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield server
  server.stop.set()
  server.shutdown()
  server.server_close()
  thread.join(5)


@pytest.fixture
def server(hostile, monkeypatch):
  """A clean script per test; backoff sleeps recorded, not slept."""
  hostile.script.clear()
  hostile.requests.clear()
  hostile.sent.clear()
  delays = []
  monkeypatch.setattr(judge_lib, 'time', types.SimpleNamespace(sleep=delays.append))
  hostile.delays = delays
  return hostile


# ---- replies ---------------------------------------------------------------------------------------------------

def _completion(content) -> bytes:
  return json.dumps({'id': 'x', 'object': 'chat.completion', 'choices': [
      {'index': 0, 'message': {'role': 'assistant', 'content': content}, 'finish_reason': 'stop'}]}).encode()


def _head(status=200, length: int | None = None, extra=()) -> bytes:
  lines = [f'HTTP/1.1 {status} X', 'Content-Type: application/json', 'Connection: close', *extra]
  if length is not None:
    lines.append(f'Content-Length: {length}')
  return ('\r\n'.join(lines) + '\r\n\r\n').encode()


def _reply(body: bytes, status=200):
  return [_head(status, len(body)) + body]


def _chunked(pieces):
  yield _head(extra=['Transfer-Encoding: chunked'])
  for piece in pieces:
    yield b'%x\r\n%s\r\n' % (len(piece), piece)
  yield b'0\r\n\r\n'


def _padded(prefix: bytes, suffix: bytes, size: int, pad: bytes = b' '):
  """prefix, then pad bytes, then suffix: `size` bytes of valid JSON produced lazily."""
  yield prefix
  left = size - len(prefix) - len(suffix)
  while left > 0:
    yield pad * min(_CHUNK, left)
    left -= _CHUNK
  yield suffix


def _huge_completion(size=HUGE_BYTES):
  """A well-formed completion saying YES, padded with whitespace to `size` bytes."""
  body = _completion('YES')
  return _padded(body[:-1], body[-1:], size)


def _bytewise(data: bytes):
  return [data[i:i + 1] for i in range(len(data))]


# ---- helpers ---------------------------------------------------------------------------------------------------

def _judge(server, **options):
  options = {'timeout_s': 2.0, 'retries': 0, 'backoff_s': 0.5, **options}
  return judge_lib.HttpJudge(server.base_url, 'hostile-judge', **options)


def _ask(judge):
  return judge(QUESTION, REFERENCE, CANDIDATE, criterion='equivalent')


def _assert_failed(judge, reason, words, *, requests=1):
  """The verdict failed once, counted in judge/failures under `reason`; the message names the URL and why."""
  assert judge.stats.as_metrics()['judge/failures'] == 1
  assert judge.stats.requests == requests
  assert judge.failure_reasons == {reason: 1}
  assert judge.url in judge.last_failure
  assert words in judge.last_failure, judge.last_failure


def test_the_hostile_server_speaks_http(server):
  judge = _judge(server, cache_size=0)
  assert _ask(judge) is True
  server.script.append((_chunked([_completion('NO')[:10], _completion('NO')[10:]]), 0.0))
  assert _ask(judge) is False
  assert judge.stats.failures == 0 and judge.failure_reasons == {} and judge.last_failure is None


# ---- nested JSON -----------------------------------------------------------------------------------------------

DEEP = 100_000   # far past Python's recursion limit and files.MAX_JSON_DEPTH
NESTED = {
    'arrays as the whole body': b'[' * DEEP + b']' * DEEP,
    'objects as the whole body': b'{"a":' * DEEP + b'1' + b'}' * DEEP,
    'arrays in the content': _completion('@').replace(b'"@"', b'[' * DEEP + b']' * DEEP),
    'beside a YES content': _completion('YES')[:-1] + b',"usage":' + b'[' * DEEP + b']' * DEEP + b'}',
    'never closed': b'{"choices":' + b'[' * DEEP,
    'mixed, spaced': b'[ {"x": ' * DEEP + b'0' + b'} ]' * DEEP,
}


@pytest.mark.parametrize('body', NESTED.values(), ids=NESTED.keys())
def test_a_nested_reply_is_a_counted_failure(server, body):
  server.script.append((_reply(body), 0.0))
  judge = _judge(server, retries=2)
  assert _ask(judge) is None
  _assert_failed(judge, 'invalid_reply', 'nested')
  assert server.delays == []   # the same server would nest again: not retried


def test_nesting_within_the_cap_still_parses(server):
  body = _completion('YES')[:-1] + b',"x":' + b'[' * 32 + b']' * 32 + b'}'
  server.script.append((_reply(body), 0.0))
  assert _ask(_judge(server)) is True


# ---- unencodable text ------------------------------------------------------------------------------------------

UNENCODABLE = {
    'lone high surrogate escape in the content': _completion('YES').replace(b'YES', b'YES\\ud800'),
    'lone low surrogate escape in the content': _completion('YES').replace(b'YES', b'YES\\udfff'),
    'two high surrogates': _completion('YES').replace(b'YES', b'YES\\ud800\\ud800'),
    'surrogate bytes in the content': _completion('YES').replace(b'YES', b'YES\xed\xa0\x80'),
    'surrogate escape in another field': _completion('YES').replace(b'"x"', b'"\\ud83d"'),
    'surrogate escape in a key': _completion('YES').replace(b'"index"', b'"\\udc00"'),
    'UTF-16': _completion('YES').decode().encode('utf-16'),
    'UTF-32': _completion('YES').decode().encode('utf-32'),
    'Latin-1': _completion('YES').replace(b'YES', b'YES \xff'),
    'truncated UTF-8': _completion('YES').replace(b'YES', b'YES \xea\xb0'),
}


@pytest.mark.parametrize('body', UNENCODABLE.values(), ids=UNENCODABLE.keys())
def test_an_unencodable_reply_is_a_counted_failure(server, body):
  server.script.append((_reply(body), 0.0))
  judge = _judge(server, retries=2)
  assert _ask(judge) is None
  _assert_failed(judge, 'invalid_reply', 'reply')
  assert any(word in judge.last_failure for word in ('UTF-8', 'surrogate')), judge.last_failure
  assert server.delays == []


def test_non_ascii_text_is_fine(server):
  server.script.append((_reply(_completion('예')), 0.0))
  assert _ask(_judge(server)) is True


# ---- oversized replies -----------------------------------------------------------------------------------------

def _oversized_with_length():
  size = HUGE_BYTES
  yield _head(length=size)
  yield from _huge_completion(size)


def _oversized_close_delimited():
  yield _head()
  yield from _huge_completion()


def _content_of(size):
  prefix = _completion('YES').split(b'YES')[0] + b'YES'
  return _padded(prefix, b'"}, "finish_reason": "stop"}]}', size)


def _lying_length():
  yield _head(length=10 << 30)   # 10 GiB announced, a stream delivered
  yield from _huge_completion()


def _just_over_the_cap():
  size = judge_lib.MAX_REPLY_BYTES + 1
  yield _head(length=size)
  yield from _huge_completion(size)


OVERSIZED = {
    'with Content-Length': _oversized_with_length,
    'chunked': lambda: _chunked(_huge_completion()),
    'close-delimited': _oversized_close_delimited,
    'a huge content string': lambda: _chunked(_content_of(HUGE_BYTES)),
    'announcing 10 GiB': _lying_length,
    'one byte over the cap': _just_over_the_cap,
}


@pytest.mark.parametrize('make_reply', OVERSIZED.values(), ids=OVERSIZED.keys())
def test_an_oversized_reply_is_cut_and_counted(server, make_reply):
  server.script.append((make_reply(), 0.0))
  judge = _judge(server, retries=2)
  assert _ask(judge) is None
  _assert_failed(judge, 'too_large', f'{judge_lib.MAX_REPLY_BYTES:,} bytes')
  assert server.delays == []   # the same server would send as much again: not retried
  # What left the server is the cap plus what the sockets buffered, never the whole stream.
  assert server.sent[-1] < HUGE_BYTES // 2


def test_a_reply_at_the_cap_is_read(server):
  size = judge_lib.MAX_REPLY_BYTES
  server.script.append(([_head(length=size), *_huge_completion(size)], 0.0))
  assert _ask(_judge(server)) is True


def test_the_cap_is_a_few_megabytes():
  assert 1 << 20 <= judge_lib.MAX_REPLY_BYTES <= 16 << 20


# ---- slow drips ------------------------------------------------------------------------------------------------

def _drip_body_with_length():
  body = _completion('YES') + b' ' * 200
  return [_head(length=len(body)), *_bytewise(body)]


def _drip_close_delimited():
  return [_head(), *_bytewise(_completion('YES') + b' ' * 200)]


def _drip_error_body():
  body = b'x' * 1000
  return [_head(status=500, length=len(body)), *_bytewise(body)]


DRIPS = {
    'the whole reply': lambda: _bytewise(_reply(_completion('YES'))[0]),
    'the body, with Content-Length': _drip_body_with_length,
    'endless header lines': lambda: _bytewise(b'HTTP/1.1 200 OK\r\n' + b'X-Slow: 1\r\n' * 100),
    'one-byte chunks': lambda: _chunked(_bytewise(_completion('YES') + b' ' * 200)),
    'close-delimited body': _drip_close_delimited,
    'an error body': _drip_error_body,
}


@pytest.mark.parametrize('make_reply', DRIPS.values(), ids=DRIPS.keys())
def test_a_drip_meets_the_deadline_and_is_counted(server, make_reply):
  server.script.append((make_reply(), DRIP_INTERVAL_S))
  judge = _judge(server, timeout_s=DRIP_TIMEOUT_S)
  start = time.monotonic()
  assert _ask(judge) is None
  # timeout_s bounds the whole request, not each read (which the drip always satisfies in time).
  assert time.monotonic() - start < DEADLINE_FACTOR * DRIP_TIMEOUT_S
  _assert_failed(judge, 'timeout', f'timeout_s={DRIP_TIMEOUT_S}')


def test_a_drip_is_retried_within_bounds(server):
  server.script += [(_drip_body_with_length(), DRIP_INTERVAL_S), (_drip_body_with_length(), DRIP_INTERVAL_S)]
  judge = _judge(server, timeout_s=DRIP_TIMEOUT_S, retries=1)
  start = time.monotonic()
  assert _ask(judge) is None
  assert time.monotonic() - start < DEADLINE_FACTOR * (judge.retries + 1) * DRIP_TIMEOUT_S
  _assert_failed(judge, 'timeout', 'gave up after 2 attempts', requests=2)
  assert server.delays == [0.5]


# ---- server errors and refused connections -------------------------------------------------------------------

def test_a_server_error_then_success_is_retried(server):
  server.script.append((_reply(b'{"error": "busy"}', status=500), 0.0))
  judge = _judge(server, retries=2)
  assert _ask(judge) is True
  assert judge.stats.requests == 2 and judge.stats.failures == 0 and server.delays == [0.5]


def test_server_errors_are_retried_a_bounded_number_of_times(server):
  server.script += [(_reply(b'{"error": "down"}', status=503), 0.0)] * 4
  judge = _judge(server, retries=2)
  assert _ask(judge) is None
  _assert_failed(judge, 'http_status', 'HTTP 503', requests=3)
  assert server.delays == [0.5, 1.0] and len(server.requests) == 3
  with pytest.raises(ValueError, match='retries'):
    judge_lib.HttpJudge(server.base_url, 'm', retries=judge_lib.MAX_RETRIES + 1)
  assert judge_lib.config_problems({'backend': 'http', 'base_url': server.base_url, 'model': 'm',
                                    'retries': judge_lib.MAX_RETRIES + 1})


def test_a_nested_error_body_is_only_quoted(server):
  server.script.append((_reply(b'[' * DEEP + b']' * DEEP, status=400), 0.0))
  judge = _judge(server)
  assert _ask(judge) is None
  _assert_failed(judge, 'http_status', 'HTTP 400')
  assert len(judge.last_failure) < 1000


def test_a_refused_connection_is_counted(server):
  with socket.socket() as sock:   # a port nobody listens on
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
  judge = judge_lib.HttpJudge(f'http://127.0.0.1:{port}', 'm', retries=1, backoff_s=0.0, timeout_s=1.0)
  assert _ask(judge) is None
  _assert_failed(judge, 'connection', 'gave up after 2 attempts', requests=2)


@pytest.mark.parametrize('content', [None, 7, ['YES'], {'text': 'YES'}])
def test_a_content_that_is_not_text_is_counted(server, content):
  server.script.append((_reply(_completion(content)), 0.0))
  judge = _judge(server)
  assert _ask(judge) is None
  _assert_failed(judge, 'invalid_reply', 'not a chat-completions response')
