"""The LLM judge against a scripted OpenAI-compatible server on 127.0.0.1, and with a fake model."""

import http.server
import json
import socket
import threading
import types

import ml_collections
import pytest

from luckystar.rewards import judge as judge_lib

pytestmark = pytest.mark.fast

QUESTION, REFERENCE, CANDIDATE = '3의 제곱은?', '9', 'nine'


class ScriptedServer(http.server.ThreadingHTTPServer):
  """Answers /v1/chat/completions by script: each request pops the next behaviour (default 'YES').

  Behaviours: any text (sent as the completion), an int (that HTTP status), 'hang' (no answer
  until released), 'not json' (a 200 whose body is not a chat completion).
  """
  daemon_threads = True

  def __init__(self):
    super().__init__(('127.0.0.1', 0), _Handler)
    self.script, self.requests = [], []
    self.release = threading.Event()

  @property
  def base_url(self):
    return f'http://127.0.0.1:{self.server_address[1]}'


class _Handler(http.server.BaseHTTPRequestHandler):

  def log_message(self, *args):  # keep test output quiet
    pass

  def do_POST(self):  # pylint: disable=invalid-name
    server = self.server
    body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
    server.requests.append({'path': self.path, 'headers': dict(self.headers), 'body': body})
    behaviour = server.script.pop(0) if server.script else 'YES'
    if behaviour == 'hang':
      server.release.wait(10)
      behaviour = 'YES'
    if isinstance(behaviour, int):
      payload, status = json.dumps({'error': {'message': f'scripted {behaviour}'}}).encode(), behaviour
    elif behaviour == 'not json':
      payload, status = b'<html>proxy error</html>', 200
    else:
      payload, status = json.dumps({'id': 'x', 'object': 'chat.completion', 'choices': [
          {'index': 0, 'message': {'role': 'assistant', 'content': behaviour}, 'finish_reason': 'stop'}]}
                                   ).encode(), 200
    try:
      self.send_response(status)
      self.send_header('Content-Type', 'application/json')
      self.send_header('Content-Length', str(len(payload)))
      self.end_headers()
      self.wfile.write(payload)
    except (BrokenPipeError, ConnectionResetError):
      pass  # the client timed out and left


@pytest.fixture(scope='module')
def server():
  server = ScriptedServer()
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield server
  server.release.set()
  server.shutdown()
  server.server_close()
  thread.join(5)


@pytest.fixture
def fresh(server, monkeypatch):
  """A clean script and request log per test; a no-op sleep that records the backoff delays."""
  monkeypatch.setenv('no_proxy', '127.0.0.1,localhost')
  server.script.clear()
  server.requests.clear()
  server.release.clear()
  delays = []
  monkeypatch.setattr(judge_lib, 'time', types.SimpleNamespace(sleep=delays.append))
  yield server, delays
  server.release.set()


def _http_judge(server, **options):
  options = {'timeout_s': 2.0, 'retries': 2, 'backoff_s': 0.5, **options}
  return judge_lib.HttpJudge(server.base_url, 'luckystar-judge', **options)


def _ask(judge, candidate=CANDIDATE, criterion='equivalent'):
  return judge(QUESTION, REFERENCE, candidate, criterion=criterion)


@pytest.mark.parametrize('answer, verdict', [('YES', True), ('NO', False), ('예', True), ('아니오', False)])
def test_http_verdicts(fresh, answer, verdict):
  server, _ = fresh
  server.script.append(answer)
  judge = _http_judge(server)
  assert _ask(judge) is verdict
  assert judge.stats == judge_lib.JudgeStats(calls=1, cache_hits=0, requests=1, failures=0)


def test_request_is_a_chat_completions_payload(fresh):
  server, _ = fresh
  judge = judge_lib.HttpJudge(server.base_url + '/v1/', 'luckystar-judge', api_key='sk-test')
  assert _ask(judge) is True
  (request,) = server.requests
  assert request['path'] == '/v1/chat/completions'
  assert request['headers']['Authorization'] == 'Bearer sk-test'
  assert request['headers']['Content-Type'] == 'application/json'
  body = request['body']
  assert body['model'] == 'luckystar-judge'
  assert body['temperature'] == 0
  assert [m['role'] for m in body['messages']] == ['user']
  content = body['messages'][0]['content']
  assert all(part in content for part in (QUESTION, REFERENCE, CANDIDATE, 'YES or NO'))


def test_cache_answers_repeats_without_a_request(fresh):
  server, _ = fresh
  judge = _http_judge(server, cache_size=2)
  assert _ask(judge) is True
  assert _ask(judge) is True
  assert len(server.requests) == 1
  assert judge.stats.cache_hits == 1 and judge.stats.calls == 2
  _ask(judge, criterion='language')  # another criterion is another question
  _ask(judge, candidate='9')         # evicts the oldest entry (cache_size=2)
  assert len(server.requests) == 3
  _ask(judge)
  assert len(server.requests) == 4


def test_garbage_is_a_counted_failure_and_not_cached(fresh):
  server, delays = fresh
  server.script += ['I cannot say.', 'not json']
  judge = _http_judge(server)
  assert _ask(judge) is None
  assert _ask(judge) is None
  assert _ask(judge) is True  # failures are not cached: the third call asks again
  assert judge.stats == judge_lib.JudgeStats(calls=3, cache_hits=0, requests=3, failures=2)
  assert delays == []  # a bad answer is not retried


def test_server_error_is_retried_with_backoff(fresh):
  server, delays = fresh
  server.script += [500, 503]
  judge = _http_judge(server)
  assert _ask(judge) is True
  assert judge.stats.requests == 3 and judge.stats.failures == 0
  assert delays == [0.5, 1.0]


