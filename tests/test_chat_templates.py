"""Chat formats against the real ones (docs/models.md): the Cohere layout equals Cohere's own renderer
(`cohere_melody.render_cmd3`) from the first user turn on, and every export's chat template renders what
luckystar's training renders, through transformers' `apply_chat_template` as vLLM calls it."""

import json

import jax
import numpy as np
import pytest

import cohere_checkpoint
import luckystar
from luckystar import api
from luckystar import model as model_lib
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import conversations, suites
from luckystar.model.config import ModelConfig, pattern_layer_types
from luckystar.tokenizer import formats

transformers = pytest.importorskip('transformers')

SQL = 'SELECT name FROM employees ORDER BY salary DESC LIMIT 1'
SCHEMA = {'name': 'get_weather', 'description': '도시의 날씨', 'parameters': {
    'type': 'object', 'properties': {'city': {'type': 'string'}}, 'required': ['city']}}


def _call(name, **parameters):
  return {'tool_name': name, 'parameters': parameters}


def _action(*calls):
  return json.dumps(calls[0] if len(calls) == 1 else list(calls), ensure_ascii=False)


def _user(text):
  return {'role': 'user', 'content': text}


# Conversations in our shape, each with the mode it is rendered in: the shapes luckystar trains and rolls out.
CONVERSATIONS = [
    ('concise', [_user('What is 2+3?')]),
    ('reasoning', [_user('2+3은?'), {'role': 'assistant', 'thinking': 'Add.', 'response': '5입니다.'}]),
    ('reasoning', [
        {'role': 'system', 'content': 'Database schema: employees(id, name, salary)'},
        _user('급여가 가장 높은 직원은 누구인가요?'),
        {'role': 'assistant', 'thinking': 'Query the employees table.',
         'action': _action(_call('execute_sql', query=SQL))},
        {'role': 'tool', 'content': 'name\n김민수\n(1 rows)'},
        {'role': 'assistant', 'thinking': 'The top earner is 김민수.', 'response': '김민수입니다.'}]),
    ('concise', [_user('Weather in Seoul and Busan?'), {'role': 'assistant', 'action': _action(
        _call('get_weather', city='Seoul'), _call('get_weather', city='Busan'))}]),
    ('reasoning', [
        _user('(71 + 85 + 91) / 3 그리고 2/0'),
        {'role': 'assistant', 'thinking': 'Two calculations.',
         'action': _action(_call('calculator', expression='(71 + 85 + 91) / 3'),
                           _call('calculator', expression='2/0'))},
        {'role': 'tool', 'content': '247/3'}, {'role': 'tool', 'content': 'ERROR: division by zero'},
        {'role': 'assistant', 'thinking': 'The second fails.', 'response': '247/3; 2/0은 정의되지 않습니다.'}]),
    ('reasoning', [   # several actions in a row: call ids count on across the conversation
        _user('Sum 1..3, then double it.'),
        {'role': 'assistant', 'thinking': 'First the sum.',
         'action': _action(_call('calculator', expression='1+2+3'))},
        {'role': 'tool', 'content': '6'},
        {'role': 'assistant', 'thinking': 'Now double.',
         'action': _action(_call('calculator', expression='6*2'))},
        {'role': 'tool', 'content': '12'},
        {'role': 'assistant', 'thinking': 'Done.', 'response': '12'}]),
    ('concise', [_user('안녕하세요'), {'role': 'assistant', 'response': '안녕하세요! 무엇을 도와드릴까요?'},
                 _user('"따옴표"와 \\ 역슬래시, 탭\t그리고\n줄바꿈')]),
    ('reasoning', [_user('Order 3 items: {"a": [1, 2]}'),
                   {'role': 'assistant', 'thinking': 'Nested parameters.',
                    'action': _action(_call('place_order', items=[{'sku': 'a', 'qty': 1}, {'sku': 'b', 'qty': 2}],
                                            note='빠른 배송', rush=True, budget=12.5, coupon=None))},
                   {'role': 'tool', 'content': '{"order_id": 7, "status": "ok"}'}]),
    ('concise', [_user('Q1'), {'role': 'assistant', 'response': 'A1'}, _user('Q2'),
                 {'role': 'assistant', 'action': _action(_call('lookup', key='q2'))},
                 {'role': 'tool', 'content': 'found'}, {'role': 'assistant', 'response': 'A2'}, _user('Q3')]),
    ('reasoning', [_user('Three lookups at once.'),
                   {'role': 'assistant', 'thinking': 'In parallel.',
                    'action': _action(*[_call('lookup', key=k) for k in ('x', 'y', 'z')])},
                   {'role': 'tool', 'content': '1'}, {'role': 'tool', 'content': ''}, {'role': 'tool', 'content': '3'},
                   {'role': 'assistant', 'thinking': 'y is empty.', 'response': '1, -, 3'}]),
]


