"""`python -m luckystar.serve`: OpenAI-shaped replies equal to `Model.generate`'s, guided choice equal to the
argmax of a direct log-likelihood, errors as OpenAI error bodies, and the command line end to end."""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

from fastapi.testclient import TestClient
import jax
import numpy as np
import pytest

import luckystar
from luckystar import serve
from luckystar import tokenizer as tokenizer_lib
from luckystar.tools import calls as calls_lib
import serve_process

QUESTION = 'What is 17 + 25?'
# tiny-sft calls the calculator for this one in reasoning mode (a math trace of its SFT data).
TOOL_QUESTION = 'Emma has 16 pencils, buys 35 more, and then gives 17 to a friend. How many pencils does Emma have now?'
JUDGE_QUESTION = 'Is 17 + 25 equal to 42? Answer YES or NO.'
MAX_TOKENS = 64
TOOL_MAX_TOKENS = 128


@pytest.fixture(scope='module')
def model():
  return luckystar.load('tiny-sft')


@pytest.fixture(scope='module')
def client(model):
  return TestClient(serve.build_app(model, 'tiny-sft'))


def post(client, body, status=200):
  response = client.post('/v1/chat/completions', json=body)
  assert response.status_code == status, response.text
  return response.json()


def user(text):
  return {'role': 'user', 'content': text}


def system(text):
  return {'role': 'system', 'content': text}


def prompt_tokens(model, messages, mode):
  return len(model.tokenizer.render(messages, mode, add_generation_prompt=True)[0])


# How the request picks the mode: (mode, extra body fields, messages before the question).
MODE_CHOICES = {
    'mode field, reasoning': ('reasoning', {'mode': 'reasoning'}, []),
    'mode field, concise': ('concise', {'mode': 'concise'}, []),
    'preamble, reasoning': ('reasoning', {}, [system(tokenizer_lib.PREAMBLES['reasoning'])]),
    'preamble, concise': ('concise', {}, [system(tokenizer_lib.PREAMBLES['concise'])]),
    'chat_template_kwargs': ('reasoning', {'chat_template_kwargs': {'mode': 'reasoning'}}, []),
    'enable_thinking true': ('reasoning', {'chat_template_kwargs': {'enable_thinking': True}}, []),
    'enable_thinking false': ('concise', {'chat_template_kwargs': {'enable_thinking': False}}, []),
    'default': (serve.DEFAULT_MODE, {}, []),
    'field beats preamble': ('reasoning', {'mode': 'reasoning'}, [system(tokenizer_lib.PREAMBLES['concise'])]),
}


@pytest.mark.fast
@pytest.mark.parametrize('mode, fields, before', MODE_CHOICES.values(), ids=MODE_CHOICES)
def test_reply_equals_generate_in_the_chosen_mode(client, model, mode, fields, before):
  reply = post(client, {'model': 'tiny-sft', 'messages': [*before, user(QUESTION)], 'temperature': 0,
                        'max_tokens': MAX_TOKENS, **fields})
  want = model.generate(QUESTION, mode, max_new_tokens=MAX_TOKENS)
  assert reply['object'] == 'chat.completion' and reply['id'].startswith('chatcmpl-')
  assert reply['model'] == 'tiny-sft' and isinstance(reply['created'], int)
  [choice] = reply['choices']
  assert choice['finish_reason'] == 'stop'
  assert choice['message'] == {'role': 'assistant', 'content': want.text, 'reasoning_content': want.thinking,
                               'tool_calls': []}
  assert (want.thinking is not None) == (mode == 'reasoning')
  # The preamble message selects the mode and is not rendered again after the preamble.
  usage = {'prompt_tokens': prompt_tokens(model, [user(QUESTION)], mode),
           'completion_tokens': len(want.rollout.token_ids)}
  assert reply['usage'] == {**usage, 'total_tokens': sum(usage.values())}


