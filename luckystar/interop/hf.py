"""transformers Cohere2/Cohere checkpoints ⇄ luckystar (ModelConfig, params).

One table (`_LAYER_TENSORS`) says how each HF tensor maps to our scanned param
tree; both directions use it. PyTorch Linear weights are [out, in]; our kernels
are [in, ...out] with heads split out. An int4-served model (`ModelConfig.quant`
in mode 'serve', see luckystar/quant) maps each Linear to compressed-tensors'
`weight_packed` / `weight_scale` / `weight_shape` instead of `weight`
(luckystar/quant/compressed.py), with `quantization_config` in config.json.
"""

import json
import os
import pathlib
import shutil
import tempfile
from typing import Any

import jax
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from luckystar.interop import hf_tokenizer
from luckystar.model.config import FULL, SLIDING, ModelConfig, pattern_layer_types
from luckystar.quant import compressed
from luckystar.quant.quantize import AQT_NAME, is_served
from luckystar.tokenizer import Tokenizer

MODEL_TYPES = ('cohere2', 'cohere')
# transformers' Cohere2Config / CohereConfig defaults for keys a config.json may leave out: a missing key
# must mean what it means to transformers, or the same file gives other logits.
HF_DEFAULTS = {'logit_scale': 0.0625, 'sliding_window': 4096}
_PACKED_SUFFIXES = ('weight_packed', 'weight_scale', 'weight_shape')  # compressed-tensors, per quantized Linear

# (HF name inside `model.layers.{i}.`, our path inside the layer, kind) — kind says how to reshape.
_LAYER_TENSORS = (
    ('input_layernorm.weight', ('input_layernorm', 'weight'), 'vector'),
    ('self_attn.q_proj.weight', ('self_attn', 'q_proj', 'kernel'), 'in_proj'),
    ('self_attn.k_proj.weight', ('self_attn', 'k_proj', 'kernel'), 'in_proj'),
    ('self_attn.v_proj.weight', ('self_attn', 'v_proj', 'kernel'), 'in_proj'),
    ('self_attn.o_proj.weight', ('self_attn', 'o_proj', 'kernel'), 'out_proj'),
    ('mlp.gate_proj.weight', ('mlp', 'gate_proj', 'kernel'), 'linear'),
    ('mlp.up_proj.weight', ('mlp', 'up_proj', 'kernel'), 'linear'),
    ('mlp.down_proj.weight', ('mlp', 'down_proj', 'kernel'), 'linear'),
)
_QK_NORM_TENSORS = (
    ('self_attn.q_norm.weight', ('self_attn', 'q_norm', 'weight'), 'vector'),
    ('self_attn.k_norm.weight', ('self_attn', 'k_norm', 'weight'), 'vector'),
)


def is_hf_dir(path: str | pathlib.Path) -> bool:
  config = pathlib.Path(path) / 'config.json'
  return config.is_file() and json.loads(config.read_text()).get('model_type') in MODEL_TYPES


