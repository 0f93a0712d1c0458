"""luckystar.load: what it accepts, and the errors it gives for what it does not."""

import shutil

import numpy as np
import pytest

import luckystar
from luckystar import errors
from luckystar import tokenizer as tokenizer_lib

transformers = pytest.importorskip('transformers')


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp('hf')
  config = transformers.Cohere2Config(
      vocab_size=tokenizer_lib.VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, sliding_window=4, pad_token_id=0, bos_token_id=2,
      eos_token_id=3)
  transformers.Cohere2ForCausalLM(config).save_pretrained(path)
  return path


def test_load_reads_our_tokenizer_when_present(hf_dir, tmp_path):
  assert luckystar.load(hf_dir).tokenizer is None
  with_tokenizer = tmp_path / 'with_tokenizer'
  shutil.copytree(hf_dir, with_tokenizer)
  shutil.copy(tokenizer_lib.DEFAULT_PATH, with_tokenizer / 'tokenizer.model')
  model = luckystar.load(with_tokenizer)
  ids, _ = model.tokenizer.render([{'role': 'user', 'content': '2+3은?'}], 'concise', add_generation_prompt=True)
  logits = model.logits(np.array([ids]))
  assert logits.shape == (1, len(ids), tokenizer_lib.VOCAB_SIZE) and np.isfinite(logits).all()


def test_load_casts_to_the_requested_param_dtype(hf_dir):
  model = luckystar.load(hf_dir, param_dtype='bfloat16', dtype='bfloat16')
  assert model.params['embedding'].dtype.name == 'bfloat16'
  assert model.logits(np.zeros((1, 3), np.int32)).dtype.name == 'float32'


@pytest.mark.fast
def test_logits_reject_bad_ids(hf_dir):
  model = luckystar.load(hf_dir)
  with pytest.raises(ValueError, match=r'\[batch, length\]'):
    model.logits(np.zeros(3, np.int32))
  with pytest.raises(ValueError, match='token ids must lie in'):
    model.logits(np.array([[tokenizer_lib.VOCAB_SIZE]]))


@pytest.mark.fast
def test_load_errors_name_the_path(tmp_path):
  """UserErrors (one line, main prints them without a traceback) that are still the FileNotFoundError and
  ValueError callers caught before; tests/test_bad_input.py has the broken directories."""
  with pytest.raises(FileNotFoundError, match='no-such-dir') as raised:
    luckystar.load(tmp_path / 'no-such-dir')
  assert isinstance(raised.value, errors.UserError)
  with pytest.raises(ValueError, match='not a model directory') as raised:
    luckystar.load(tmp_path)
  assert isinstance(raised.value, errors.UserError)
  (tmp_path / 'config.json').write_text('{"model_type": "llama"}')
  with pytest.raises(errors.UserError, match="not a model directory .*; its config.json has model_type 'llama'"):
    luckystar.load(tmp_path)


@pytest.mark.fast
def test_every_bundled_name_ships_and_no_other_name_is_reserved():
  from luckystar import api
  assert all((api.BUNDLED_DIR / name).is_dir() for name in api.BUNDLED_MODELS)
  with pytest.raises(FileNotFoundError, match="teacher: no such bundled model or directory; bundled models: "
                                              r"\('tiny-base', 'tiny-sft', 'tiny-rlvr', 'tiny-teacher'\)"):
    luckystar.load('teacher')


@pytest.fixture(scope='module')
def chat_model(hf_dir, tmp_path_factory):
  path = tmp_path_factory.mktemp('hf_chat')
  shutil.copytree(hf_dir, path, dirs_exist_ok=True)
  shutil.copy(tokenizer_lib.DEFAULT_PATH, path / 'tokenizer.model')
  return luckystar.load(path)


