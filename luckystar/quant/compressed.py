"""compressed-tensors `pack-quantized` (W4A16) tensors ⇄ AQT's frozen int values and scales (docs/int4_and_export.md).

What transformers and vLLM's compressed-tensors W4A16 loader read, per quantized Linear `<name>`:

  <name>.weight_packed  int32 [out, in/8]   value q in [-8, 7] stored as q + 8; element k of each run of 8
                                            at bits 4·(k % 8), least significant first
  <name>.weight_scale   scale_dtype [out, in/group]  ([out, 1] for per-channel scales)
  <name>.weight_shape   int64 [2] = [out, in]

and weight = q * scale. `quantization_config` in config.json names the scheme (`config_groups` with
`strategy` 'group' or 'channel'), `format: pack-quantized` and `ignore: ['lm_head']` (the LM head is the
tied, unquantized embedding). Pure numpy: writing a checkpoint needs neither torch nor compressed-tensors.
"""

from typing import Any

import numpy as np

from luckystar.quant.quantize import QuantSettings

FORMAT = 'pack-quantized'
PACK_BITS = 32


def pack(values: np.ndarray, bits: int = 4) -> np.ndarray:
  """int values [out, in] in [-2^(bits-1), 2^(bits-1)) → int32 [out, ceil(in·bits/32)], densely packed
  along `in` (compressed-tensors' `pack_to_int32`, packed_dim=1). bits must divide 32."""
  if PACK_BITS % bits:
    raise ValueError(f'packing {bits}-bit values into int32 words needs bits dividing 32')
  values = np.asarray(values).astype(np.int64)
  offset = 1 << (bits - 1)
  if values.size and (values.min() < -offset or values.max() >= offset):
    raise ValueError(f'values must lie in [{-offset}, {offset - 1}], got [{values.min()}, {values.max()}]')
  per_word = PACK_BITS // bits
  rows, cols = values.shape
  words = -(-cols // per_word)
  unsigned = np.zeros((rows, words * per_word), np.uint32)
  unsigned[:, :cols] = values + offset              # padding stays 0, as compressed-tensors pads
  unsigned = unsigned.reshape(rows, words, per_word)
  shifts = (np.arange(per_word, dtype=np.uint32) * bits)
  return np.bitwise_or.reduce(unsigned << shifts, axis=-1).astype(np.uint32).view(np.int32)


def unpack(packed: np.ndarray, shape: tuple[int, int], bits: int = 4) -> np.ndarray:
  """Inverse of `pack`: int32 [out, words] → int8 [out, in] with `shape` = (out, in)."""
  packed = np.asarray(packed)
  if packed.dtype != np.int32:
    raise ValueError(f'packed weights must be int32, got {packed.dtype}')
  per_word = PACK_BITS // bits
  rows, cols = int(shape[0]), int(shape[1])
  if packed.shape != (rows, -(-cols // per_word)):
    raise ValueError(f'packed weights have shape {packed.shape}; {shape} needs ({rows}, {-(-cols // per_word)})')
  shifts = np.arange(per_word, dtype=np.uint32) * bits
  unsigned = (packed.view(np.uint32)[..., None] >> shifts) & ((1 << bits) - 1)
  return (unsigned.reshape(rows, -1)[:, :cols].astype(np.int16) - (1 << (bits - 1))).astype(np.int8)


def quantization_config(settings: QuantSettings) -> dict[str, Any]:
  """config.json's `quantization_config` for weight-only int quantization of every Linear but lm_head."""
  weights = {'num_bits': settings.bits, 'type': 'int', 'symmetric': True, 'strategy': settings.strategy,
             'group_size': settings.group_size or None, 'dynamic': False, 'observer': 'minmax'}
  return {'quant_method': 'compressed-tensors', 'format': FORMAT, 'quantization_status': 'compressed',
          'config_groups': {'group_0': {'targets': ['Linear'], 'weights': weights, 'input_activations': None,
                                        'output_activations': None, 'format': FORMAT}},
          'ignore': ['lm_head'], 'kv_cache_scheme': None, 'global_compression_ratio': None}


def is_quantized(hf_config: dict[str, Any]) -> bool:
  return (hf_config.get('quantization_config') or {}).get('quant_method') == 'compressed-tensors'


def settings_from_config(hf_config: dict[str, Any], path: str, scale_dtype: str) -> QuantSettings:
  """SERVE settings for a compressed-tensors checkpoint; anything but what `quantization_config` writes
  (one weight-only symmetric int group over the Linears, pack-quantized) is an error naming the file."""
  qc = hf_config['quantization_config']
  groups = list((qc.get('config_groups') or {}).values())
  if qc.get('format') != FORMAT or len(groups) != 1:
    raise ValueError(f'{path}: only compressed-tensors "{FORMAT}" with one config group is supported, got '
                     f'format {qc.get("format")!r} with {len(groups)} groups')
  group = groups[0]
  weights = group.get('weights') or {}
  problems = []
  if group.get('input_activations') or group.get('output_activations'):
    problems.append('activations are quantized (only weight-only W4A16-style schemes are)')
  if weights.get('type') != 'int' or not weights.get('symmetric', True):
    problems.append(f'weights are {weights.get("type")!r}, symmetric={weights.get("symmetric")} (need symmetric int)')
  if weights.get('strategy') not in ('group', 'channel'):
    problems.append(f'strategy {weights.get("strategy")!r} (need "group" or "channel")')
  if weights.get('actorder') not in (None, False):
    problems.append(f'actorder {weights.get("actorder")!r} (activation reordering is not supported)')
  if set(qc.get('ignore') or []) - {'lm_head'}:
    problems.append(f'ignore lists {qc["ignore"]} (only lm_head may stay unquantized)')
  if problems:
    raise ValueError(f'{path}: unsupported quantization_config: {"; ".join(problems)}')
  group_size = int(weights.get('group_size') or 0) if weights['strategy'] == 'group' else 0
  if weights['strategy'] == 'group' and group_size <= 0:
    raise ValueError(f'{path}: strategy "group" needs a positive group_size, got {weights.get("group_size")!r}')
  return QuantSettings('serve', int(weights['num_bits']), group_size, scale_dtype)


def to_hf(value: np.ndarray, scale: np.ndarray, settings: QuantSettings, scale_dtype: Any
          ) -> dict[str, np.ndarray]:
  """One layer's AQT value [in, out] or [in/g, g, out] and scale [1, out] or [in/g, 1, out] → the three
  compressed-tensors tensors (suffixes weight_packed / weight_scale / weight_shape)."""
  value = np.asarray(value).astype(np.int8)
  out_features = value.shape[-1]
  q = value.reshape(-1, out_features).T                                       # [out, in]
  scale = np.asarray(scale, np.float32).reshape(-1, out_features).T           # [out, in/g] or [out, 1]
  exported = scale.astype(scale_dtype)
  if not np.array_equal(exported.astype(np.float32), scale):
    raise ValueError(f'scales are not {np.dtype(scale_dtype).name} values; quantize with '
                     f'scale_dtype={np.dtype(scale_dtype).name!r} (the export dtype) so the export is exact')
  return {'weight_packed': pack(q, settings.bits), 'weight_scale': np.ascontiguousarray(exported),
          'weight_shape': np.array(q.shape, np.int64)}


def from_hf(tensors: dict[str, np.ndarray], settings: QuantSettings, name: str = '<tensor>'
            ) -> tuple[np.ndarray, np.ndarray]:
  """Inverse of `to_hf`: {weight_packed, weight_scale, weight_shape} → (AQT value int8, scale float32)."""
  shape = tuple(int(d) for d in np.asarray(tensors['weight_shape']).reshape(-1))
  if len(shape) != 2:
    raise ValueError(f'{name}.weight_shape must hold [out, in], got {shape}')
  out_features, in_features = shape
  q = unpack(tensors['weight_packed'], shape, settings.bits)                  # [out, in]
  scale = np.asarray(tensors['weight_scale']).astype(np.float32)
  groups = in_features // settings.group_size if settings.group_size else 1
  if settings.group_size and in_features % settings.group_size:
    raise ValueError(f'{name}: group size {settings.group_size} does not divide {in_features} input features')
  if scale.shape != (out_features, groups):
    raise ValueError(f'{name}.weight_scale has shape {scale.shape}; expected {(out_features, groups)}')
  if settings.group_size:
    return (q.T.reshape(groups, settings.group_size, out_features),
            scale.T.reshape(groups, 1, out_features))
  return q.T, scale.T
