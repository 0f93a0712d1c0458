"""transformers Cohere2/Cohere checkpoints ⇄ luckystar (ModelConfig, params).

One table (`_LAYER_TENSORS`) says how each HF tensor maps to our scanned param
tree; both directions use it. PyTorch Linear weights are [out, in]; our kernels
are [in, ...out] with heads split out. An int4-served model (`ModelConfig.quant`
in mode 'serve', see luckystar/quant) maps each Linear to compressed-tensors'
`weight_packed` / `weight_scale` / `weight_shape` instead of `weight`
(luckystar/quant/compressed.py), with `quantization_config` in config.json.
"""

import json
import math
import os
import pathlib
import shutil
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import jax
import numpy as np
import safetensors
from safetensors import safe_open

from luckystar import distributed
from luckystar import errors
from luckystar import files
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
INDEX_FILE = 'model.safetensors.index.json'
SAVE_DTYPES = ('float32', 'bfloat16', 'float16')
MAX_JSON_BYTES = 64 << 20            # config.json (a few kB) and the index (~100 kB for the largest models)
MAX_HEADER_BYTES = 100_000_000       # a safetensors header: the safetensors library's own limit

# Sizes of HF tensor dimensions, by the config.json names that set them (the error for a shape that
# disagrees with config.json names them).
_Q, _KV = 'num_attention_heads·head_dim', 'num_key_value_heads·head_dim'
_SIZES = {'vocab_size': lambda c: c.vocab_size, 'hidden_size': lambda c: c.hidden_size,
          'intermediate_size': lambda c: c.intermediate_size, 'num_attention_heads': lambda c: c.num_heads,
          'num_key_value_heads': lambda c: c.num_kv_heads, 'head_dim': lambda c: c.head_dim,
          _Q: lambda c: c.num_heads * c.head_dim, _KV: lambda c: c.num_kv_heads * c.head_dim}

# (HF name inside `model.layers.{i}.`, our path inside the layer, kind, HF shape) — kind says how to reshape.
_LAYER_TENSORS = (
    ('input_layernorm.weight', ('input_layernorm', 'weight'), 'vector', ('hidden_size',)),
    ('self_attn.q_proj.weight', ('self_attn', 'q_proj', 'kernel'), 'in_proj', (_Q, 'hidden_size')),
    ('self_attn.k_proj.weight', ('self_attn', 'k_proj', 'kernel'), 'in_proj', (_KV, 'hidden_size')),
    ('self_attn.v_proj.weight', ('self_attn', 'v_proj', 'kernel'), 'in_proj', (_KV, 'hidden_size')),
    ('self_attn.o_proj.weight', ('self_attn', 'o_proj', 'kernel'), 'out_proj', ('hidden_size', _Q)),
    ('mlp.gate_proj.weight', ('mlp', 'gate_proj', 'kernel'), 'linear', ('intermediate_size', 'hidden_size')),
    ('mlp.up_proj.weight', ('mlp', 'up_proj', 'kernel'), 'linear', ('intermediate_size', 'hidden_size')),
    ('mlp.down_proj.weight', ('mlp', 'down_proj', 'kernel'), 'linear', ('hidden_size', 'intermediate_size')),
)
_QK_NORM_TENSORS = (
    ('self_attn.q_norm.weight', ('self_attn', 'q_norm', 'weight'), 'vector', ('num_attention_heads', 'head_dim')),
    ('self_attn.k_norm.weight', ('self_attn', 'k_norm', 'weight'), 'vector', ('num_key_value_heads', 'head_dim')),
)
EMBEDDING = 'model.embed_tokens.weight'
_GLOBAL_TENSORS = {EMBEDDING: ('vocab_size', 'hidden_size'), 'model.norm.weight': ('hidden_size',)}

# safetensors dtype → (numpy name, bytes per element), for the dtypes a Cohere checkpoint's tensors come in.
_SAFETENSORS_DTYPES = {'F64': ('float64', 8), 'F32': ('float32', 4), 'F16': ('float16', 2), 'BF16': ('bfloat16', 2),
                       'I64': ('int64', 8), 'I32': ('int32', 4), 'I16': ('int16', 2), 'I8': ('int8', 1),
                       'U8': ('uint8', 1)}
_FLOAT_DTYPES = ('float64', 'float32', 'float16', 'bfloat16')
_INT_DTYPES = ('int64', 'int32', 'int16', 'int8', 'uint8')
# What each tensor kind of `expected_tensors` may be stored as.
_KIND_DTYPES = {'float': _FLOAT_DTYPES, 'packed': ('int32',), 'shape': _INT_DTYPES}