def test_generate_follows_the_chat_template_and_the_sampler(chat_model):
  import jax
  from luckystar import sampling
  replies = chat_model.generate(['2+3은?', 'What is 2+3?'], mode='concise', max_new_tokens=12, system='Be brief.')
  assert len(replies) == 2
  tok = chat_model.tokenizer
  for question, reply in zip(['2+3은?', 'What is 2+3?'], replies):
    prompt, _ = tok.render([{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': question}],
                           'concise', add_generation_prompt=True)
    want = sampling.sample(chat_model.config, chat_model.params, [prompt], rng=jax.random.key(0), max_new_tokens=12,
                           settings=sampling.SamplingSettings(temperature=0.0),
                           stop_ids=[tok.end_of_turn_id, tok.end_of_action_id])
    np.testing.assert_array_equal(reply.rollout.token_ids, np.asarray(want.tokens[0, :int(want.lengths[0])]))
    assert reply.finished != reply.overlong
    turn = tok.parse_assistant(reply.rollout.token_ids)
    assert reply.text == (turn.response if turn.response is not None else tok.decode(reply.rollout.token_ids))
  single = chat_model.generate('2+3은?', mode='concise', max_new_tokens=12, system='Be brief.')
  assert single.rollout.token_ids.tolist() == replies[0].rollout.token_ids.tolist()


@pytest.mark.fast
def test_generate_needs_a_tokenizer(hf_dir):
  with pytest.raises(ValueError, match='this model has no tokenizer'):
    luckystar.load(hf_dir).generate('hi')


def test_generate_refuses_a_missing_database_before_sampling(chat_model, tmp_path, monkeypatch):
  from luckystar import sampling

  class Sampled(Exception):
    pass

  def rollout(*args, **kwargs):
    raise Sampled
  monkeypatch.setattr(sampling, 'rollout', rollout)
  missing = tmp_path / 'no-such.sqlite'
  for prompts, tools in (('hi', missing), ('hi', str(missing)), (['hi', 'there'], [None, missing])):
    with pytest.raises(FileNotFoundError, match='no-such.sqlite'):
      chat_model.generate(prompts, tools=tools)
  existing = tmp_path / 'db.sqlite'
  existing.write_bytes(b'')
  with pytest.raises(Sampled):   # an existing database (and None for no database) goes on to sampling
    chat_model.generate(['hi', 'there'], tools=[existing, None])


def test_chat_reads_openai_messages_as_our_sections(chat_model):
  openai_shaped = [
      {'role': 'developer', 'content': 'Be brief.'},
      {'role': 'user', 'content': [{'type': 'text', 'text': 'What is '}, {'type': 'text', 'text': '2+3?'}]},
      {'role': 'assistant', 'reasoning_content': 'Add them.', 'content': None, 'tool_calls': [
          {'id': 'call_1', 'type': 'function',
           'function': {'name': 'calculator', 'arguments': '{"expression": "2+3"}'}}]},
      {'role': 'tool', 'tool_call_id': 'call_1', 'content': '5'},
      {'role': 'assistant', 'content': [{'type': 'text', 'text': '5'}]},
      {'role': 'user', 'content': 'And 2*3?'}]
  ours = [
      {'role': 'system', 'content': 'Be brief.'},
      {'role': 'user', 'content': 'What is 2+3?'},
      {'role': 'assistant', 'thinking': 'Add them.',
       'action': '{"tool_name": "calculator", "parameters": {"expression": "2+3"}}'},
      {'role': 'tool', 'content': '5'},
      {'role': 'assistant', 'response': '5'},
      {'role': 'user', 'content': 'And 2*3?'}]
  tok = chat_model.tokenizer
  assert tok.render(tokenizer_lib.from_openai(openai_shaped), 'concise') == tok.render(ours, 'concise')
  theirs, mine = (chat_model.chat(messages, 'concise', max_new_tokens=8, temperature=1.0, seed=3)
                  for messages in (openai_shaped, ours))
  assert theirs.rollout.token_ids.tolist() == mine.rollout.token_ids.tolist()
  assert theirs.text == mine.text
  assert chat_model.reply_logprobs(openai_shaped, ['5', '6']).tolist() == chat_model.reply_logprobs(ours, ['5', '6']).tolist()


@pytest.mark.fast
@pytest.mark.parametrize('messages, field', [
    ([{'role': 'robot', 'content': 'hi'}], "messages[0].role: unknown role 'robot'"),
    ([{'role': 'user'}], 'messages[0]: a user message needs content'),
    ([{'role': 'user', 'content': 'hi'}, {'role': 'assistant'}], 'messages[1]: an assistant message needs content'),
    ([{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'tool_calls': [
        {'type': 'function', 'function': {'name': 'calculator', 'arguments': '[1]'}}]}],
     r'messages\[1\].tool_calls\[0\].function.arguments: function.arguments of .calculator. must be the JSON text'),
    ([{'role': 'user', 'content': [{'type': 'image_url', 'image_url': 'x'}]}], r'messages\[0\].content\[0\]: only text'),
    ([{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'a', 'response': 'b'}],
     'messages[1]: both content and response'),
])
def test_openai_message_errors_name_the_field(messages, field):
  with pytest.raises(ValueError, match=field if '\\' in field else field.replace('[', r'\[').replace(']', r'\]')):
    tokenizer_lib.from_openai(messages)