def config_from_hf(hf: dict[str, Any], path: str = 'config.json', **overrides: Any) -> ModelConfig:
  """ModelConfig from a transformers config.json dict (Cohere2 with `layer_types` or the legacy
  `sliding_window_pattern`, or Cohere v1)."""
  model_type = hf.get('model_type')
  if model_type not in MODEL_TYPES:
    raise ValueError(f'{path}: model_type {model_type!r} is not supported; expected one of {MODEL_TYPES}')
  if hf.get('attention_bias'):
    raise ValueError(f'{path}: attention_bias=true is not supported (Cohere2 checkpoints have none)')
  if not hf.get('tie_word_embeddings', True):
    raise ValueError(f'{path}: untied embeddings are not supported (Cohere ties the LM head)')
  rope = hf.get('rope_parameters') or {}
  if rope.get('rope_type', 'default') != 'default':
    raise ValueError(f'{path}: rope_type {rope["rope_type"]!r} is not supported; only default RoPE')
  num_layers = hf['num_hidden_layers']
  if model_type == 'cohere':
    layer_types, window = (FULL,) * num_layers, None
  elif hf.get('layer_types'):
    layer_types, window = hf['layer_types'], hf.get('sliding_window', HF_DEFAULTS['sliding_window'])
  else:
    layer_types, window = pattern_layer_types(num_layers, hf.get('sliding_window_pattern', 4)), hf.get(
        'sliding_window', HF_DEFAULTS['sliding_window'])
  num_heads = hf['num_attention_heads']
  if 'head_dim' in hf and hf['head_dim'] != hf['hidden_size'] // num_heads:
    raise ValueError(f'{path}: head_dim {hf["head_dim"]} != hidden_size / num_attention_heads')
  fields = dict(
      vocab_size=hf['vocab_size'], hidden_size=hf['hidden_size'], intermediate_size=hf['intermediate_size'],
      num_layers=num_layers, num_heads=num_heads, num_kv_heads=hf.get('num_key_value_heads') or num_heads,
      layer_types=tuple(layer_types), sliding_window=window,
      rope_theta=float(rope.get('rope_theta', hf.get('rope_theta', 10_000.0))),
      layer_norm_eps=hf.get('layer_norm_eps', 1e-5), logit_scale=hf.get('logit_scale', HF_DEFAULTS['logit_scale']),
      max_position_embeddings=hf.get('max_position_embeddings', 8192),
      use_qk_norm=bool(hf.get('use_qk_norm', False)), rope_on_full_layers=model_type == 'cohere')
  if hf.get('hidden_act', 'silu') != 'silu':
    raise ValueError(f'{path}: hidden_act {hf["hidden_act"]!r} is not supported; Cohere uses silu')
  return ModelConfig(**{**fields, **overrides})


def config_to_hf(config: ModelConfig, dtype: str = 'float32') -> dict[str, Any]:
  """transformers config.json for our config (Cohere2, or Cohere v1 when RoPE is on every layer)."""
  common = dict(
      vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
      num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
      num_key_value_heads=config.num_kv_heads, hidden_act='silu', layer_norm_eps=config.layer_norm_eps,
      logit_scale=config.logit_scale, max_position_embeddings=config.max_position_embeddings,
      rope_parameters={'rope_type': 'default', 'rope_theta': config.rope_theta}, attention_bias=False,
      tie_word_embeddings=True, dtype=dtype)
  if config.quant is not None:
    if not is_served(config):
      raise ValueError(f'config.quant is in mode {config.quant.mode!r}; export a float model or a converted '
                       f'("serve") one (luckystar.quant.convert)')
    common['quantization_config'] = compressed.quantization_config(config.quant)
  if config.rope_on_full_layers:
    if SLIDING in config.layer_types:
      raise ValueError('Cohere v1 (RoPE on full layers) has no sliding-window layers')
    return dict(model_type='cohere', architectures=['CohereForCausalLM'], use_qk_norm=config.use_qk_norm,
                **common)
  if config.use_qk_norm:
    raise ValueError('Cohere2 has no QK-norm; it exists only in Cohere v1')
  return dict(model_type='cohere2', architectures=['Cohere2ForCausalLM'], layer_types=list(config.layer_types),
              sliding_window=config.sliding_window, **common)


def _layer_tensors(config: ModelConfig):
  return _LAYER_TENSORS + (_QK_NORM_TENSORS if config.use_qk_norm else ())


def _to_ours(weight: np.ndarray, kind: str, path: tuple[str, ...], config: ModelConfig) -> np.ndarray:
  if kind == 'vector':
    return weight
  if kind == 'linear':
    return weight.T
  heads = config.num_heads if path[1] in ('q_proj', 'o_proj') else config.num_kv_heads
  if kind == 'in_proj':   # [heads·head_dim, embed] → [embed, heads, head_dim]
    return weight.T.reshape(config.hidden_size, heads, config.head_dim)
  return weight.T.reshape(heads, config.head_dim, config.hidden_size)  # out_proj: [embed, h·d] → [h, d, embed]


def _to_hf(value: np.ndarray, kind: str) -> np.ndarray:
  if kind == 'vector':
    return value
  if kind == 'linear':
    return value.T
  if kind == 'in_proj':
    return value.reshape(value.shape[0], -1).T
  return value.reshape(-1, value.shape[-1]).T


