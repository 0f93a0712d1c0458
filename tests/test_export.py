"""int4 export: compressed-tensors pack-quantized (W4A16) directories that transformers loads
(docs/int4_and_export.md)."""

import json

import jax
import numpy as np
import pytest

import luckystar
from luckystar import api
from luckystar import model as model_lib
from luckystar import quant
from luckystar import tokenizer as tokenizer_lib
from luckystar.interop import hf
from luckystar.model.config import ModelConfig, pattern_layer_types
from luckystar.quant import compressed
from luckystar.quant import quantize

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
ct_pack = pytest.importorskip('compressed_tensors.compressors.pack_quantized.helpers')

CONFIG = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                     num_kv_heads=2, layer_types=pattern_layer_types(4, 2), sliding_window=8,
                     max_position_embeddings=256)
GROUP = 32
LINEARS = ('self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj', 'self_attn.o_proj', 'mlp.gate_proj',
           'mlp.up_proj', 'mlp.down_proj')


@pytest.fixture(scope='module')
def model():
  return api.Model(CONFIG, model_lib.init(CONFIG, jax.random.key(0)))


@pytest.fixture(scope='module')
def tokens():
  return np.asarray(jax.random.randint(jax.random.key(1), (2, 16), 0, CONFIG.vocab_size))


def _transformers_logits(path, tokens):
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  with torch.no_grad():
    return hf_model, hf_model(torch.tensor(tokens)).logits.numpy()


def _read_exact(file):
  """Tensors with their file dtypes (int64 included, which jax without x64 would narrow)."""
  from safetensors.torch import load_file
  return load_file(str(file))


def test_packing_is_compressed_tensors_own():
  rng = np.random.default_rng(0)
  for shape in [(5, 24), (3, 13), (2, 8)]:   # 13: a partial last word, zero-padded as compressed-tensors does
    values = rng.integers(-8, 8, shape).astype(np.int8)
    packed = compressed.pack(values)
    np.testing.assert_array_equal(packed, ct_pack.pack_to_int32(torch.tensor(values), 4).numpy())
    np.testing.assert_array_equal(compressed.unpack(packed, shape), values)
    np.testing.assert_array_equal(
        ct_pack.unpack_from_int32(torch.tensor(packed), 4, torch.Size(shape)).numpy(), values)
  # docs/int4_and_export.md spelled out: q + 8, element k of 8 at bits 4·k, least significant first
  word = compressed.pack(np.array([[-8, -7, 0, 1, 2, 3, 6, 7]]))[0, 0]
  assert int(word) & 0xFFFFFFFF == sum((q + 8) << (4 * k) for k, q in enumerate([-8, -7, 0, 1, 2, 3, 6, 7]))
  with pytest.raises(ValueError, match=r'\[-8, 7\]'):
    compressed.pack(np.array([[8]]))


@pytest.mark.parametrize('group_size', [0, GROUP], ids=['channel', 'group'])
def test_quantization_config_is_a_valid_compressed_tensors_config(group_size):
  from compressed_tensors.quantization import QuantizationConfig
  settings = quant.QuantSettings('serve', 4, group_size, 'bfloat16')
  written = compressed.quantization_config(settings)
  parsed = QuantizationConfig.model_validate(written)
  weights = parsed.config_groups['group_0'].weights
  assert (parsed.format, parsed.ignore, parsed.quant_method) == ('pack-quantized', ['lm_head'], 'compressed-tensors')
  assert (weights.num_bits, weights.symmetric, weights.type) == (4, True, 'int')
  assert weights.strategy == ('group' if group_size else 'channel')
  assert weights.group_size == (group_size or None)
  assert parsed.config_groups['group_0'].input_activations is None
  assert compressed.settings_from_config({'quantization_config': written}, 'config.json', 'bfloat16') == settings
  bad = json.loads(json.dumps(written))
  bad['config_groups']['group_0']['input_activations'] = {'num_bits': 8, 'type': 'int'}
  with pytest.raises(ValueError, match='config.json: unsupported quantization_config: activations'):
    compressed.settings_from_config({'quantization_config': bad}, 'config.json', 'bfloat16')


