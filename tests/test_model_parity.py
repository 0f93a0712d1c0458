"""Logit parity with transformers' Cohere2ForCausalLM / CohereForCausalLM on random weights (fp32)."""

import json

import numpy as np
import pytest

import luckystar
from luckystar.interop import hf

pytestmark = pytest.mark.fast

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

S, F = 'sliding_attention', 'full_attention'

COHERE2_CASES = {
    # GQA 4:1, Command-style 3 local + 1 global, two groups scanned.
    'gqa_pattern4': dict(num_attention_heads=8, num_key_value_heads=2, layer_types=[S, S, S, F] * 2,
                         sliding_window=8, logit_scale=0.25, seq=32),
    # Multi-head (no GQA), alternating local/global, larger logit scale.
    'mha_alternating': dict(num_attention_heads=4, num_key_value_heads=4, layer_types=[S, F] * 3,
                            sliding_window=5, logit_scale=0.125, seq=24),
    # Multi-query, a non-periodic list (scanned as a single group).
    'mqa_nonperiodic': dict(num_attention_heads=4, num_key_value_heads=1, layer_types=[S, F, S, S, F],
                            sliding_window=7, logit_scale=0.0625, seq=28),
    # Legacy config.json carrying `sliding_window_pattern` instead of `layer_types`.
    'legacy_pattern3': dict(num_attention_heads=6, num_key_value_heads=3, layer_types=[S, S, F] * 2,
                            sliding_window=6, logit_scale=0.5, seq=20, legacy_pattern=3),
}


def _randomize(model, seed):
  """Weights large enough that logits spread; LayerNorm weights away from 1."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if 'norm' in name:
        p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=gen))
      elif 'embed' in name:
        p.copy_(2.0 * torch.randn(p.shape, generator=gen))
      else:
        p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def _compare(hf_model, directory, seq, vocab, seed):
  ids = np.random.default_rng(seed).integers(0, vocab, (2, seq))
  with torch.no_grad():
    want = hf_model(torch.tensor(ids)).logits.numpy()
  got = np.asarray(luckystar.load(directory).logits(ids))
  assert got.shape == want.shape
  assert want.std() > 1.0, 'logits too flat for a meaningful comparison'
  print(f'logit std {want.std():.2f}, max-abs diff {np.abs(got - want).max():.2e}')
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
  return want


@pytest.mark.parametrize('case', sorted(COHERE2_CASES))
def test_cohere2_logits_match_transformers(case, tmp_path):
  spec = dict(COHERE2_CASES[case])
  seq, legacy_pattern = spec.pop('seq'), spec.pop('legacy_pattern', None)
  assert seq >= 3 * spec['sliding_window']
  config = transformers.Cohere2Config(
      vocab_size=211, hidden_size=48 if spec['num_attention_heads'] == 6 else 64, intermediate_size=96,
      num_hidden_layers=len(spec['layer_types']), rope_parameters={'rope_type': 'default', 'rope_theta': 500.0},
      pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation='eager', **spec)
  model = transformers.Cohere2ForCausalLM(config).eval()
  _randomize(model, seed=len(case))
  model.save_pretrained(tmp_path)
  if legacy_pattern:
    saved = json.loads((tmp_path / 'config.json').read_text())
    del saved['layer_types']
    saved['sliding_window_pattern'] = legacy_pattern
    (tmp_path / 'config.json').write_text(json.dumps(saved))
  loaded = luckystar.load(tmp_path)
  assert loaded.config.layer_types == tuple(spec['layer_types'])
  assert loaded.tokenizer is None
  _compare(model, tmp_path, seq, config.vocab_size, seed=1)


def test_keys_a_config_leaves_out_mean_what_they_mean_to_transformers(tmp_path):
  """A config.json without logit_scale or sliding_window: transformers' defaults (0.0625, 4096), not ours."""
  config = transformers.Cohere2Config(
      vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, layer_types=[S, F], pad_token_id=0, bos_token_id=1, eos_token_id=2)
  model = transformers.Cohere2ForCausalLM(config).eval()
  _randomize(model, seed=5)
  model.save_pretrained(tmp_path)
  saved = json.loads((tmp_path / 'config.json').read_text())
  del saved['logit_scale'], saved['sliding_window']
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation='eager').eval()
  assert (theirs.config.logit_scale, theirs.config.sliding_window) == (0.0625, 4096)
  assert luckystar.load(tmp_path).config.sliding_window == 4096
  _compare(theirs, tmp_path, 16, config.vocab_size, seed=4)


def test_cohere_v1_with_qk_norm_matches_transformers(tmp_path):
  config = transformers.CohereConfig(
      vocab_size=173, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
      num_key_value_heads=2, use_qk_norm=True, logit_scale=0.5, pad_token_id=0, bos_token_id=1,
      eos_token_id=2, rope_parameters={'rope_type': 'default', 'rope_theta': 1000.0},
      attn_implementation='eager')
  model = transformers.CohereForCausalLM(config).eval()
  _randomize(model, seed=7)
  model.save_pretrained(tmp_path)
  assert luckystar.load(tmp_path).config.rope_on_full_layers
  _compare(model, tmp_path, 24, config.vocab_size, seed=2)


def test_params_round_trip_to_hf_names(tmp_path):
  config = transformers.Cohere2Config(
      vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
      num_key_value_heads=2, sliding_window=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)
  model = transformers.Cohere2ForCausalLM(config)
  _randomize(model, seed=3)
  model.save_pretrained(tmp_path)
  loaded = luckystar.load(tmp_path)
  tensors = hf.params_to_hf(loaded.params, loaded.config)
  state = {k: v.numpy() for k, v in model.state_dict().items() if k != 'lm_head.weight'}
  assert set(tensors) == set(state)
  for name, value in state.items():
    np.testing.assert_array_equal(tensors[name], value, err_msg=name)
  assert hf.config_to_hf(loaded.config)['layer_types'] == config.layer_types


def test_missing_tensor_names_the_tensor(tmp_path):
  config = transformers.Cohere2Config(
      vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, sliding_window=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)
  tensors = {k: v.numpy() for k, v in transformers.Cohere2ForCausalLM(config).state_dict().items()}
  del tensors['model.layers.1.mlp.up_proj.weight']
  ours = hf.config_from_hf(config.to_dict())
  with pytest.raises(ValueError, match=r'model\.layers\.1\.mlp\.up_proj\.weight'):
    hf.params_from_hf(tensors, ours)