# config.json fields read by `config_from_hf` and what each must be; `null` or absent takes transformers'
# default, except for the required ones (True).
_POSITIVE_INT, _POSITIVE, _NUMBER, _BOOL = 'a positive integer', 'a positive number', 'a number', 'true or false'
_HF_FIELDS = {
    'vocab_size': (_POSITIVE_INT, True), 'hidden_size': (_POSITIVE_INT, True),
    'intermediate_size': (_POSITIVE_INT, True), 'num_hidden_layers': (_POSITIVE_INT, True),
    'num_attention_heads': (_POSITIVE_INT, True), 'num_key_value_heads': (_POSITIVE_INT, False),
    'head_dim': (_POSITIVE_INT, False), 'sliding_window': (_POSITIVE_INT, False),
    'sliding_window_pattern': (_POSITIVE_INT, False), 'max_position_embeddings': (_POSITIVE_INT, False),
    'rope_theta': (_POSITIVE, False), 'layer_norm_eps': (_POSITIVE, False), 'logit_scale': (_NUMBER, False),
    'use_qk_norm': (_BOOL, False), 'tie_word_embeddings': (_BOOL, False), 'attention_bias': (_BOOL, False),
    'layer_types': ('a list of layer type names', False), 'hidden_act': ('a string', False),
    'rope_parameters': ('a JSON object', False), 'quantization_config': ('a JSON object', False),
}
_IS = {
    _POSITIVE_INT: lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
    _POSITIVE: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf,
    _NUMBER: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    _BOOL: lambda v: isinstance(v, bool),
    'a list of layer type names': lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v),
    'a string': lambda v: isinstance(v, str),
    'a JSON object': lambda v: isinstance(v, dict),
}


class TensorHeader(NamedTuple):
  """One tensor as a safetensors header describes it: where it is, its dtype (numpy name), shape, and the byte
  offset of its data in the file (-1: not from a file)."""
  file: str
  dtype: str
  shape: tuple[int, ...]
  offset: int = -1


