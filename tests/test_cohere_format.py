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
# The same conversation as transformers' chat templates take it (OpenAI-style tool calls).
OPENAI_MESSAGES = [
    {'role': 'system', 'content': f'{PREAMBLE}\n\nDatabase schema: employees(id, name, salary)'},
    {'role': 'user', 'content': '급여가 가장 높은 직원은 누구인가요?'},
    {'role': 'assistant', 'reasoning_content': 'Query the employees table.', 'tool_calls': [
        {'type': 'function', 'function': {'name': 'execute_sql', 'arguments': {'query': QUERY}}}]},
    {'role': 'tool', 'content': '[["김민수"]]'},
    {'role': 'assistant', 'reasoning_content': 'The top earner is 김민수.', 'content': '김민수입니다.'},
]
# Written by hand from the Cohere format (docs/models.md), not from our code.
GOLDEN = (
    '<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + PREAMBLE + '\n\nDatabase schema: employees(id, name, '
    'salary)<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>급여가 가장 높은 직원은 누구인가요?'
    '<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>Query the employees table.'
    '<|END_THINKING|><|START_ACTION|>[{"tool_call_id": "0", "tool_name": "execute_sql", "parameters": {"query": '
    '"' + QUERY + '"}}]<|END_ACTION|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>'
    '<|START_TOOL_RESULT|>[{"tool_call_id": "0", "results": {"0": "[[\\"김민수\\"]]"}, "is_error": null}]'
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
def test_rendering_equals_the_checkpoints_chat_template(tok, cohere_dir):
  transformers = pytest.importorskip('transformers')
  hf_tokenizer = transformers.AutoTokenizer.from_pretrained(cohere_dir)
  for end in (2, 3, 4, 5):   # every prefix that ends after a user, action, tool or final turn
    ours, _ = tok.render(CONVERSATION[:end], 'reasoning', add_generation_prompt=end in (2, 4))
    theirs = hf_tokenizer.apply_chat_template(OPENAI_MESSAGES[:end], add_generation_prompt=end in (2, 4),
                                              tokenize=True, return_dict=False)
    assert ours == list(theirs), end


@pytest.mark.fast
def test_a_generated_turn_parses_into_our_sections_and_the_tool_round_trip_matches_rendering(tok):
  prompt, _ = tok.render(CONVERSATION[:2], 'reasoning', add_generation_prompt=True)
  full, _ = tok.render(CONVERSATION[:3], 'reasoning')
  generated = full[len(prompt):-1]   # as sampling stops: at END_ACTION, before END_OF_TURN
  turn = tok.parse_assistant(generated)
  assert turn.ended and turn.thinking == 'Query the employees table.' and turn.response is None
  assert json.loads(turn.action) == json.loads(ACTION)   # the call ids are the format's, not ours
  # The splice after a tool call is exactly what rendering the whole conversation lays out.
  body, text = tok.tool_result_ids('[["김민수"]]')
  spliced = prompt + generated + tok.tool_round_trip(body)
  rendered, _ = tok.render(CONVERSATION[:4], 'reasoning', add_generation_prompt=True)
  assert spliced == rendered and text == '[["김민수"]]'
  # A cut result is cut in its own tokens first, then written as valid JSON.
  body, text = tok.tool_result_ids('x' * 300, max_tokens=5)
  assert len(tok.encode(text)) <= 5 and json.loads(tok.decode(body)) == [
      {'tool_call_id': '0', 'results': {'0': text}, 'is_error': None}]
  # A malformed action stays verbatim: still a format error for the verifiers.
  assert formats.COHERE.read_action('[{"tool_name": 1}') == '[{"tool_name": 1}'


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
  for name in ('tokenizer.json', 'tokenizer_config.json'):
    assert (exported / name).read_text() == (cohere_dir / name).read_text()
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