def test_other_system_messages_follow_the_preamble(client, model):
  reply = post(client, {'messages': [system('Be brief.'), user(QUESTION)], 'temperature': 0, 'mode': 'concise',
                        'max_completion_tokens': MAX_TOKENS})
  want = model.generate(QUESTION, 'concise', max_new_tokens=MAX_TOKENS, system='Be brief.')
  assert reply['choices'][0]['message']['content'] == want.text
  assert reply['usage']['prompt_tokens'] == prompt_tokens(model, [system('Be brief.'), user(QUESTION)], 'concise')


def test_a_requests_tools_are_rendered_as_the_exported_template_renders_them(client, model):
  """`tools` sit between the preamble and a system message (as training and our export's chat template show
  them); a bad enable_thinking is a 400 naming it."""
  schema = {'name': 'get_weather', 'description': 'Weather of a city',
            'parameters': {'type': 'object', 'properties': {'city': {'type': 'string'}}}}
  messages = [system('Be brief.'), user(QUESTION)]
  reply = post(client, {'messages': messages, 'mode': 'concise', 'temperature': 0, 'max_tokens': MAX_TOKENS,
                        'tools': [{'type': 'function', 'function': schema}], 'tool_choice': 'auto'})
  want = model.chat(tokenizer_lib.with_tools(messages, [schema]), 'concise', max_new_tokens=MAX_TOKENS)
  assert reply['choices'][0]['message']['content'] == want.text
  rendered = model.tokenizer.render(messages, 'concise', add_generation_prompt=True, tools=[schema])[0]
  assert reply['usage']['prompt_tokens'] == len(rendered) > prompt_tokens(model, messages, 'concise')
  response = client.post('/v1/chat/completions', json={'messages': [user(QUESTION)],
                                                       'chat_template_kwargs': {'enable_thinking': 'yes'}})
  assert response.status_code == 400 and 'chat_template_kwargs.enable_thinking' in response.json()['error']['message']


def test_an_action_comes_back_as_tool_calls_or_runs_with_tools(client, model):
  body = {'messages': [user(TOOL_QUESTION)], 'mode': 'reasoning', 'temperature': 0, 'max_tokens': TOOL_MAX_TOKENS}
  stopped = model.chat([user(TOOL_QUESTION)], 'reasoning', max_new_tokens=TOOL_MAX_TOKENS, tools=lambda *_: None)
  [call] = calls_lib.parse_calls(stopped.actions[-1])
  reply = post(client, body)['choices'][0]
  assert reply['finish_reason'] == 'tool_calls'
  message = reply['message']
  assert message['content'] is None and message['reasoning_content'] == stopped.thinking
  [tool_call] = message['tool_calls']
  assert tool_call['type'] == 'function' and tool_call['id'].startswith('call_')
  assert tool_call['function']['name'] == call['tool_name'] == 'calculator'
  assert json.loads(tool_call['function']['arguments']) == call['parameters']

  # The client runs the tool and sends the conversation back: it renders as our sections.
  result = '34'
  followed = post(client, {**body, 'messages': [user(TOOL_QUESTION), message,
                                                {'role': 'tool', 'tool_call_id': tool_call['id'], 'content': result}]})
  want = model.chat([user(TOOL_QUESTION), {'role': 'assistant', 'thinking': stopped.thinking,
                                           'action': json.dumps(call)}, {'role': 'tool', 'content': result}],
                    'reasoning', max_new_tokens=TOOL_MAX_TOKENS)
  assert followed['choices'][0]['message']['content'] == want.text

  # --tools: the calculator runs inside the reply, and the final answer comes back.
  with_tools = TestClient(serve.build_app(model, 'tiny-sft', tools=True))
  reply = post(with_tools, body)['choices'][0]
  ran = model.generate(TOOL_QUESTION, 'reasoning', max_new_tokens=TOOL_MAX_TOKENS)
  assert ran.rollout.tool_results and ran.response is not None
  assert reply['finish_reason'] == 'stop' and reply['message']['tool_calls'] == []
  assert reply['message']['content'] == ran.text
  executed = reply['message']['executed_tool_calls']   # the calls that ran inside the reply, with their results
  assert [call['function']['name'] for call in executed] == ['calculator'] * len(ran.rollout.tool_results)
  assert [call['result'] for call in executed] == ran.rollout.tool_results


