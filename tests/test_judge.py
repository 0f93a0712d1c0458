"""The LLM judge against a scripted OpenAI-compatible server on 127.0.0.1, and with a fake model; the
stage's judge (engine.judging): config checks, the verdict cache kept in the workdir, counters."""

import http.server
import json
import socket
import threading
import time
import types

import ml_collections
import pytest

from luckystar import config as config_lib
from luckystar import errors
from luckystar.engine import judging
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
  assert judge_lib.make_judge(config_lib.base('rlvr').judge) is None   # the shipped default: off


@pytest.mark.parametrize('config, message', [
    ({'backend': 'vllm'}, "config.judge.backend='vllm' is not one of"),
    ({'backend': 'http', 'model': 'm'}, 'config.judge.base_url'),
    ({'backend': 'http', 'base_url': 'http://h'}, 'config.judge.model'),
    ({'backend': 'http', 'base_url': 'h:8000', 'model': 'm'}, 'must start with http://'),
    ({'backend': 'http', 'base_url': 'http://h', 'model': 'm', 'timeout': 3}, 'config.judge.timeout is not a judge'),
    ({'backend': 'http', 'base_url': 'http://h', 'model': 'm', 'retries': -1}, 'config.judge.retries=-1'),
    ({'backend': 'http', 'base_url': 'http://h', 'model': 'm', 'api_key_env': 'NO_SUCH_VAR_123'}, 'unset'),
    ({'backend': 'model'}, 'generate_fn'),
])
def test_make_judge_errors(config, message):
  with pytest.raises(ValueError, match=message):
    judge_lib.make_judge(config)


# ---- guided choice and failures ---------------------------------------------------------------------

def test_guided_choice_constrains_the_answer_in_both_vllm_spellings(fresh):
  server, _ = fresh
  assert _ask(_http_judge(server)) is True   # on by default
  assert _ask(_http_judge(server, guided_choice=False), candidate='9') is True
  guided, free = (request['body'] for request in server.requests)
  assert guided['guided_choice'] == ['YES', 'NO']                      # vLLM before the rename
  assert guided['structured_outputs'] == {'choice': ['YES', 'NO']}     # vLLM after it
  assert 'guided_choice' not in free and 'structured_outputs' not in free
  config = {'backend': 'http', 'base_url': server.base_url, 'model': 'm', 'guided_choice': False}
  assert judge_lib.make_judge(config).guided_choice is False


def test_a_refused_extension_says_how_to_turn_it_off(fresh):
  server, _ = fresh
  server.script += [400, 400]
  judge = _http_judge(server)
  assert _ask(judge) is None and judge.stats.failures == 1
  with pytest.raises(judge_lib.JudgeError, match='guided_choice=False'):
    judge._complete('a prompt')


def test_a_closed_port_fails_at_once_and_is_counted(fresh):
  _, delays = fresh
  with socket.socket() as sock:  # a port nobody listens on
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
  timeout_s = 60.0
  judge = judge_lib.HttpJudge(f'http://127.0.0.1:{port}', 'm', retries=0, backoff_s=5.0, timeout_s=timeout_s)
  start = time.monotonic()
  assert _ask(judge) is None
  # A refused connection is not a timeout: it fails long before timeout_s (a loose bound, never flaky).
  assert time.monotonic() - start < timeout_s / 2
  assert judge.stats == judge_lib.JudgeStats(calls=1, cache_hits=0, requests=1, failures=1)
  assert delays == []   # retries=0: no backoff either
  assert _ask(judge) is None and judge.stats.failures == 2   # a failure is not cached


# ---- config.judge and the stage's judge (engine.judging) -------------------------------------------

def test_config_check_names_the_judge_key():
  config = config_lib.base('rlvr')
  config_lib.check(config)   # the default (off) is valid
  for change, message in [
      (dict(backend='vllm'), "config.judge.backend='vllm' is not one of ('none', 'http', 'model')"),
      (dict(backend='http', model='m'), "config.judge.backend='http' needs config.judge.base_url"),
      (dict(backend='model'), "config.judge.backend='model' needs config.judge.init_from"),
      (dict(timeout_s=0.0), 'config.judge.timeout_s=0.0 is not a number > 0'),
      (dict(retries=-1), 'config.judge.retries=-1 is not an integer ≥ 0'),
  ]:
    bad = config_lib.base('rlvr')
    bad.judge.update(change)
    with pytest.raises(errors.UserError, match=message.replace('(', r'\(').replace(')', r'\)')):
      config_lib.check(bad)
  bad = config_lib.base('rlvr')
  bad.judge.timeout = 3
  with pytest.raises(errors.UserError, match='config.judge.timeout is not a judge setting'):
    config_lib.check(bad)
  pipeline = config_lib.base('pipeline')   # a pipeline stage's own judge is checked too, by its full key
  pipeline.pipeline = ml_collections.ConfigDict(dict(stages=dict(rlvr=config_lib.base('rlvr').to_dict())))
  pipeline.pipeline.stages.rlvr.judge.backend = 'openai'
  with pytest.raises(errors.UserError, match="config.pipeline.stages.rlvr.judge.backend='openai'"):
    config_lib.check(pipeline)