def params_from_hf(tensors: dict[str, np.ndarray], config: ModelConfig, path: str = '<tensors>') -> dict:
  """Our scanned param tree from HF tensor names; missing or unexpected names are errors."""
  period, groups = config.layer_period, config.num_layers // config.layer_period
  expected = {'model.embed_tokens.weight', 'model.norm.weight'}
  layers = {}
  for i in range(period):
    layer = {}
    for hf_name, ours, kind in _layer_tensors(config):
      node = layer
      for key in ours[:-1]:
        node = node.setdefault(key, {})
      prefixes = [f'model.layers.{g * period + i}.{hf_name.removesuffix("weight")}' for g in range(groups)]
      if is_served(config) and kind != 'vector':  # compressed-tensors int weights → AQT's frozen tensors
        names = [prefix + suffix for prefix in prefixes for suffix in _PACKED_SUFFIXES]
        expected.update(names)
        if missing := [n for n in names if n not in tensors]:
          raise ValueError(f'{path}: missing tensor {missing[0]} (an int4 checkpoint needs {_PACKED_SUFFIXES})')
        frozen = [compressed.from_hf({s: tensors[prefix + s] for s in _PACKED_SUFFIXES}, config.quant, prefix[:-1])
                  for prefix in prefixes]
        node[AQT_NAME] = {'qrhs': {'value': np.stack([v for v, _ in frozen]).astype(config.quant.value_dtype),
                                   'scale': np.stack([s for _, s in frozen])}}
        continue
      names = [prefix + 'weight' for prefix in prefixes]
      expected.update(names)
      if missing := [n for n in names if n not in tensors]:
        raise ValueError(f'{path}: missing tensor {missing[0]}')
      node[ours[-1]] = np.stack([_to_ours(np.asarray(tensors[n]), kind, ours, config) for n in names])
    layers[f'layer_{i}'] = layer
  for name in ('model.embed_tokens.weight', 'model.norm.weight'):
    if name not in tensors:
      raise ValueError(f'{path}: missing tensor {name}')
  # Some tied checkpoints still carry lm_head.weight (a copy of the embedding); it is ignored.
  unexpected = set(tensors) - expected - {'lm_head.weight'}
  if unexpected:
    raise ValueError(f'{path}: unexpected tensors, e.g. {sorted(unexpected)[:3]}')
  return {'embedding': np.asarray(tensors['model.embed_tokens.weight']), 'layers': layers,
          'norm': {'weight': np.asarray(tensors['model.norm.weight'])}}


def params_to_hf(params: Any, config: ModelConfig) -> dict[str, np.ndarray]:
  """HF tensor names → numpy arrays (inverse of `params_from_hf`)."""
  params = jax.tree.map(np.asarray, params)
  period = config.layer_period
  out = {'model.embed_tokens.weight': params['embedding'], 'model.norm.weight': params['norm']['weight']}
  for i in range(period):
    for hf_name, ours, kind in _layer_tensors(config):
      node = params['layers'][f'layer_{i}']
      for key in ours[:-1]:
        node = node[key]
      if is_served(config) and kind != 'vector':  # AQT's frozen int values + scales → compressed-tensors
        frozen = node[AQT_NAME]['qrhs']
        for g, (value, scale) in enumerate(zip(frozen['value'], frozen['scale'])):
          prefix = f'model.layers.{g * period + i}.{hf_name.removesuffix("weight")}'
          packed = compressed.to_hf(value, scale, config.quant, jax.numpy.dtype(config.quant.scale_dtype))
          out.update({prefix + suffix: tensor for suffix, tensor in packed.items()})
        continue
      for g, value in enumerate(node[ours[-1]]):
        out[f'model.layers.{g * period + i}.{hf_name}'] = np.ascontiguousarray(_to_hf(value, kind))
  return out


def _safetensor_files(path: pathlib.Path) -> list[pathlib.Path]:
  index = path / 'model.safetensors.index.json'
  if index.is_file():
    return sorted({path / f for f in json.loads(index.read_text())['weight_map'].values()})
  files = sorted(path.glob('*.safetensors'))
  if not files:
    raise FileNotFoundError(f'{path}: no *.safetensors files (only safetensors checkpoints are supported)')
  return files