def _training_conversations():
  """Gold SFT conversations as training renders them: every task but NL2SQL (its databases), both modes."""
  found = []
  for task in ('math', 'function_calling', 'chat', 'korean_mc'):
    for example in suites.load(task, 'train')[:3]:
      for mode in ('reasoning', 'concise'):
        found.append((mode, conversations.messages(example, mode)))
  return found


def to_openai(messages):
  """Our messages in OpenAI's shape, as a vLLM client sends them (tool call arguments as objects, as vLLM
  hands them to the template)."""
  out = []
  for message in messages:
    if message['role'] != 'assistant':
      out.append(dict(message))
      continue
    turn = {'role': 'assistant', 'content': message.get('response')}
    if message.get('thinking') is not None:
      turn['reasoning_content'] = message['thinking']
    if message.get('action') is not None:
      calls = json.loads(message['action'])
      turn['tool_calls'] = [{'id': f'call_{i}', 'type': 'function', 'function': {
          'name': call['tool_name'], 'arguments': call['parameters']}}
          for i, call in enumerate(calls if isinstance(calls, list) else [calls])]
    out.append(turn)
  return out


# ---- the Cohere layout against Cohere's renderer --------------------------------------------------------

def to_melody(messages):
  """Our messages as `cohere_melody.render_cmd3` takes them."""
  out, ids = [], iter(range(1000))
  pending = []   # the ids of the last action's calls, for its tool messages
  for message in messages:
    role = message['role']
    if role == 'user':
      out.append({'role': 'User', 'content': [{'type': 'text', 'text': message['content']}]})
    elif role == 'tool':
      out.append({'role': 'Tool', 'tool_call_id': pending.pop(0),
                  'content': [{'type': 'text', 'text': message['content']}]})
    elif message.get('action') is not None:
      calls = json.loads(message['action'])
      calls = calls if isinstance(calls, list) else [calls]
      pending = [f'id-{next(ids)}' for _ in calls]
      out.append({'role': 'Chatbot', 'content': ([{'type': 'text', 'text': message['thinking']}]
                                                 if message.get('thinking') is not None else []),
                  'tool_calls': [{'id': i, 'name': call['tool_name'], 'parameters': json.dumps(
                      call['parameters'], ensure_ascii=False)} for i, call in zip(pending, calls)]})
    else:
      thinking = ([{'type': 'thinking', 'thinking': message['thinking']}]
                  if message.get('thinking') is not None else [])
      out.append({'role': 'Chatbot', 'content': [*thinking, {'type': 'text', 'text': message['response']}]})
  return out


@pytest.fixture(scope='module')
def cohere_tok(cohere_dir):
  return tokenizer_lib.from_dir(cohere_dir)


@pytest.mark.fast
@pytest.mark.parametrize('index', range(len(CONVERSATIONS)))
def test_cohere_layout_equals_cohere_melody_from_the_first_user_turn_on(cohere_tok, index):
  """Ids equal Cohere's renderer's text tokenized with the checkpoint's tokenizer (special tokens split out),
  after the system turn (ours: the paper's mode preambles) and with the generation prompt, in both modes."""
  melody = pytest.importorskip('cohere_melody')
  import tokenizers
  mode, messages = CONVERSATIONS[index]
  system = [m for m in messages if m['role'] == 'system']
  rest = [m for m in messages if m['role'] != 'system']
  text = melody.render_cmd3({
      'messages': to_melody(rest), 'skip_preamble': True, 'dev_instruction': 'S',
      'reasoning_type': 'enabled' if mode == 'reasoning' else 'disabled'})
  system_turn = '<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>S<|END_OF_TURN_TOKEN|>'
  assert text.startswith(system_turn)
  plain = tokenizers.Tokenizer.from_str(cohere_tok.codec.tokenizer_json)   # special-token strings are tokens here
  theirs = plain.encode(text[len(system_turn):], add_special_tokens=False).ids
  ours, _ = cohere_tok.render(system + rest, mode, add_generation_prompt=True)
  our_system = ours.index(cohere_tok.end_of_turn_id) + 1
  assert ours[our_system:] == theirs, (cohere_tok.codec.hf.decode(ours[our_system:], skip_special_tokens=False), text)


# ---- exports render what was trained ----------------------------------------------------------------------

