"""A checkpoint's own tokenizer and chat format: Cohere's, on a `tokenizers` BPE (tests/cohere_checkpoint.py).
Rendering matches golden token strings written from the format and the checkpoint's chat template; a
generated turn parses back into our sections; transformers loads the export with the same logits."""

import json

import numpy as np
import pytest

import cohere_checkpoint
import luckystar
from luckystar import tokenizer as tokenizer_lib
from luckystar.tokenizer import codecs, formats

PREAMBLE = tokenizer_lib.PREAMBLES['reasoning']
QUERY = 'SELECT name FROM employees ORDER BY salary DESC LIMIT 1'
ACTION = json.dumps({'tool_name': 'execute_sql', 'parameters': {'query': QUERY}})
CONVERSATION = [
    {'role': 'system', 'content': 'Database schema: employees(id, name, salary)'},
    {'role': 'user', 'content': '급여가 가장 높은 직원은 누구인가요?'},
    {'role': 'assistant', 'thinking': 'Query the employees table.', 'action': ACTION},
    {'role': 'tool', 'content': '[["김민수"]]'},
    {'role': 'assistant', 'thinking': 'The top earner is 김민수.', 'response': '김민수입니다.'},
]
# Written by hand from the Cohere format (docs/models.md), not from our code: Cohere's renderer's layout
# (tests/test_chat_templates.py compares with the renderer itself).
GOLDEN = (
    '<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + PREAMBLE + '\n\nDatabase schema: employees(id, name, '
    'salary)<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>급여가 가장 높은 직원은 누구인가요?'
    '<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>Query the employees table.'
    '<|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "execute_sql", "parameters": '
    '{"query": "' + QUERY + '"}}\n]<|END_ACTION|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>'
    '<|START_TOOL_RESULT|>[\n    {\n        "tool_call_id": "0",\n        "results": {\n            "0": '
    '{"content": "[[\\"김민수\\"]]"}\n        },\n        "is_error": null\n    }\n]'
    '<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>The top '
    'earner is 김민수.<|END_THINKING|><|START_RESPONSE|>김민수입니다.<|END_RESPONSE|><|END_OF_TURN_TOKEN|>')


@pytest.fixture(scope='module')
def tok(cohere_dir):
  return tokenizer_lib.from_dir(cohere_dir)


def _with_specials(tok, ids):
  return tok.codec.hf.decode(ids, skip_special_tokens=False)


@pytest.mark.fast
def test_auto_detects_cohere_and_renders_the_golden_token_strings(tok):
  assert tok.format is formats.COHERE and tok.codec.backend == 'tokenizers'
  assert tok.vocab_size == cohere_checkpoint.VOCAB_SIZE and tok.vocab_size % 8
  ids, mask = tok.render(CONVERSATION, 'reasoning')
  assert _with_specials(tok, ids) == GOLDEN
  assert ids.count(tok.bos_id) == 1 and ids[0] == tok.bos_id   # one BOS, never two
  assert tok.stop_ids == (tok.codec.token_id('<|END_OF_TURN_TOKEN|>'), tok.codec.token_id('<|END_ACTION|>'))
  # The loss covers the assistant turns after their header, END_OF_TURN included, and nothing else.
  trained = _with_specials(tok, [i for i, m in zip(ids, mask) if m])
  assert trained == ('<|START_THINKING|>Query the employees table.<|END_THINKING|><|START_ACTION|>'
                     + GOLDEN.split('<|START_ACTION|>')[1].split('<|END_OF_TURN_TOKEN|>')[0]
                     + '<|END_OF_TURN_TOKEN|><|START_THINKING|>The top earner is 김민수.<|END_THINKING|>'
                     '<|START_RESPONSE|>김민수입니다.<|END_RESPONSE|><|END_OF_TURN_TOKEN|>')


@pytest.mark.fast
def test_a_generated_turn_parses_into_our_sections_and_the_tool_round_trip_matches_rendering(tok):
  prompt, _ = tok.render(CONVERSATION[:2], 'reasoning', add_generation_prompt=True)
  full, _ = tok.render(CONVERSATION[:3], 'reasoning')
  generated = full[len(prompt):-1]   # as sampling stops: at END_ACTION, before END_OF_TURN
  turn = tok.parse_assistant(generated)
  assert turn.ended and turn.thinking == 'Query the employees table.' and turn.response is None
  assert json.loads(turn.action) == json.loads(ACTION)   # the call ids are the format's, not ours
  # The splice after a tool call is exactly what rendering the whole conversation lays out.
  assert turn.call_ids == ('0',)
  body, text = tok.tool_result_ids('[["김민수"]]', call_ids=turn.call_ids)
  spliced = prompt + generated + tok.tool_round_trip(body)
  rendered, _ = tok.render(CONVERSATION[:4], 'reasoning', add_generation_prompt=True)
  assert spliced == rendered and text == '[["김민수"]]'
  # A cut result is cut in its own tokens first, then written as valid JSON.
  body, text = tok.tool_result_ids('x' * 300, max_tokens=5)
  assert len(tok.encode(text)) <= 5 and json.loads(tok.decode(body)) == [
      {'tool_call_id': '0', 'results': {'0': {'content': text}}, 'is_error': None}]
  # A malformed action stays verbatim: still a format error for the verifiers.
  assert formats.COHERE.read_action('[{"tool_name": 1}') == ('[{"tool_name": 1}', ())


@pytest.mark.fast
def test_several_calls_in_several_actions_are_numbered_across_the_conversation_and_rollouts_splice_them(tok):
  """Two actions of two calls: ids 0-1 then 2-3 (Cohere numbers calls across the conversation); each tool turn
  answers its action's calls, one entry a call; a rollout that generated the second action splices exactly
  what rendering lays out."""
  call = lambda e: {'tool_name': 'calculator', 'parameters': {'expression': e}}
  conversation = [
      {'role': 'user', 'content': '1+1과 2+2, 그다음 3+3과 4+4'},
      {'role': 'assistant', 'thinking': 'Two sums.', 'action': json.dumps([call('1+1'), call('2+2')])},
      {'role': 'tool', 'content': '2'}, {'role': 'tool', 'content': 'ERROR: division by zero'},
      {'role': 'assistant', 'action': json.dumps([call('3+3'), call('4+4')])},
      {'role': 'tool', 'content': '6'}, {'role': 'tool', 'content': '8'},
      {'role': 'assistant', 'response': '2, 4, 6, 8'}]
  ids, _ = tok.render(conversation, 'reasoning')
  text = _with_specials(tok, ids)
  assert [json.loads(part.split('<|END_ACTION|>')[0])[1]['tool_call_id'] for part in text.split('<|START_ACTION|>')[1:]
          ] == ['1', '3']
  results = [json.loads(part.split('<|END_TOOL_RESULT|>')[0]) for part in text.split('<|START_TOOL_RESULT|>')[1:]]
  assert [[(r['tool_call_id'], r['results']['0']['content']) for r in turn] for turn in results] == [
      [('0', '2'), ('1', 'ERROR: division by zero')], [('2', '6'), ('3', '8')]]
  prompt, _ = tok.render(conversation[:4], 'reasoning', add_generation_prompt=True)
  through_action, _ = tok.render(conversation[:5], 'reasoning')
  generated = through_action[len(prompt):-1]
  turn = tok.parse_assistant(generated)
  assert turn.call_ids == ('2', '3') and json.loads(turn.action) == [call('3+3'), call('4+4')]
  body, _ = tok.tool_result_ids(['6', '8'], call_ids=turn.call_ids)
  rendered, _ = tok.render(conversation[:7], 'reasoning', add_generation_prompt=True)
  assert prompt + generated + tok.tool_round_trip(body) == rendered


@pytest.mark.fast
def test_typed_special_tokens_are_plain_text(tok):
  text = 'hi <|END_OF_TURN_TOKEN|> <BOS_TOKEN> there 안녕'
  ids = tok.encode(text)
  assert not set(ids) & set(tok.special_ids.values()) and tok.bos_id not in ids
  assert tok.decode(ids) == text


@pytest.mark.fast
def test_a_tokenizer_without_the_formats_tokens_is_named(cohere_dir, tmp_path):
  """A Cohere v1 checkpoint (Command R) has turn tokens but no thinking/action/tool-result tokens."""
  v2_only = ('<|START_THINKING|>', '<|END_THINKING|>', '<|START_ACTION|>', '<|END_ACTION|>', '<|START_RESPONSE|>',
             '<|END_RESPONSE|>', '<|START_TOOL_RESULT|>', '<|END_TOOL_RESULT|>')
  files = cohere_checkpoint.tokenizer_files(
      num_lines=200, special_tokens=tuple(t for t in cohere_checkpoint.SPECIAL_TOKENS if t not in v2_only))
  codec = codecs.Tokenizers(files['tokenizer.json'], json.loads(files['tokenizer_config.json']))
  with pytest.raises(ValueError, match=r'lacks <\|START_THINKING\|>.*cohere chat format.*Cohere v1'):
    tokenizer_lib.Tokenizer(codec)
  with pytest.raises(ValueError, match='luckystar chat format'):
    tokenizer_lib.Tokenizer(codec, 'luckystar')


def test_load_generate_and_export_keep_the_checkpoints_tokenizer_and_logits(cohere_dir, tmp_path):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  model = luckystar.load(cohere_dir)
  assert model.tokenizer.format is formats.COHERE and model.config.vocab_size == cohere_checkpoint.VOCAB_SIZE
  assert str(model.params['embedding'].dtype) == 'float32'   # param_dtype, whatever the file holds
  reply = model.generate('2+3은?', max_new_tokens=8)
  assert reply.rollout.token_ids.size <= 8
  exported = tmp_path / 'export'
  model.save_hf(exported)
  assert json.loads((exported / 'config.json').read_text())['dtype'] == 'bfloat16'   # the source's dtype
  assert (exported / 'tokenizer.json').read_text() == (cohere_dir / 'tokenizer.json').read_text()
  # Our template for the Cohere format, the checkpoint's own kept beside it (tests/test_chat_templates.py).
  assert (exported / 'additional_chat_templates' / 'source.jinja').read_text() == cohere_checkpoint.CHAT_TEMPLATE
  assert luckystar.load(exported).tokenizer.fingerprint == model.tokenizer.fingerprint
  ids = np.random.default_rng(0).integers(0, cohere_checkpoint.VOCAB_SIZE, (2, 40))
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(exported, torch_dtype=torch.float32)
  with torch.no_grad():
    theirs = hf_model(torch.tensor(ids)).logits.numpy()
  ours = np.asarray(luckystar.load(exported).logits(ids))
  assert theirs.std() > 0.5, 'logits too flat for a meaningful comparison'
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
  assert cohere_checkpoint.greedy_agrees(ours, theirs)


def test_a_vocabulary_that_does_not_divide_the_tensor_axis_is_padded_and_never_exposed(cohere_dir, tmp_path):
  import jax
  from luckystar import config as config_lib
  from luckystar import model
  from luckystar.engine import loading
  from luckystar.engine import state as state_lib
  from luckystar.interop import hf
  config = config_lib.base('sft')
  config.init_from = str(cohere_dir)
  config.mesh.update(dict(data=1, fsdp=4, tensor=2))
  start = state_lib.start(config, tmp_path)
  assert start.model_config.vocab_padding == 1 and start.state.params['embedding'].shape == (3002, 128)
  ids = np.random.default_rng(1).integers(0, cohere_checkpoint.VOCAB_SIZE, (4, 24))
  with model.sharding.activate(start.mesh):
    sharded = jax.jit(model.apply, static_argnums=0)(start.model_config, start.state.params, ids)
  want = luckystar.load(cohere_dir).logits(ids)
  assert sharded.shape == want.shape == (4, 24, cohere_checkpoint.VOCAB_SIZE)
  np.testing.assert_allclose(sharded, want, atol=1e-4, rtol=0)   # another reduction order over 8 devices
  # A run directory's checkpoint keeps the padding; its export does not.
  loading.Model(start.model_config, jax.device_get(start.state.params), start.tokenizer).save_hf(tmp_path / 'hf')
  assert hf.read_headers(tmp_path / 'hf')[hf.EMBEDDING].shape == (cohere_checkpoint.VOCAB_SIZE, 128)
  assert json.loads((tmp_path / 'tokenizer' / 'luckystar_tokenizer.json').read_text())['chat_format'] == 'cohere'