def _stage_config(server, **judge):
  config = config_lib.base('rlvr')
  config.judge.update({'backend': 'http', 'base_url': server.base_url, 'model': 'luckystar-judge', 'retries': 0,
                       **judge})
  return config


def test_off_by_default(tmp_path):
  assert judging.make(config_lib.base('rlvr'), tmp_path) is None
  assert judging.make(ml_collections.ConfigDict(dict(stage='rlvr')), tmp_path) is None   # a config from before
  judging.save(None, tmp_path)
  assert judging.metrics(None) == {} and not (tmp_path / judging.CACHE_FILE).exists()


def test_the_verdict_cache_persists_in_the_workdir(fresh, tmp_path):
  server, _ = fresh
  server.script += ['YES', 'NO']
  judge = judging.make(_stage_config(server), tmp_path)
  assert _ask(judge) is True and _ask(judge, candidate='10') is False
  judging.save(judge, tmp_path)
  assert judging.metrics(judge) == {'judge/calls': 2, 'judge/cache_hits': 0, 'judge/requests': 2, 'judge/failures': 0}
  again = judging.make(_stage_config(server), tmp_path)   # a re-run on the same workdir
  assert _ask(again) is True and _ask(again, candidate='10') is False
  assert len(server.requests) == 2
  assert judging.metrics(again) == {'judge/calls': 2, 'judge/cache_hits': 2, 'judge/requests': 0,
                                    'judge/failures': 0}
  saved = json.loads((tmp_path / judging.CACHE_FILE).read_text())
  assert saved['fingerprint'] == judge.identity and len(saved['verdicts']) == 2
  assert judge.identity['url'] == server.base_url + '/v1/chat/completions'
  assert judge.identity['prompt'] == judge_lib.prompt_digest()
  (tmp_path / judging.CACHE_FILE).unlink()
  judging.save(again, tmp_path)      # nothing new since it was loaded: not rewritten
  assert not (tmp_path / judging.CACHE_FILE).exists()


def test_a_cache_of_another_judge_is_ignored(fresh, tmp_path):
  server, _ = fresh
  judge = judging.make(_stage_config(server), tmp_path)
  assert _ask(judge) is True
  judging.save(judge, tmp_path)
  other = judging.make(_stage_config(server, model='another-judge'), tmp_path)   # no error
  assert _ask(other) is True
  assert len(server.requests) == 2 and other.stats.cache_hits == 0
  judging.save(other, tmp_path)
  assert json.loads((tmp_path / judging.CACHE_FILE).read_text())['fingerprint']['model'] == 'another-judge'
  (tmp_path / judging.CACHE_FILE).write_text('{not json')   # a damaged cache is no error either
  assert judging.make(_stage_config(server), tmp_path).verdicts() == {}


def test_a_judge_server_that_is_down_never_stops_the_stage(tmp_path):
  with socket.socket() as sock:
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
  config = config_lib.base('rlvr')
  config.judge.update(dict(backend='http', base_url=f'http://127.0.0.1:{port}', model='m', retries=0))
  judge = judging.make(config, tmp_path)
  assert _ask(judge) is None
  judging.save(judge, tmp_path)
  assert judging.metrics(judge)['judge/failures'] == 1


def test_model_backend_asks_init_from_greedy_and_concise(monkeypatch, tmp_path):
  asked = []

  class Model:
    tokenizer = object()

    def generate(self, prompt, mode, **options):
      asked.append((mode, options))
      return types.SimpleNamespace(text='YES')

  loaded = []
  monkeypatch.setattr(judging.loading, 'load', lambda name: loaded.append(name) or Model())
  config = config_lib.base('rlvr')
  config.judge.update(dict(backend='model', init_from='tiny-sft', max_tokens=6))
  judge = judging.make(config, tmp_path)
  assert _ask(judge) is True and loaded == ['tiny-sft']
  assert asked == [('concise', {'max_new_tokens': 6, 'temperature': 0.0, 'max_tool_turns': 0})]
  assert judge.identity == {'backend': 'model', 'prompt': judge_lib.prompt_digest(), 'init_from': 'tiny-sft',
                            'step': None}
  config.judge.init_from = str(tmp_path / 'no_such_model')
  monkeypatch.undo()
  with pytest.raises(errors.UserError, match='config.judge.init_from='):
    judging.make(config, tmp_path)


def test_a_local_server_is_reached_past_a_proxy_setting(fresh, monkeypatch):
  server, _ = fresh
  for name in ('no_proxy', 'NO_PROXY'):
    monkeypatch.delenv(name, raising=False)
  for name in ('http_proxy', 'HTTP_PROXY'):
    monkeypatch.setenv(name, 'http://127.0.0.1:9')   # nothing listens there: a proxied request would fail
  judge = _http_judge(server, retries=0)
  assert _ask(judge) is True and judge.stats.failures == 0