def read_safetensors(path: str | pathlib.Path) -> dict[str, np.ndarray]:
  """All tensors of an HF directory as numpy (bf16 stays bf16 via ml_dtypes)."""
  tensors = {}
  for file in _safetensor_files(pathlib.Path(path)):
    with safe_open(str(file), framework='flax') as f:
      for name in f.keys():
        tensors[name] = np.asarray(f.get_tensor(name))
  return tensors


def load_hf(path: str | pathlib.Path, **config_overrides: Any) -> tuple[ModelConfig, dict]:
  """(config, params) from a transformers Cohere2/Cohere directory; params keep the file's dtype."""
  path = pathlib.Path(path)
  config_file = path / 'config.json'
  if not config_file.is_file():
    raise FileNotFoundError(f'{path}: no config.json; not a transformers model directory')
  hf_config, tensors = json.loads(config_file.read_text()), read_safetensors(path)
  if compressed.is_quantized(hf_config):  # int4 (compressed-tensors): served from its int values and scales
    scale_dtypes = {t.dtype.name for name, t in tensors.items() if name.endswith('.weight_scale')}
    if len(scale_dtypes) != 1:
      raise ValueError(f'{path}: a compressed-tensors checkpoint needs weight_scale tensors of one dtype, '
                       f'found {sorted(scale_dtypes) or "none"}')
    config_overrides = {'quant': compressed.settings_from_config(hf_config, str(config_file), scale_dtypes.pop()),
                        **config_overrides}
  config = config_from_hf(hf_config, str(config_file), **config_overrides)
  return config, params_from_hf(tensors, config, str(path))


def save_hf(path: str | pathlib.Path, config: ModelConfig, params: Any, *, dtype: str = 'bfloat16',
            tokenizer: Tokenizer | None = None, extra_files: dict[str, str] | None = None) -> None:
  """Writes a transformers directory: config.json and model.safetensors in `dtype` ('float32' or
  'bfloat16'); with `tokenizer`, also its tokenizer.model, the transformers tokenizer files with our
  chat template (`hf_tokenizer.tokenizer_files`: AutoTokenizer encodes and renders as we do) and a
  generation_config.json that stops at EOS, end of turn or end of action (a tool call, for the caller to
  run); and any `extra_files` (name → text).
  An int4-served config (luckystar.quant.convert) writes its Linears as compressed-tensors
  pack-quantized tensors (scales in `config.quant.scale_dtype`) and the rest in `dtype`.
  Written to a temporary sibling and renamed, so `path` is complete or absent."""
  if dtype not in ('float32', 'bfloat16'):
    raise ValueError(f'dtype must be "float32" or "bfloat16", got {dtype!r}')
  path = pathlib.Path(path)
  if path.exists():
    raise FileExistsError(f'{path}: exists; remove it or choose another directory')
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f'.{path.name}.', dir=path.parent))
  tmp.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary, shareable directory
  try:
    # Float tensors in `dtype`; compressed-tensors' packed ints, shapes and scales as they come.
    tensors = {name: value if name.endswith(_PACKED_SUFFIXES) else np.asarray(value).astype(jax.numpy.dtype(dtype))
               for name, value in params_to_hf(params, config).items()}
    save_file(tensors, str(tmp / 'model.safetensors'), metadata={'format': 'pt'})
    (tmp / 'model.safetensors').chmod(0o644)
    hf_config = config_to_hf(config, dtype)
    if tokenizer is not None:  # else transformers' Cohere defaults (ids of Cohere's own 256k vocabulary)
      hf_config.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)
    (tmp / 'config.json').write_text(json.dumps(hf_config, indent=2) + '\n')
    if tokenizer is not None:
      (tmp / 'tokenizer.model').write_bytes(tokenizer.model_proto)
      for name, text in hf_tokenizer.tokenizer_files(tokenizer, config.max_position_embeddings).items():
        (tmp / name).write_text(text)
      # END_ACTION too: a transformers/vLLM server hands a tool call back instead of generating its result.
      stops = [tokenizer.eos_id, tokenizer.end_of_turn_id, tokenizer.end_of_action_id]
      generation = {'bos_token_id': tokenizer.bos_id, 'eos_token_id': stops, 'pad_token_id': tokenizer.pad_id}
      (tmp / 'generation_config.json').write_text(json.dumps(generation, indent=2) + '\n')
    for name, text in (extra_files or {}).items():
      (tmp / name).write_text(text)
    os.replace(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