def read_json_object(file: str | pathlib.Path, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
  """The JSON object in `file` (config.json, the safetensors index) within `luckystar.files`' bounds; anything else
  is an InvalidFile naming it. `Infinity` and `NaN` are kept: transformers writes them with json.dumps."""
  return files.read_json_object(file, max_bytes, pathlib.Path(file).name, finite=False)


def is_hf_dir(path: str | pathlib.Path) -> bool:
  """Whether `path` has a config.json naming a model_type we read (one that is not a JSON object, or not a
  regular file, is an error)."""
  config = pathlib.Path(path) / 'config.json'
  return os.path.lexists(config) and read_json_object(config).get('model_type') in MODEL_TYPES


def _check_fields(hf: dict[str, Any], path: str) -> None:
  """Each `_HF_FIELDS` entry present with its type and domain, before any of them sizes an array."""
  for key, (kind, required) in _HF_FIELDS.items():
    value = hf.get(key)
    if value is None and required:
      raise errors.InvalidFile(f'{path}: no {key} ({kind}); a transformers Cohere2/Cohere config.json has one')
    if value is not None and not _IS[kind](value):
      raise errors.InvalidFile(f'{path}: {key}={json.dumps(value)[:60]} must be {kind}')
  if (theta := (hf.get('rope_parameters') or {}).get('rope_theta')) is not None and not _IS[_POSITIVE](theta):
    raise errors.InvalidFile(f'{path}: rope_parameters.rope_theta={json.dumps(theta)[:60]} must be {_POSITIVE}')


def config_from_hf(hf: dict[str, Any], path: str = 'config.json', **overrides: Any) -> ModelConfig:
  """ModelConfig from a transformers config.json dict (Cohere2 with `layer_types` or the legacy
  `sliding_window_pattern`, or Cohere v1); a field missing, of the wrong type or unsupported is an
  InvalidFile naming `path` and the field."""
  model_type = hf.get('model_type')
  if model_type not in MODEL_TYPES:
    raise errors.InvalidFile(f'{path}: model_type {model_type!r} is not supported; expected one of {MODEL_TYPES}')
  _check_fields(hf, path)
  if hf.get('attention_bias'):
    raise errors.InvalidFile(f'{path}: attention_bias=true is not supported (Cohere2 checkpoints have none)')
  if not hf.get('tie_word_embeddings', True):
    raise errors.InvalidFile(f'{path}: untied embeddings are not supported (Cohere ties the LM head)')
  rope = hf.get('rope_parameters') or {}
  if rope.get('rope_type', 'default') != 'default':
    raise errors.InvalidFile(f'{path}: rope_type {rope["rope_type"]!r} is not supported; only default RoPE')
  num_layers = hf['num_hidden_layers']
  if model_type == 'cohere':
    layer_types, window = (FULL,) * num_layers, None
  elif hf.get('layer_types'):
    layer_types, window = hf['layer_types'], hf.get('sliding_window', HF_DEFAULTS['sliding_window'])
  else:
    layer_types, window = pattern_layer_types(num_layers, hf.get('sliding_window_pattern', 4)), hf.get(
        'sliding_window', HF_DEFAULTS['sliding_window'])
  num_heads = hf['num_attention_heads']
  if hf.get('head_dim') is not None and hf['head_dim'] != hf['hidden_size'] // num_heads:
    raise errors.InvalidFile(f'{path}: head_dim {hf["head_dim"]} != hidden_size / num_attention_heads')
  fields = dict(
      vocab_size=hf['vocab_size'], hidden_size=hf['hidden_size'], intermediate_size=hf['intermediate_size'],
      num_layers=num_layers, num_heads=num_heads, num_kv_heads=hf.get('num_key_value_heads') or num_heads,
      layer_types=tuple(layer_types), sliding_window=window,
      rope_theta=float(rope.get('rope_theta', hf.get('rope_theta', 10_000.0))),
      layer_norm_eps=hf.get('layer_norm_eps', 1e-5), logit_scale=hf.get('logit_scale', HF_DEFAULTS['logit_scale']),
      max_position_embeddings=hf.get('max_position_embeddings', 8192),
      use_qk_norm=bool(hf.get('use_qk_norm', False)), rope_on_full_layers=model_type == 'cohere')
  if hf.get('hidden_act', 'silu') != 'silu':
    raise errors.InvalidFile(f'{path}: hidden_act {hf["hidden_act"]!r} is not supported; Cohere uses silu')
  try:
    return ModelConfig(**{**fields, **overrides})
  except ValueError as e:  # sizes that do not fit together, e.g. layer_types of another length than num_layers
    raise errors.InvalidFile(f'{path}{f" with {overrides}" if overrides else ""}: {e}') from None


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


def _our_shape(shape: tuple[int, ...], kind: str, path: tuple[str, ...], config: ModelConfig) -> tuple[int, ...]:
  """Our layout's shape of one layer's HF tensor of `shape` (`_hf_region`)."""
  if kind == 'vector':
    return tuple(shape)
  if kind == 'linear':
    return tuple(shape[::-1])
  heads = config.num_heads if path[1] in ('q_proj', 'o_proj') else config.num_kv_heads
  if kind == 'in_proj':
    return config.hidden_size, heads, config.head_dim
  return heads, config.head_dim, config.hidden_size


def expected_tensors(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...], str]]:
  """HF tensor name → (shape, the config.json sizes behind each dimension, dtype kind: 'float', 'packed' or
  'shape') of every tensor a checkpoint of `config` holds: what `params_to_hf` writes and `params_from_hf` reads."""
  def entry(dims, kind='float'):
    return tuple(_SIZES[d](config) if d in _SIZES else int(d) for d in dims), dims, kind
  expected = {name: entry(dims) for name, dims in _GLOBAL_TENSORS.items()}
  for layer in range(config.num_layers):
    for hf_name, _, kind, dims in _layer_tensors(config):
      if is_served(config) and kind != 'vector':  # compressed-tensors: packed int values, scales and [out, in]
        prefix = f'model.layers.{layer}.{hf_name.removesuffix("weight")}'
        (out_dim, in_dim), (out_size, in_size) = dims, [_SIZES[d](config) for d in dims]
        per_word, group = compressed.PACK_BITS // config.quant.bits, config.quant.group_size
        expected[prefix + 'weight_packed'] = ((out_size, -(-in_size // per_word)),
                                              (out_dim, f'{in_dim}/{per_word}'), 'packed')
        expected[prefix + 'weight_scale'] = ((out_size, in_size // group if group else 1),
                                             (out_dim, f'{in_dim}/{group}' if group else '1'), 'float')
        expected[prefix + 'weight_shape'] = ((2,), ('2',), 'shape')
      else:
        expected[f'model.layers.{layer}.{hf_name}'] = entry(dims)
  return expected


def check_tensors(found: Mapping[str, TensorHeader], config: ModelConfig, where: str, config_file: str) -> None:
  """The tensors of checkpoint `where` (`read_headers`: no tensor data needed) against what `config_file`
  describes: every one present, none extra, each of its shape and of a dtype luckystar reads; else an
  InvalidFile naming the file, the tensor and the mismatch."""
  expected = expected_tensors(config)
  if missing := [name for name in expected if name not in found]:
    more = f' and {len(missing) - 1} more' if len(missing) > 1 else ''
    int4 = f' (an int4 checkpoint needs {_PACKED_SUFFIXES} per Linear)' if is_served(config) else ''
    raise errors.InvalidFile(f'{where}: missing tensor {missing[0]}{more}, which {config_file} calls for{int4}')
  # Some tied checkpoints still carry lm_head.weight (a copy of the embedding); it is ignored.
  if unexpected := sorted(set(found) - set(expected) - {'lm_head.weight'}):
    raise errors.InvalidFile(f'{where}: unexpected tensors, e.g. {unexpected[:3]}; {config_file} '
                             f'(num_hidden_layers={config.num_layers}) has no place for them')
  for name, (shape, dims, kind) in expected.items():
    tensor = found[name]
    if tuple(tensor.shape) != shape:
      raise errors.InvalidFile(f'{tensor.file}: tensor {name} has shape {list(tensor.shape)}, but {config_file} '
                               f'gives {" × ".join(dims)} = {list(shape)}')
    if tensor.dtype not in _KIND_DTYPES[kind]:
      raise errors.InvalidFile(f'{tensor.file}: tensor {name} is {tensor.dtype}; luckystar reads it as one of '
                               f'{", ".join(_KIND_DTYPES[kind])}')


def params_from_hf(tensors: dict[str, np.ndarray], config: ModelConfig, path: str = '<tensors>') -> dict:
  """Our scanned param tree from HF tensor names; missing or unexpected names, or shapes and dtypes that
  disagree with `config`, are InvalidFile errors (`check_tensors`)."""
  check_tensors({name: TensorHeader(path, np.dtype(t.dtype).name, tuple(t.shape)) for name, t in tensors.items()},
                config, path, 'the config')
  period, groups = config.layer_period, config.num_layers // config.layer_period
  layers = {}
  for i in range(period):
    layer = {}
    for hf_name, ours, kind, _ in _layer_tensors(config):
      node = layer
      for key in ours[:-1]:
        node = node.setdefault(key, {})
      prefixes = [f'model.layers.{g * period + i}.{hf_name.removesuffix("weight")}' for g in range(groups)]
      if is_served(config) and kind != 'vector':  # compressed-tensors int weights → AQT's frozen tensors
        try:
          frozen = [compressed.from_hf({s: tensors[prefix + s] for s in _PACKED_SUFFIXES}, config.quant,
                                       prefix[:-1]) for prefix in prefixes]
        except ValueError as e:  # weight_shape values that disagree with the packed tensor
          raise errors.InvalidFile(f'{path}: {e}') from None
        node[AQT_NAME] = {'qrhs': {'value': np.stack([v for v, _ in frozen]).astype(config.quant.value_dtype),
                                   'scale': np.stack([s for _, s in frozen])}}
        continue
      heads = config.num_heads if ours[1] in ('q_proj', 'o_proj') else config.num_kv_heads
      whole = _whole(_our_shape(tensors[prefixes[0] + 'weight'].shape, kind, ours, config))
      to_ours = _hf_region(kind, whole, heads, config.head_dim)[1]
      node[ours[-1]] = np.stack([to_ours(np.asarray(tensors[prefix + 'weight'])) for prefix in prefixes])
    layers[f'layer_{i}'] = layer
  return {'embedding': np.asarray(tensors[EMBEDDING]), 'layers': layers,
          'norm': {'weight': np.asarray(tensors['model.norm.weight'])}}


def _whole(shape: tuple[int, ...]) -> tuple[slice, ...]:
  return tuple(slice(0, n) for n in shape)


def _own_blocks(leaf: Any) -> Iterator[tuple[tuple[slice, ...], np.ndarray]]:
  """(index, block) of each distinct block of `leaf` this process holds (replica 0 of each shard), or the whole
  of a host array: what this process writes of it, with no gathering."""
  if not isinstance(leaf, jax.Array):
    leaf = np.asarray(leaf)
    yield _whole(leaf.shape), leaf
    return
  for shard in leaf.addressable_shards:
    if shard.replica_id == 0:
      yield tuple(slice(*i.indices(n)[:2]) for i, n in zip(shard.index, leaf.shape)), np.asarray(shard.data)


Block = tuple[str, tuple[slice, ...], np.ndarray]   # HF tensor name, its region, the values there


def hf_blocks(params: Any, config: ModelConfig) -> Iterator[Block]:
  """This process's share of every HF tensor of `params`, as (name, region, values) blocks in HF layout: a
  device's shard of a leaf, one layer at a time (host params: whole tensors). Int4 Linears are packed from
  whole layers, gathered (a collective) and yielded by process 0."""
  period = config.layer_period
  for (rows, columns), block in _own_blocks(params['embedding']):
    if (end := min(rows.stop, config.vocab_size)) > rows.start:   # padding rows are not exported
      yield EMBEDDING, (slice(rows.start, end), columns), block[:end - rows.start]
  for index, block in _own_blocks(params['norm']['weight']):
    yield 'model.norm.weight', index, block
  for i in range(period):
    for hf_name, ours, kind, _ in _layer_tensors(config):
      node = params['layers'][f'layer_{i}']
      for key in ours[:-1]:
        node = node[key]
      heads = config.num_heads if ours[1] in ('q_proj', 'o_proj') else config.num_kv_heads
      if is_served(config) and kind != 'vector':  # AQT's frozen int values + scales → compressed-tensors
        frozen = node[AQT_NAME]['qrhs']
        for g in range(config.num_layers // period):
          prefix = f'model.layers.{g * period + i}.{hf_name.removesuffix("weight")}'
          value, scale = distributed.to_host((frozen['value'][g], frozen['scale'][g]))
          tensors = compressed.to_hf(value, scale, config.quant, jax.numpy.dtype(config.quant.scale_dtype))
          if jax.process_index() == 0:
            yield from ((prefix + suffix, _whole(t.shape), t) for suffix, t in tensors.items())
        continue
      for (groups, *index), block in _own_blocks(node[ours[-1]]):
        region, _, to_hf = _hf_region(kind, tuple(index), heads, config.head_dim)
        for g in range(groups.start, groups.stop):
          yield f'model.layers.{g * period + i}.{hf_name}', region, to_hf(block[g - groups.start])


def params_to_hf(params: Any, config: ModelConfig) -> dict[str, np.ndarray]:
  """HF tensor names → numpy arrays (inverse of `params_from_hf`), all in host memory; `save_hf` streams them."""
  shapes, tensors = {name: e[0] for name, e in expected_tensors(config).items()}, {}
  for name, region, block in hf_blocks(params, config):
    if name not in tensors:
      tensors[name] = np.empty(shapes[name], block.dtype)
    tensors[name][region] = block
  return tensors


def _indexed_file(directory: pathlib.Path, name: str, index: pathlib.Path) -> pathlib.Path:
  """The weight file `index` names as `name`: inside `directory` (no absolute path, no '..', no link out of
  it: an index comes with a download and must not make us read other files) and present."""
  file = directory / name
  if pathlib.PurePath(name).is_absolute() or '..' in pathlib.PurePath(name).parts:
    raise errors.InvalidFile(f'{index}: weight_map names {name!r}, outside {directory}; an index may only name '
                             f'files in its own directory')
  resolved, root = file.resolve(), directory.resolve()
  # A Hugging Face cache snapshot (…/snapshots/<revision>/) holds links into its repository's blobs/.
  blobs = root.parent.parent / 'blobs' if root.parent.name == 'snapshots' else None
  if not resolved.is_relative_to(root) and not (blobs and resolved.is_relative_to(blobs)):
    raise errors.InvalidFile(f'{index}: weight_map names {name!r}, a link to {resolved}, outside {directory}; '
                             f'an index may only name files in its own directory')
  if not file.is_file():
    raise errors.MissingFile(f'{index}: weight_map names {name!r}, which is not a file in {directory}')
  return file


def _read_header(file: pathlib.Path) -> dict[str, TensorHeader]:
  """The tensors a safetensors file's header lists (8-byte little-endian length, then JSON), checked against
  the file's size: a truncated or non-safetensors file is an InvalidFile here, before any data is read."""
  size = files.regular_file(file, 'safetensors file').stat().st_size   # opening a FIFO would block
  with open(file, 'rb') as f:
    length = int.from_bytes(f.read(8), 'little')
    if size < 8:
      raise errors.InvalidFile(f'{file}: not a safetensors file ({size} bytes, less than its 8-byte header length)')
    if length > size - 8:
      raise errors.InvalidFile(f'{file}: not a safetensors file (its first 8 bytes give a header of {length} '
                               f'bytes, but the file has {size})')
    if length > MAX_HEADER_BYTES:
      raise errors.InvalidFile(f'{file}: not a safetensors file (its first 8 bytes give a header of {length:,} '
                               f'bytes; safetensors allows at most {MAX_HEADER_BYTES:,})')
    data = f.read(length)
  header = files.loads(data, f'{file}: not a safetensors file; its header', check_text=False)
  if not isinstance(header, dict):
    raise errors.InvalidFile(f'{file}: not a safetensors file (its header is not a JSON object)')
  header.pop('__metadata__', None)
  tensors, data_end = {}, 0
  for name, entry in header.items():
    try:
      dtype, shape, (begin, end) = entry['dtype'], tuple(int(d) for d in entry['shape']), entry['data_offsets']
    except (KeyError, TypeError, ValueError):
      raise errors.InvalidFile(f'{file}: malformed safetensors header entry for {name!r}: '
                               f'{json.dumps(entry)[:80]}') from None
    if dtype not in _SAFETENSORS_DTYPES:
      raise errors.InvalidFile(f'{file}: tensor {name} has dtype {dtype!r}, which luckystar cannot read; '
                               f'expected one of {", ".join(_SAFETENSORS_DTYPES)}')
    numpy_name, itemsize = _SAFETENSORS_DTYPES[dtype]
    if not (isinstance(begin, int) and isinstance(end, int)) or end - begin != math.prod(shape) * itemsize:
      raise errors.InvalidFile(f'{file}: tensor {name} ({dtype} {list(shape)}) has data_offsets {[begin, end]}, '
                               f'which do not span its {math.prod(shape) * itemsize} bytes')
    tensors[name], data_end = TensorHeader(str(file), numpy_name, shape, 8 + length + begin), max(data_end, end)
  if data_end != size - 8 - length:
    problem = 'truncated' if data_end > size - 8 - length else 'longer than its header says'
    raise errors.InvalidFile(f'{file}: {problem}: its header lists {data_end} bytes of tensor data, but '
                             f'{size - 8 - length} follow; copy or download it again')
  return tensors


def read_headers(path: str | pathlib.Path) -> dict[str, TensorHeader]:
  """Every tensor of an HF directory as its safetensors headers (and `model.safetensors.index.json`, when there
  is one) describe it; no tensor data is read. A malformed or inconsistent index or header, an index naming a
  file outside the directory, or a truncated file is an InvalidFile naming it."""
  path = pathlib.Path(path)
  index = path / INDEX_FILE
  weight_map = None
  if os.path.lexists(index):
    weight_map = read_json_object(index).get('weight_map')
    if not (isinstance(weight_map, dict) and weight_map and all(isinstance(f, str) for f in weight_map.values())):
      raise errors.InvalidFile(f'{index}: "weight_map" must map each tensor name to a safetensors file in {path}, '
                               f'got {json.dumps(weight_map)[:60]}')
    files = {name: _indexed_file(path, name, index) for name in sorted(set(weight_map.values()))}
  else:
    files = {file.name: file for file in sorted(path.glob('*.safetensors'))}
    if not files:
      raise errors.MissingFile(f'{path}: no *.safetensors files (only safetensors checkpoints are supported)')
  headers = {}
  for file in files.values():
    for name, tensor in _read_header(file).items():
      if name in headers:
        raise errors.InvalidFile(f'{path}: tensor {name} is in both {headers[name].file} and {file}')
      headers[name] = tensor
  for name, file_name in (weight_map or {}).items():
    if name not in headers or headers[name].file != str(files[file_name]):
      raise errors.InvalidFile(f'{index}: weight_map puts {name} in {file_name}, which does not hold it')
  return headers


def _read_tensors(headers: Mapping[str, TensorHeader]) -> dict[str, np.ndarray]:
  """The data of the tensors `read_headers` listed, as numpy (bf16 stays bf16 via ml_dtypes)."""
  tensors = {}
  for file in dict.fromkeys(tensor.file for tensor in headers.values()):
    try:
      with safe_open(file, framework='flax') as f:
        for name in (name for name, tensor in headers.items() if tensor.file == file):
          tensors[name] = np.asarray(f.get_tensor(name))
    except safetensors.SafetensorError as e:  # what its header check lets through, e.g. overlapping tensors
      raise errors.InvalidFile(f'{file}: not a readable safetensors file ({e})') from None
  return tensors


def read_safetensors(path: str | pathlib.Path) -> dict[str, np.ndarray]:
  """All tensors of an HF directory as numpy (bf16 stays bf16 via ml_dtypes)."""
  return _read_tensors(read_headers(path))


def read_config(path: str | pathlib.Path, **config_overrides: Any) -> tuple[ModelConfig, dict[str, TensorHeader]]:
  """(config, tensor headers) of a transformers Cohere2/Cohere directory, no tensor data read: config.json, the
  index and every tensor's shape and dtype are checked against each other; a mismatch is an InvalidFile
  naming the file and what disagrees."""
  path = pathlib.Path(path)
  config_file = path / 'config.json'
  if not os.path.lexists(config_file):
    raise errors.MissingFile(f'{path}: no config.json; not a transformers model directory')
  hf_config, headers = read_json_object(config_file), read_headers(path)
  _check_fields(hf_config, str(config_file))
  if compressed.is_quantized(hf_config):  # int4 (compressed-tensors): served from its int values and scales
    scale_dtypes = {t.dtype for name, t in headers.items() if name.endswith('.weight_scale')}
    if len(scale_dtypes) != 1:
      raise errors.InvalidFile(f'{path}: a compressed-tensors checkpoint needs weight_scale tensors of one dtype, '
                               f'found {sorted(scale_dtypes) or "none"}')
    try:
      quant_settings = compressed.settings_from_config(hf_config, str(config_file), scale_dtypes.pop())
    except ValueError as e:  # names config.json already
      raise errors.InvalidFile(str(e)) from None
    except (KeyError, TypeError) as e:  # a field it needs missing or of another type
      raise errors.InvalidFile(f'{config_file}: unsupported quantization_config ({type(e).__name__}: {e})') from None
    config_overrides = {'quant': quant_settings, **config_overrides}
  config = config_from_hf(hf_config, str(config_file), **config_overrides)
  check_tensors(headers, config, str(path), str(config_file))  # before any tensor data is read
  return config, headers


def load_hf(path: str | pathlib.Path, **config_overrides: Any) -> tuple[ModelConfig, dict]:
  """(config, params) from a transformers Cohere2/Cohere directory, in host memory; params keep the file's
  dtype. Checked first as `read_config` checks it. `load_sharded` reads straight onto devices instead."""
  config, headers = read_config(path, **config_overrides)
  return config, params_from_hf(_read_tensors(headers), config, str(path))


# ---- streaming: each device reads its own block of each tensor -----------------------------------------------


def read_block(tensor: TensorHeader, index: tuple[slice, ...]) -> np.ndarray:
  """Block `index` of one tensor, copied out of a memory map of its file: only that block's bytes are read."""
  array = np.memmap(tensor.file, dtype=jax.numpy.dtype(tensor.dtype), mode='r', offset=tensor.offset,
                    shape=tensor.shape)
  return np.array(array[index])


def _hf_region(kind: str, index: tuple[slice, ...], heads: int, head_dim: int
               ) -> tuple[tuple[slice, ...], Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]:
  """Where block `index` of our layout of an HF Linear or vector lies in the HF tensor: (its region,
  HF values there → our block, our block → HF values there). A region spans whole heads (head_dim is never
  split, `luckystar.model.sharding`)."""
  if kind == 'vector':
    return index, lambda a: a, lambda b: b
  if kind == 'linear':   # ours [in, out] ↔ HF [out, in]
    return index[::-1], lambda a: a.T, lambda b: b.T
  if kind == 'in_proj':   # ours [embed, heads, head_dim] ↔ HF [heads·head_dim, embed]
    embed, head, dim = index
  else:                  # out_proj: ours [heads, head_dim, embed] ↔ HF [embed, heads·head_dim]
    head, dim, embed = index
  first, last, _ = head.indices(heads)
  if dim.indices(head_dim)[:2] != (0, head_dim):
    raise ValueError(f'a block of {dim} of head_dim {head_dim}: head_dim must not be split')
  rows, count = slice(first * head_dim, last * head_dim), last - first
  if kind == 'in_proj':
    return ((rows, embed), lambda a: a.reshape(count, head_dim, -1).transpose(2, 0, 1),
            lambda b: b.reshape(b.shape[0], -1).T)
  return ((embed, rows), lambda a: a.reshape(a.shape[0], count, head_dim).transpose(1, 2, 0),
          lambda b: b.reshape(-1, b.shape[-1]).T)


def load_sharded(config: ModelConfig, headers: Mapping[str, TensorHeader], shardings: Any) -> dict:
  """Our params from a float checkpoint's tensors (`read_config`), each leaf made by
  `jax.make_array_from_callback` in its sharding: every device reads only its block of the file, cast to
  `config.param_dtype`, so the model is never assembled in one host's memory. Embedding rows past the
  vocabulary (`config.vocab_padding`) are zeros."""
  if is_served(config):
    raise ValueError('load_sharded reads float checkpoints; an int4 one loads through load_hf')
  dtype = jax.numpy.dtype(config.param_dtype)
  period, groups = config.layer_period, config.num_layers // config.layer_period

  def leaf(shape, sharding, block):
    return jax.make_array_from_callback(shape, sharding, lambda index: block(index).astype(dtype))

  def embedding_block(index):
    rows, columns = index
    first, last, _ = rows.indices(config.embedding_rows)
    real = read_block(headers[EMBEDDING], (slice(first, min(last, config.vocab_size)), columns))
    return np.concatenate([real, np.zeros((last - first - real.shape[0], real.shape[1]), real.dtype)])

  def layer_block(i, hf_name, kind, ours):
    heads = config.num_heads if ours[1] in ('q_proj', 'o_proj') else config.num_kv_heads
    def block(index):
      region, to_ours, _ = _hf_region(kind, index[1:], heads, config.head_dim)
      return np.stack([to_ours(read_block(headers[f'model.layers.{g * period + i}.{hf_name}'], region))
                       for g in range(*index[0].indices(groups))])
    return block

  params = {'embedding': leaf((config.embedding_rows, config.hidden_size), shardings['embedding'], embedding_block),
            'norm': {'weight': leaf((config.hidden_size,), shardings['norm']['weight'],
                                    lambda index: read_block(headers['model.norm.weight'], index))},
            'layers': {}}
  for i in range(period):
    layer = params['layers'][f'layer_{i}'] = {}
    for hf_name, ours, kind, _ in _layer_tensors(config):
      node, node_shardings = layer, shardings['layers'][f'layer_{i}']
      for key in ours[:-1]:
        node, node_shardings = node.setdefault(key, {}), node_shardings[key]
      sharding = node_shardings[ours[-1]]
      node[ours[-1]] = leaf((groups, *_our_shape(headers[f'model.layers.{i}.{hf_name}'].shape, kind, ours, config)),
                            sharding, layer_block(i, hf_name, kind, ours))
  return params




_SAFETENSORS_NAMES = {numpy_name: name for name, (numpy_name, _) in _SAFETENSORS_DTYPES.items()}
MAX_SHARD_BYTES = 5 << 30   # transformers' default shard size


def _write_shards(directory: pathlib.Path, blocks: Iterator[Block], dtypes: Mapping[str, str],
                  shapes: Mapping[str, tuple[int, ...]], max_shard_bytes: int) -> None:
  """Every tensor of `shapes` as safetensors files of at most `max_shard_bytes` each (one tensor per file at
  least), with model.safetensors.index.json when there is more than one. Process 0 writes each file's header
  and sizes it (every shape and dtype is known up front); then every process writes its own `blocks`
  (`hf_blocks`) in place through a memory map, one block in memory at a time and nothing gathered. The
  processes must share `directory`."""
  names = list(shapes)
  sizes = {name: math.prod(shapes[name]) * jax.numpy.dtype(dtypes[name]).itemsize for name in names}
  shards, used = [[]], 0
  for name in names:
    if shards[-1] and used + sizes[name] > max_shard_bytes:
      shards.append([])
      used = 0
    shards[-1].append(name)
    used += sizes[name]
  files = (['model.safetensors'] if len(shards) == 1 else
           [f'model-{k + 1:05d}-of-{len(shards):05d}.safetensors' for k in range(len(shards))])
  where = {}   # name → (file, absolute offset of its data)
  for k, shard in enumerate(shards):
    header, offset = {'__metadata__': {'format': 'pt'}}, 0
    for name in shard:
      header[name] = {'dtype': _SAFETENSORS_NAMES[dtypes[name]], 'shape': list(shapes[name]),
                      'data_offsets': [offset, offset + sizes[name]]}
      offset += sizes[name]
    text = json.dumps(header, separators=(',', ':')).encode()
    text += b' ' * (-len(text) % 8)   # data 8-byte aligned, as safetensors writes it
    where |= {name: (directory / files[k], 8 + len(text) + header[name]['data_offsets'][0]) for name in shard}
    if jax.process_index() == 0:
      with open(directory / files[k], 'wb') as f:
        f.write(len(text).to_bytes(8, 'little') + text)
        f.truncate(8 + len(text) + offset)
      (directory / files[k]).chmod(0o644)
  distributed.barrier(f'{directory} headers')
  for name, region, block in blocks:
    file, offset = where[name]
    if sizes[name]:
      target = np.memmap(file, jax.numpy.dtype(dtypes[name]), mode='r+', offset=offset, shape=shapes[name])
      target[region] = block
      target.flush()
      del target
  if len(shards) > 1 and jax.process_index() == 0:
    index = {'metadata': {'total_size': sum(sizes.values())}, 'weight_map': {n: files[k] for k, shard in
                                                                             enumerate(shards) for n in shard}}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + '\n')


def save_hf(path: str | pathlib.Path, config: ModelConfig, params: Any, *, dtype: str = 'bfloat16',
            tokenizer: Tokenizer | None = None, extra_files: dict[str, str] | None = None,
            max_shard_bytes: int = MAX_SHARD_BYTES) -> None:
  """Writes a transformers directory: config.json and model.safetensors in `dtype` ('float32' or
  'bfloat16'); with `tokenizer`, also its files with our chat template for its format
  (`hf_tokenizer.export_files`: AutoTokenizer encodes and renders as we do; ours also as transformers
  tokenizer files; a checkpoint's own as they came, its own template kept beside ours) and a
  generation_config.json that stops at EOS, end of turn or end of action (a tool call, for the caller to
  run); and any `extra_files` (name → text).
  An int4-served config (luckystar.quant.convert) writes its Linears as compressed-tensors
  pack-quantized tensors (scales in `config.quant.scale_dtype`) and the rest in `dtype`.
  Weights stream out into safetensors shards of at most `max_shard_bytes` (`_write_shards`): each process
  writes the blocks of the params it holds, nothing gathered (int4 Linears: a layer at a time), into a
  directory every process sees; every process must call this. Written to a temporary sibling and renamed,
  so `path` is complete or absent."""
  if dtype not in SAVE_DTYPES:
    raise ValueError(f'dtype must be one of {SAVE_DTYPES}, got {dtype!r}')
  path = pathlib.Path(path)
  if path.exists():
    raise FileExistsError(f'{path}: exists; remove it or choose another directory')
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f'.{path.name}.partial')   # one name on every process: they write into it together
  if jax.process_index() == 0:
    shutil.rmtree(tmp, ignore_errors=True)   # left by a save that was killed
    tmp.mkdir()
  distributed.barrier(f'save_hf {path} start')
  try:
    # Float tensors in `dtype`; compressed-tensors' packed ints, shapes and scales in their own dtypes.
    expected = expected_tensors(config)
    scale_dtype = config.quant.scale_dtype if is_served(config) else dtype
    dtypes = {name: {'float': scale_dtype if name.endswith('weight_scale') else dtype, 'packed': 'int32',
                     'shape': 'int64'}[kind] for name, (_, _, kind) in expected.items()}
    _write_shards(tmp, hf_blocks(params, config), dtypes, {name: e[0] for name, e in expected.items()},
                  max_shard_bytes)
    distributed.barrier(f'save_hf {path} weights')
    if jax.process_index() != 0:
      return
    hf_config = config_to_hf(config, dtype)
    if tokenizer is not None:  # else transformers' Cohere defaults (ids of Cohere's own 256k vocabulary)
      hf_config.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)
    (tmp / 'config.json').write_text(json.dumps(hf_config, indent=2) + '\n')
    if tokenizer is not None:
      for name, content in hf_tokenizer.export_files(tokenizer, config.max_position_embeddings).items():
        (tmp / name).parent.mkdir(exist_ok=True)
        (tmp / name).write_bytes(content if isinstance(content, bytes) else content.encode())
      # END_ACTION too: a transformers/vLLM server hands a tool call back instead of generating its result.
      stops = list(dict.fromkeys([tokenizer.eos_id, tokenizer.end_of_turn_id, tokenizer.end_of_action_id]))
      generation = {'bos_token_id': tokenizer.bos_id, 'eos_token_id': stops, 'pad_token_id': tokenizer.pad_id}
      (tmp / 'generation_config.json').write_text(json.dumps(generation, indent=2) + '\n')
    for name, text in (extra_files or {}).items():
      (tmp / name).write_text(text)
    os.replace(tmp, path)
  except BaseException:
    if jax.process_index() == 0:
      shutil.rmtree(tmp, ignore_errors=True)
    raise
  finally:
    distributed.barrier(f'save_hf {path} done')