def test_gives_up_after_retries(fresh):
  server, delays = fresh
  server.script += [500, 502, 500]
  judge = _http_judge(server, retries=2)
  assert _ask(judge) is None
  assert judge.stats.requests == 3 and judge.stats.failures == 1
  assert len(delays) == 2


def test_client_error_is_not_retried(fresh):
  server, delays = fresh
  server.script.append(400)
  judge = _http_judge(server)
  assert _ask(judge) is None
  assert len(server.requests) == 1 and judge.stats.failures == 1 and delays == []


def test_timeout_is_retried(fresh):
  server, _ = fresh
  server.script += ['hang', 'NO']
  judge = _http_judge(server, timeout_s=0.2, retries=1)
  assert _ask(judge) is False
  assert judge.stats.requests == 2 and judge.stats.failures == 0
  server.release.set()


def test_connection_refused_is_retried_then_fails(fresh):
  with socket.socket() as sock:  # a port nobody listens on
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
  judge = judge_lib.HttpJudge(f'http://127.0.0.1:{port}', 'm', retries=1, backoff_s=0.0, timeout_s=1.0)
  assert _ask(judge) is None
  assert judge.stats.requests == 2 and judge.stats.failures == 1


def test_model_judge_shares_prompt_cache_and_parsing():
  prompts = []

  def generate_fn(prompt_text):
    prompts.append(prompt_text)
    return {'nine': 'Yes, they are the same.', '10': 'NO'}.get(prompt_text.split('[Candidate]\n')[1].split('\n')[0],
                                                               'hmm')

  judge = judge_lib.ModelJudge(generate_fn)
  assert _ask(judge) is True
  assert _ask(judge) is True
  assert _ask(judge, candidate='10') is False
  assert _ask(judge, candidate='??') is None
  assert len(prompts) == 3
  assert prompts[0] == judge_lib.render_prompt(QUESTION, REFERENCE, CANDIDATE, 'equivalent')
  assert judge.stats == judge_lib.JudgeStats(calls=4, cache_hits=1, requests=3, failures=1)
  assert judge.stats.as_metrics()['judge/failures'] == 1


def test_model_judge_errors():
  assert judge_lib.ModelJudge(lambda prompt: None)(QUESTION, REFERENCE, CANDIDATE, criterion='equivalent') is None

  def broken(prompt):
    raise RuntimeError('model exploded')

  with pytest.raises(RuntimeError, match='exploded'):  # an in-process bug propagates
    _ask(judge_lib.ModelJudge(broken))
  with pytest.raises(TypeError, match='generate_fn'):
    judge_lib.ModelJudge('not callable')
  with pytest.raises(ValueError, match='unknown judge criterion'):
    _ask(judge_lib.ModelJudge(lambda prompt: 'YES'), criterion='equivalence')


@pytest.mark.parametrize('text, verdict', [
    ('YES', True), ('yes.', True), ('**No**', False), ('No. The values differ; yes, both are numbers.', False),
    ('The answer is YES.', True), ('네', True), ('예, 같습니다.', True), ('아니요', False), ('아니오.', False),
    ('<think>Is 9 nine? yes... or no?</think>\nYES', True), ('TRUE', True), ('false', False),
    ('', None), ('maybe', None), ('It could be yes or no.', None), (None, None), ('Yesterday', None),
])
def test_parse_verdict(text, verdict):
  assert judge_lib.parse_verdict(text) is verdict


@pytest.mark.parametrize('base_url', ['http://h:8000', 'http://h:8000/', 'http://h:8000/v1',
                                      'http://h:8000/v1/chat/completions'])
def test_chat_completions_url(base_url):
  assert judge_lib.chat_completions_url(base_url) == 'http://h:8000/v1/chat/completions'


def test_make_judge(monkeypatch):
  assert judge_lib.make_judge(None) is None
  assert judge_lib.make_judge({}) is None
  assert judge_lib.make_judge({'backend': 'none'}) is None
  config = ml_collections.ConfigDict({'backend': 'http', 'base_url': 'http://127.0.0.1:8000', 'model': 'm',
                                      'timeout_s': 3.0, 'retries': 4, 'cache_size': 16})
  judge = judge_lib.make_judge(config)
  assert isinstance(judge, judge_lib.HttpJudge)
  assert (judge.url, judge.model, judge.timeout_s, judge.retries, judge.cache_size, judge.api_key) == (
      'http://127.0.0.1:8000/v1/chat/completions', 'm', 3.0, 4, 16, None)
  monkeypatch.setenv('JUDGE_KEY', 'sk-env')
  assert judge_lib.make_judge({**config.to_dict(), 'api_key_env': 'JUDGE_KEY'}).api_key == 'sk-env'
  assert isinstance(judge_lib.make_judge({'backend': 'model'}, generate_fn=lambda p: 'YES'), judge_lib.ModelJudge)


@pytest.mark.parametrize('config, message', [
    ({'backend': 'vllm'}, 'expected one of'),
    ({'backend': 'http', 'model': 'm'}, 'base_url'),
    ({'backend': 'http', 'base_url': 'http://h'}, 'config.judge.model'),
    ({'backend': 'http', 'base_url': 'http://h', 'model': 'm', 'timeout': 3}, 'unknown keys'),
    ({'backend': 'http', 'base_url': 'http://h', 'model': 'm', 'api_key_env': 'NO_SUCH_VAR_123'}, 'unset'),
    ({'backend': 'model'}, 'generate_fn'),
])
def test_make_judge_errors(config, message):
  with pytest.raises(ValueError, match=message):
    judge_lib.make_judge(config)