def direct_logprob(model, messages, reply, mode):
  """log P(reply as the whole assistant turn), from one unpadded forward pass."""
  ids, mask = model.tokenizer.render([*messages, {'role': 'assistant', 'response': reply}], mode)
  logprobs = jax.nn.log_softmax(model.logits(np.array([ids]))[0, :-1], axis=-1)
  return float(sum(logprobs[t, ids[t + 1]] for t in range(len(ids) - 1) if mask[t + 1]))


@pytest.mark.fast
@pytest.mark.parametrize('mode', tokenizer_lib.MODES)
def test_guided_choice_picks_the_most_likely_reply(client, model, mode):
  messages = [user(JUDGE_QUESTION)]
  choices = ['YES', 'NO', 'YESTERDAY']
  direct = [direct_logprob(model, messages, c, mode) for c in choices]
  np.testing.assert_allclose(model.reply_logprobs(messages, choices, mode), direct, rtol=1e-4)
  assert abs(direct[0] - direct[1]) > 1e-3, 'a tie would not show which choice the server picks'
  best = choices[int(np.argmax(direct))]
  body = {'messages': messages, 'mode': mode, 'temperature': 1.0}   # a guided choice never samples
  answers = [post(client, {**body, 'guided_choice': order})['choices'][0] for order in (choices, choices[::-1])]
  answers.append(post(client, {**body, 'structured_outputs': {'choice': choices}})['choices'][0])
  for answer in answers:
    assert answer['message']['content'] == best and answer['finish_reason'] == 'stop'
  reply = post(client, {**body, 'guided_choice': choices})
  _, mask = model.tokenizer.render([{'role': 'assistant', 'response': best}], mode)
  assert reply['usage']['completion_tokens'] == sum(mask)
  assert reply['usage']['prompt_tokens'] == prompt_tokens(model, messages, mode)


@pytest.mark.fast
def test_guided_choice_breaks_ties_by_order(client):
  reply = post(client, {'messages': [user(QUESTION)], 'guided_choice': ['same', 'same']})
  assert reply['choices'][0]['message']['content'] == 'same'


BAD_REQUESTS = {
    'not JSON': (b'{"messages": [', 400, 'not valid JSON'),
    'not an object': (b'[]', 400, 'body'),
    'no messages': ({'model': 'tiny-sft'}, 400, 'messages: Field required'),
    'empty messages': ({'messages': []}, 400, 'messages'),
    'unknown role': ({'messages': [{'role': 'robot', 'content': 'hi'}]}, 400, "messages[0].role: unknown role 'robot'"),
    'no content': ({'messages': [{'role': 'user'}]}, 400, 'messages[0]: a user message needs content'),
    'late system message': ({'messages': [user('hi'), system('x')]}, 400, 'at most one system message'),
    'n=0': ({'messages': [user('hi')], 'n': 0}, 400, 'n: Input should be greater than or equal to 1'),
    'n past the limit': ({'messages': [user('hi')], 'n': serve.MAX_N + 1}, 400, 'n: Input should be less than'),
    'stop': ({'messages': [user('hi')], 'stop': ['\n']}, 400, 'stop sequences are not supported'),
    'unknown mode': ({'messages': [user('hi')], 'mode': 'fast'}, 400, "unknown mode 'fast'"),
    'negative temperature': ({'messages': [user('hi')], 'temperature': -1}, 400, 'temperature'),
    'empty choice': ({'messages': [user('hi')], 'guided_choice': []}, 400, 'the guided choice is empty'),
    'json schema': ({'messages': [user('hi')], 'structured_outputs': {'json': {}}}, 400, 'only "choice"'),
    'bad tool arguments': ({'messages': [user('hi'), {'role': 'assistant', 'tool_calls': [
        {'id': 'call_0', 'type': 'function', 'function': {'name': 'calculator', 'arguments': '[1]'}}]}]},
        400, 'must be the JSON text of an object'),
    'over the context': ({'messages': [user('hi')], 'max_tokens': 10**6}, 400, 'maximum context length is 2048'),
    'wrong model': ({'model': 'gpt-4o', 'messages': [user('hi')]}, 404, 'The model `gpt-4o` does not exist'),
}