@pytest.mark.parametrize('group_size', [0, GROUP], ids=['channel', 'group'])
def test_transformers_loads_the_int4_export_with_the_serve_weights_and_logits(model, tokens, tmp_path, group_size):
  # float32 export: the scales are exact float32 values, so only the summation order differs
  served = model.quantize(group_size=group_size, scale_dtype='float32')
  served.save_hf(tmp_path / 'int4', dtype='float32', quantization='int4')
  hf_model, theirs = _transformers_logits(tmp_path / 'int4', tokens)
  ours = np.asarray(served.logits(tokens))
  assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(ours).max()   # the design asks 1e-3 relative
  # the weights transformers decompressed are exactly the ones SERVE multiplies with
  _, dequantized = quant.dequantize(served.config, served.params)
  for name, tensor in hf.params_to_hf(dequantized, CONFIG).items():
    if name.endswith('proj.weight'):
      np.testing.assert_array_equal(hf_model.get_parameter(name).detach().numpy(), tensor, err_msg=name)


def test_bf16_int4_export_layout_size_and_bit_identical_round_trip(model, tokens, tmp_path):
  served = model.quantize(group_size=GROUP)   # scales rounded to bf16, the export dtype
  model.save_hf(tmp_path / 'int4', dtype='bfloat16', quantization='int4', group_size=GROUP)
  written = _read_exact(tmp_path / 'int4' / 'model.safetensors')
  config = json.loads((tmp_path / 'int4' / 'config.json').read_text())
  assert config['quantization_config']['config_groups']['group_0']['weights']['group_size'] == GROUP
  # vLLM's compressed-tensors W4A16 layout: packed int32 [out, in/8], scales [out, in/group], shape [2]
  int4_bytes, bf16_bytes = 0, 0
  for layer in range(CONFIG.num_layers):
    for linear in LINEARS:
      prefix = f'model.layers.{layer}.{linear}.'
      out_features, in_features = written[prefix + 'weight_shape'].tolist()
      assert prefix + 'weight' not in written
      assert written[prefix + 'weight_packed'].dtype == torch.int32
      assert written[prefix + 'weight_packed'].shape == (out_features, in_features // 8)
      assert written[prefix + 'weight_scale'].dtype == torch.bfloat16
      assert written[prefix + 'weight_scale'].shape == (out_features, in_features // GROUP)
      assert written[prefix + 'weight_shape'].dtype == torch.int64
      int4_bytes += sum(written[prefix + s].nbytes for s in ('weight_packed', 'weight_scale', 'weight_shape'))
      bf16_bytes += 2 * out_features * in_features
  assert 'lm_head.weight' not in written and written['model.embed_tokens.weight'].dtype == torch.bfloat16
  assert int4_bytes <= 0.3 * bf16_bytes, int4_bytes / bf16_bytes

  loaded = luckystar.load(tmp_path / 'int4')
  assert loaded.config.quant == served.config.quant
  loaded_leaves = dict(jax.tree_util.tree_flatten_with_path(loaded.params)[0])
  frozen = [(path, want) for path, want in jax.tree_util.tree_flatten_with_path(served.params)[0]
            if quantize.is_quantized_leaf(path)]
  assert len(frozen) == 2 * len(LINEARS) * CONFIG.layer_period   # values and scales
  for path, want in frozen:
    got = loaded_leaves[path]
    assert got.dtype == want.dtype, jax.tree_util.keystr(path)
    np.testing.assert_array_equal(np.asarray(got).astype(np.float32), np.asarray(want).astype(np.float32))
  # transformers agrees with our SERVE path on the file's own (bf16) weights
  _, theirs = _transformers_logits(tmp_path / 'int4', tokens)
  ours = np.asarray(loaded.logits(tokens))
  assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(ours).max()
  # save → load → save writes the same bytes for every tensor
  loaded.save_hf(tmp_path / 'again', dtype='bfloat16', quantization='int4')
  again = _read_exact(tmp_path / 'again' / 'model.safetensors')
  assert set(again) == set(written)
  for name, tensor in written.items():
    assert again[name].dtype == tensor.dtype and torch.equal(again[name], tensor), name


@pytest.mark.parametrize('bits', [2, 8])
def test_other_bit_widths_reload_exactly_and_load_in_transformers(model, tokens, tmp_path, bits):
  """AQT keeps 2- and 8-bit values in int8 (int4 only for 4 bits): a reload must not squeeze them into int4."""
  served = model.quantize(group_size=GROUP, bits=bits)
  served.save_hf(tmp_path / 'export', quantization='int4')
  loaded = luckystar.load(tmp_path / 'export')
  assert loaded.config.quant == served.config.quant
  got, want = (dict(jax.tree_util.tree_flatten_with_path(m.params)[0]) for m in (loaded, served))
  for path, value in want.items():
    assert got[path].dtype == value.dtype == (np.int8 if path[-1].key == 'value' else np.float32)
    np.testing.assert_array_equal(got[path], value, err_msg=jax.tree_util.keystr(path))
  ours = np.asarray(loaded.logits(tokens))
  np.testing.assert_array_equal(ours, np.asarray(served.logits(tokens)))
  _, theirs = _transformers_logits(tmp_path / 'export', tokens)
  assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(ours).max()


def test_save_hf_quantization_errors(model, tmp_path):
  with pytest.raises(ValueError, match='quantization must be None or "int4"'):
    model.save_hf(tmp_path / 'x', quantization='int8')
  with pytest.raises(ValueError, match='save it with quantization="int4"'):
    model.quantize(group_size=GROUP).save_hf(tmp_path / 'y')
  with pytest.raises(ValueError, match='group_size=48 does not divide'):
    model.save_hf(tmp_path / 'z', quantization='int4', group_size=48)


# ---- tokenizer and chat template ----------------------------------------------------------------

TRICKY_TEXTS = ['  two  spaces ', '\ttab\n\nnewlines\n', '이모지 😀 🚀 and ünïcödé', '123 4567.89', 'x   y', ' ', '',
                '한국어 문장입니다.  끝', '\u00a0nbsp', 'a\r\nb', '中文字符 𝔘𝔫𝔦', 'SELECT * FROM t WHERE a = 1;',
                '{"name": "get_weather", "arguments": {"city": "서울"}}']


@pytest.fixture(scope='module')
def hf_tokenizer_dir(tmp_path_factory):
  # The model's vocabulary must hold the tokenizer's ids: `luckystar.load` refuses a tokenizer of another model.
  tokenizer = tokenizer_lib.default()
  config = CONFIG.replace(vocab_size=tokenizer.vocab_size)
  path = tmp_path_factory.mktemp('tokenizer') / 'hf'
  api.Model(config, model_lib.init(config, jax.random.key(0)), tokenizer).save_hf(path)
  return path


def test_generation_config_stops_at_eos_end_of_turn_and_end_of_action(hf_tokenizer_dir):
  """transformers (and vLLM, which reads the same file) stop at a tool call: the caller runs the tool."""
  tok = tokenizer_lib.default()
  generation = transformers.GenerationConfig.from_pretrained(hf_tokenizer_dir)
  assert generation.eos_token_id == [tok.eos_id, tok.end_of_turn_id, tok.end_of_action_id]
  assert transformers.AutoTokenizer.from_pretrained(hf_tokenizer_dir).convert_ids_to_tokens(
      tok.end_of_action_id) == tokenizer_lib.SECTION_TOKENS['action'][1]


def test_autotokenizer_encodes_exactly_as_ours_on_a_bilingual_set(hf_tokenizer_dir):
  from luckystar.data import suites
  ours = luckystar.load(hf_tokenizer_dir).tokenizer
  theirs = transformers.AutoTokenizer.from_pretrained(hf_tokenizer_dir)
  texts = list(TRICKY_TEXTS)
  for task in ('math', 'korean_mc', 'chat', 'function_calling'):
    for example in suites.load(task, 'heldout')[:40]:
      texts += [example.prompt, example.system, example.answer, example.thinking or '', example.response or '']
  languages = {example.language for task in ('math', 'chat') for example in suites.load(task, 'heldout')[:40]}
  assert languages == {'ko', 'en'} and len(texts) > 500
  for text in texts:
    ids = ours.encode(text)
    assert theirs.encode(text, add_special_tokens=False) == ids, repr(text)
    assert theirs(text)['input_ids'] == ids, repr(text)   # no BOS/EOS added by default, as ours
    assert theirs.decode(ids) == ours.decode(ids), repr(text)


def test_apply_chat_template_renders_our_template_in_both_modes(hf_tokenizer_dir):
  ours = luckystar.load(hf_tokenizer_dir).tokenizer
  theirs = transformers.AutoTokenizer.from_pretrained(hf_tokenizer_dir)
  conversation = [
      {'role': 'system', 'content': 'Database: shop.sqlite'},
      {'role': 'user', 'content': '지난달 주문은 몇 건인가요?'},
      {'role': 'assistant', 'thinking': 'Count the orders of last month.', 'action': '{"sql": "SELECT 1"}'},
      {'role': 'tool', 'content': '[[42]]'},
      {'role': 'assistant', 'thinking': 'The tool says 42.', 'response': '42건입니다.'},
      {'role': 'user', 'content': 'And in English?'},
  ]
  for mode in ('reasoning', 'concise'):
    for messages in (conversation, conversation[1:], conversation[1:2]):
      for generation_prompt in (False, True):
        want, _ = ours.render(messages, mode, add_generation_prompt=generation_prompt)
        got = theirs.apply_chat_template(messages, mode=mode, add_generation_prompt=generation_prompt,
                                         tokenize=True)['input_ids']
        assert got == want, (mode, len(messages), generation_prompt)
        text = theirs.apply_chat_template(messages, mode=mode, add_generation_prompt=generation_prompt,
                                          tokenize=False)
        assert theirs.encode(text, add_special_tokens=False) == want
  with pytest.raises(Exception, match='unknown mode'):
    theirs.apply_chat_template(conversation, mode='verbose', tokenize=False)


@pytest.mark.parametrize('name', ['tiny-sft', 'random:small'])
def test_float_export_of_tiny_sft_and_a_random_small_matches_transformers(name, tmp_path):
  """Issue 7 acceptance 1: the fp32 export of the bundled `tiny-sft` and of a random `small` loads
  in transformers with logits within 1e-4 (max abs) of ours, and AutoTokenizer ids equal ours."""
  if name == 'tiny-sft':
    ours = luckystar.load(name)
  else:
    config = model_lib.get('small')
    ours = api.Model(config, model_lib.init(config, jax.random.key(3)), tokenizer_lib.default())
  ours.save_hf(tmp_path / 'hf', dtype='float32')
  texts = ['서울의 인구는 약 940만 명입니다.', 'What is 17 + 25? Think step by step.']
  ids = [ours.tokenizer.encode(t) for t in texts]
  auto = transformers.AutoTokenizer.from_pretrained(tmp_path / 'hf')
  assert [auto.encode(t, add_special_tokens=False) for t in texts] == ids
  tokens = np.asarray([ids[0][:12], ids[1][:12]])
  _, theirs = _transformers_logits(tmp_path / 'hf', tokens)
  np.testing.assert_allclose(np.asarray(ours.logits(tokens)), theirs, atol=1e-4, rtol=0)