CONFIG = ModelConfig(vocab_size=8000, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                     num_kv_heads=2, layer_types=pattern_layer_types(2, 2), sliding_window=8,
                     max_position_embeddings=256)


@pytest.fixture(scope='module')
def exports(tmp_path_factory, cohere_dir):
  """(format name, float or int4) → an exported directory: the bundled tokenizer on a random small model,
  and the Cohere-format checkpoint (its own template in chat_template.jinja)."""
  pytest.importorskip('torch')
  root = tmp_path_factory.mktemp('exports')
  ours = api.Model(CONFIG, model_lib.init(CONFIG, jax.random.key(0)), tokenizer_lib.default())
  cohere = luckystar.load(cohere_dir)
  found = {}
  for name, model in (('luckystar', ours), ('cohere', cohere)):
    for kind in ('float', 'int4'):
      path = root / f'{name}-{kind}'
      model.save_hf(path, quantization='int4' if kind == 'int4' else None, group_size=32)
      found[name, kind] = path
  return found


CASES = [(mode, messages) for mode, messages in CONVERSATIONS] + _training_conversations()


@pytest.mark.parametrize('kind', ['float', 'int4'])
@pytest.mark.parametrize('name', ['luckystar', 'cohere'])
def test_exported_chat_templates_render_exactly_what_luckystar_renders(exports, name, kind):
  """≥ 20 conversations (tools given through tools=, tool results, several turns, Korean and English) in both
  modes (enable_thinking), with the generation prompt and, for whole training conversations, without it."""
  path = exports[name, kind]
  ours = luckystar.load(path).tokenizer
  theirs = transformers.AutoTokenizer.from_pretrained(path)
  assert ours.format.name == name and len(CASES) >= 20
  for k, (mode, messages) in enumerate(CASES):
    openai = to_openai(messages)
    for tools in (None, [{'type': 'function', 'function': SCHEMA}]):
      for generation_prompt in (True, False):
        want, _ = ours.render(messages, mode, add_generation_prompt=generation_prompt, tools=tools)
        got = theirs.apply_chat_template(openai, tools=tools, add_generation_prompt=generation_prompt,
                                         enable_thinking=mode == 'reasoning', tokenize=True, return_dict=False)
        assert list(got) == want, (k, mode, generation_prompt, theirs.decode(got), theirs.decode(want))
  # The old `mode` kwarg is an alias; neither kwarg is concise, as luckystar.serve answers.
  messages = CASES[1][1]
  for kwargs, mode in (({'mode': 'reasoning'}, 'reasoning'), ({}, 'concise')):
    got = theirs.apply_chat_template(to_openai(messages), tokenize=True, return_dict=False, **kwargs)
    assert list(got) == ours.render(messages, mode)[0]


def test_a_transformers_5_checkpoints_own_template_is_kept_beside_ours(exports, cohere_dir):
  path = exports['cohere', 'float']
  theirs = transformers.AutoTokenizer.from_pretrained(path)
  assert (path / 'chat_template.jinja').read_text() == json.loads((path / 'tokenizer_config.json').read_text())[
      'chat_template']
  source = [{'role': 'user', 'content': 'hi'}]
  kept = theirs.apply_chat_template(source, chat_template='source', tokenize=False, add_generation_prompt=True)
  original = transformers.AutoTokenizer.from_pretrained(cohere_dir).apply_chat_template(
      source, tokenize=False, add_generation_prompt=True)
  assert kept == original and kept != theirs.apply_chat_template(source, tokenize=False, add_generation_prompt=True)
  # A tools request still picks ours: the source's templates never take the `tool_use` name.
  assert all(p.name.startswith('source') for p in (path / 'additional_chat_templates').iterdir())


@pytest.mark.fast
def test_tools_render_as_the_function_calling_data_lays_them_out():
  from luckystar.data import function_calling
  tok = tokenizer_lib.default()
  example = next(e for e in suites.load('function_calling', 'train') if e.language == 'ko')
  functions = example.meta['functions']
  trained, _ = tok.render(conversations.prompt(example), 'reasoning', add_generation_prompt=True)
  given, _ = tok.render([_user(example.prompt)], 'reasoning', add_generation_prompt=True,
                        tools=[{'type': 'function', 'function': f} for f in functions])
  assert example.system == function_calling.tool_system(functions) and given == trained
  assert np.array_equal(tok.render([_user('x')], 'concise', tools=[SCHEMA])[0],
                        tok.render([{'role': 'system', 'content': formats.tools_text([SCHEMA])}, _user('x')],
                                   'concise')[0])