@pytest.mark.fast
@pytest.mark.parametrize('body, status, message', BAD_REQUESTS.values(), ids=BAD_REQUESTS)
def test_bad_requests_get_openai_errors(client, body, status, message):
  content = body if isinstance(body, bytes) else json.dumps(body).encode()
  response = client.post('/v1/chat/completions', content=content, headers={'Content-Type': 'application/json'})
  assert response.status_code == status, response.text
  error = response.json()['error']
  assert message in error['message']
  assert error['type'] == {400: 'BadRequestError', 404: 'NotFoundError'}[status] and error['code'] == status


@pytest.mark.fast
def test_a_failure_inside_is_a_500_without_a_traceback(model):
  broken = dataclasses.replace(model)

  def chat(*args, **kwargs):
    raise RuntimeError('the accelerator fell over')
  broken.chat = chat
  response = TestClient(serve.build_app(broken, 'tiny-sft'), raise_server_exceptions=False).post(
      '/v1/chat/completions', json={'messages': [user('hi')]})
  assert response.status_code == 500
  error = response.json()['error']
  assert error['type'] == 'InternalServerError' and 'the accelerator fell over' in error['message']
  assert 'Traceback' not in response.text


@pytest.mark.fast
def test_models_health_and_unknown_routes(client):
  models = client.get('/v1/models').json()
  assert models['object'] == 'list' and [m['id'] for m in models['data']] == ['tiny-sft']
  assert models['data'][0]['object'] == 'model' and models['data'][0]['max_model_len'] == 2048
  assert client.get('/health').status_code == 200
  missing = client.get('/v1/completions')
  assert missing.status_code == 404 and missing.json()['error']['type'] == 'NotFoundError'


def test_the_command_line_serves_over_http(model):
  with serve_process.running_server('tiny-sft', '--model_name=judge') as base_url:
    with urllib.request.urlopen(base_url + '/v1/models', timeout=60) as response:
      assert [m['id'] for m in json.load(response)['data']] == ['judge']
    body = {'model': 'judge', 'messages': [user(QUESTION)], 'temperature': 0, 'max_tokens': MAX_TOKENS}
    request = urllib.request.Request(base_url + '/v1/chat/completions', data=json.dumps(body).encode(),
                                     headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(request, timeout=120) as response:
      reply = json.load(response)
    assert reply['choices'][0]['message']['content'] == model.generate(
        QUESTION, serve.DEFAULT_MODE, max_new_tokens=MAX_TOKENS).text
    wrong = urllib.request.Request(base_url + '/v1/chat/completions', data=json.dumps(
        {**body, 'model': 'tiny-sft'}).encode(), headers={'Content-Type': 'application/json'})
    with pytest.raises(urllib.error.HTTPError) as raised:
      urllib.request.urlopen(wrong, timeout=60)
    assert raised.value.code == 404 and json.load(raised.value)['error']['type'] == 'NotFoundError'
  with pytest.raises(urllib.error.URLError):   # stopped at the end of the with-block
    urllib.request.urlopen(base_url + '/health', timeout=10)


def test_bad_command_lines_say_one_line():
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  with socket.socket() as taken:
    taken.bind(('127.0.0.1', 0))
    taken.listen()
    port = taken.getsockname()[1]
    cases = {  # arguments → the line on stderr
        '--init_from=/no/such/model': 'error: /no/such/model: no such bundled model or directory',
        '': 'error: flag --init_from=None',
        '--init_from=tiny-sft --port=70000': 'error: flag --port=70000',
        f'--init_from=tiny-sft --port={port}': f'error: --host=127.0.0.1 --port={port}: cannot listen there',
    }
    runs = {args: subprocess.Popen([sys.executable, '-m', 'luckystar.serve', *args.split()], cwd=serve_process.ROOT,
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for args in cases}   # side by side: each is mostly an interpreter importing jax
    for args, run in runs.items():
      stdout, stderr = run.communicate(timeout=120)
      assert run.returncode != 0 and stdout == '', (args, stdout, stderr)
      assert cases[args] in stderr and 'Traceback' not in stderr, (args, stderr)
