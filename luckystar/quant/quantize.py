"""AQT int weight-only quantization of the dense layers (docs/int4_and_export.md), through `aqt.jax.v2`'s flax layer.

`ModelConfig.quant = QuantSettings(mode, bits, group_size, scale_dtype)` turns every dense layer
(`Projection`: q/k/v/o and gate/up/down; the tied embedding stays float) into an `AqtDotGeneral`:

  train    fake quant: float kernels, the forward pass uses their int round trip, gradients pass
           straight through (quantization-aware fine-tuning with any stage's loss)
  convert  one forward pass that freezes, beside each float kernel, AQT's int values and scales
  serve    no float kernels; each layer dequantizes its int values at use (`convert` returns these
           params; `luckystar.sampling` and `Model.logits` run them unchanged, since they take any
           config and param tree)

The frozen tensors live in the 'params' collection, so they travel with the params through jit, the
layer scan and the sampler:

  .../<proj>/aqt/qrhs/value  int4 [in, out] (per channel) or [in/g, g, out] (groups of g inputs)
  .../<proj>/aqt/qrhs/scale  float32 [1, out] or [in/g, 1, out]

`in` and `out` are the projection's flattened contracted and output axes, i.e. HF's Linear weight
[out, in] transposed. Symmetric: weight = value * scale, value in [-7, 7] (AQT's int4 keeps zero and
a symmetric range; compressed-tensors reads any value in [-8, 7]).

Scales are rounded to `scale_dtype` (the export dtype) before the values are computed, and are carried
as float32 holding those rounded values: value * scale is then exact in float32 (4 bits times bf16's 8
significant bits), on every backend, in TRAIN and SERVE alike, and the export stores them in
`scale_dtype` losslessly. transformers loading the export in float32 dequantizes to the same exact
products, so its weights equal the SERVE weights bit for bit and logits differ only by summation order.
"""

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from aqt.jax.v2 import calibration as aqt_calibration
from aqt.jax.v2 import config as aqt_config
from aqt.jax.v2 import tiled_dot_general
from aqt.jax.v2 import utils as aqt_utils
from aqt.jax.v2.flax import aqt_flax

from luckystar.model.cohere2 import Decoder
from luckystar.model.config import ModelConfig

MODES = ('train', 'convert', 'serve')
SCALE_DTYPES = ('bfloat16', 'float16', 'float32')
_AQT_MODES = {'train': aqt_utils.QuantMode.TRAIN, 'convert': aqt_utils.QuantMode.CONVERT,
              'serve': aqt_utils.QuantMode.SERVE}
AQT_NAME = 'aqt'  # the AqtDotGeneral's name inside each projection; its frozen tensors sit under AQT_NAME/qrhs


@aqt_utils.flax_slots_kw_only_dataclass
class RoundedAbsMaxCalibration(aqt_calibration.AbsMaxCalibration):
  """max|w| / 7.5 per channel or group (AQT's abs-max), rounded to `round_to` before quantizing, so the
  int values are the best ones for the scale that is actually stored and exported."""
  round_to: Any = aqt_utils.static_field(default=None)

  def get_scale_and_bias_and_sparsity(self, x, shared_axes, numerics_, context=None):
    # (no zero-argument super(): slots dataclasses are rebuilt classes)
    (scale,), bias, sparsity = aqt_calibration.AbsMaxCalibration.get_scale_and_bias_and_sparsity(
        self, x, shared_axes, numerics_, context)
    return [scale.astype(self.round_to).astype(scale.dtype)], bias, sparsity


@dataclasses.dataclass(frozen=True)
class QuantSettings:
  """How the dense layers quantize their weights; hashable, it rides on ModelConfig.quant (static)."""
  mode: str = 'serve'            # one of MODES
  bits: int = 4
  group_size: int = 0            # 0: one scale per output channel; else one per `group_size` input features
  scale_dtype: str = 'bfloat16'  # the export dtype: scales are rounded to its values (kept in float32)

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f'quantization mode {self.mode!r} is not one of {MODES}')
    if not 2 <= self.bits <= 8:
      raise ValueError(f'quantization bits must be in [2, 8], got {self.bits}')
    if self.group_size < 0:
      raise ValueError(f'quantize.group_size must be 0 (per channel) or positive, got {self.group_size}')
    if self.scale_dtype not in SCALE_DTYPES:
      raise ValueError(f'scale dtype {self.scale_dtype!r} is not one of {SCALE_DTYPES}')

  @property
  def strategy(self) -> str:
    """compressed-tensors' name for the scale granularity."""
    return 'group' if self.group_size else 'channel'

  @property
  def value_dtype(self) -> np.dtype:
    """The frozen int values' dtype, as AQT stores them: int4 for 4 bits, int8 for the others."""
    return np.dtype(aqt_utils.infer_dtype_from_bits(self.bits))

  def replace(self, **changes: Any) -> 'QuantSettings':
    return dataclasses.replace(self, **changes)

  def aqt_config(self) -> aqt_config.DotGeneral:
    """Weight-only: activations (lhs) and gradients stay float; weights (rhs) are `bits`-bit symmetric
    ints, abs-max calibrated per output channel (or per tile of the contraction axis), dequantized
    before the matmul (DequantMode.THIS_INPUT)."""
    cfg = aqt_config.config_v4(fwd_bits=self.bits, dlhs_bits=None, drhs_bits=None)
    aqt_config.set_bits(cfg, fwd_lhs_bit=None, fwd_rhs_bit=self.bits, dlhs_lhs_bit=None, dlhs_rhs_bit=None,
                        drhs_lhs_bit=None, drhs_rhs_bit=None)
    aqt_config.set_fwd_dequant_mode(cfg, rhs_dequant_mode=aqt_config.DequantMode.THIS_INPUT)
    # Straight-through QAT: the activation gradient uses the int weights the forward pass used, not the
    # float ones (AQT's default for dlhs); the weight gradient is the float one.
    aqt_config.set_use_fwd_quant(cfg, dlhs_use_fwd_quant=True, drhs_use_fwd_quant=aqt_config.SKIP)
    cfg.fwd.dg_quantizer.rhs.calibration = functools.partial(RoundedAbsMaxCalibration,
                                                             round_to=jnp.dtype(self.scale_dtype))
    return cfg

  def matmul(self, module: nn.Module, lhs: jax.Array, kernel_shape: tuple[int, ...], init: Any) -> jax.Array:
    """lhs [N, in] @ the kernel of `module` (a Projection, shape `kernel_shape` = [*contracted, *features])
    flattened to [in, out]; called inside the module's compact __call__."""
    contracted = lhs.shape[-1]
    if self.group_size and contracted % self.group_size:
      raise ValueError(f'quantize.group_size={self.group_size} does not divide the {contracted} input features '
                       f'of {"/".join(module.path)}; choose a divisor, or 0 for per-channel scales')
    if self.mode == 'serve':  # a placeholder AQT only reads the shape of: the frozen ints are used instead
      kernel = jnp.zeros((contracted, math.prod(kernel_shape) // contracted), lhs.dtype)
    else:
      kernel = module.param('kernel', init, kernel_shape, module.param_dtype).reshape(contracted, -1)
      kernel = kernel.astype(lhs.dtype)
    tiling = None
    if self.group_size:
      tiling = tiled_dot_general.Cfg(
          lhs=tiled_dot_general.TensorTiling(
              contraction_axes=[tiled_dot_general.AxisTiling(axis=1, tile_size=self.group_size)], remaining_axes=[]),
          rhs=tiled_dot_general.TensorTiling(
              contraction_axes=[tiled_dot_general.AxisTiling(axis=0, tile_size=self.group_size)], remaining_axes=[]))
    dot_general = aqt_flax.AqtDotGeneral(
        self.aqt_config(), prng_name=None, lhs_quant_mode=aqt_utils.QuantMode.TRAIN,
        rhs_quant_mode=_AQT_MODES[self.mode], rhs_freeze_mode=aqt_flax.FreezerMode.CALIBRATION_AND_VALUE,
        quant_collection='params', tiling_cfg=tiling, parent=module, name=AQT_NAME)
    return dot_general(lhs, kernel, (((1,), (0,)), ((), ())), None)


def with_quant(config: ModelConfig, mode: str = 'train', *, bits: int = 4, group_size: int = 0,
               scale_dtype: str = 'bfloat16') -> ModelConfig:
  """`config` with its dense layers quantized in `mode` (e.g. 'train' for quantization-aware training)."""
  return config.replace(quant=QuantSettings(mode, bits, group_size, scale_dtype))


def is_served(config: ModelConfig) -> bool:
  return config.quant is not None and config.quant.mode == 'serve'


def convert(config: ModelConfig, params: Any, *, bits: int = 4, group_size: int = 0,
            scale_dtype: str = 'bfloat16') -> tuple[ModelConfig, Any]:
  """Float (or QAT) params → (serving config, params with int values + scales and no float kernels).

  AQT's CONVERT mode: one forward pass on a dummy token freezes every dense layer's quantized kernel;
  the float kernels are then dropped. Scales hold `scale_dtype` values, as float32.
  Settings come from `config.quant` when it is set (a QAT config), else from the arguments.
  """
  if config.quant is not None and config.quant.mode == 'serve':
    raise ValueError('these params are already quantized (config.quant.mode == "serve"); convert the float model')
  settings = (config.quant or QuantSettings(bits=bits, group_size=group_size, scale_dtype=scale_dtype))
  convert_config = config.replace(quant=settings.replace(mode='convert'))

  @jax.jit
  def freeze(params):
    _, variables = Decoder(convert_config).apply({'params': params}, jnp.zeros((1, 1), jnp.int32),
                                                 mutable=['params'])
    return variables['params']

  frozen = freeze(params)
  return config.replace(quant=settings.replace(mode='serve')), _drop_float_kernels(frozen)


def _drop_float_kernels(tree: Any) -> Any:
  if not isinstance(tree, dict):
    return tree
  if AQT_NAME in tree and 'kernel' in tree:
    frozen = tree[AQT_NAME]['qrhs']
    return {AQT_NAME: {'qrhs': {'value': frozen['value'], 'scale': frozen['scale'].astype(jnp.float32)}}}
  return {key: _drop_float_kernels(value) for key, value in tree.items()}


def is_quantized_leaf(path: tuple[Any, ...]) -> bool:
  """Whether a param-tree path (of `jax.tree_util` keys) is a frozen int value or scale."""
  return any(getattr(key, 'key', None) == AQT_NAME for key in path)


def cast_float_params(params: Any, dtype: Any) -> Any:
  """Float params to `dtype`; frozen int values and their (float32) scales keep their dtypes."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.asarray(np.asarray(x), None if is_quantized_leaf(path) else dtype), params)


def dequantize(config: ModelConfig, params: Any) -> tuple[ModelConfig, Any]:
  """(float config, float params) with kernels = value * scale: the exact weights SERVE multiplies
  with (float32), for comparisons and for evaluating a quantized model with float code."""
  if not is_served(config):
    raise ValueError(f'dequantize needs a served int model (config.quant.mode == "serve"), got {config.quant}')
  float_config = config.replace(quant=None)
  shapes = nn.unbox(jax.eval_shape(lambda: Decoder(float_config).init(jax.random.key(0),
                                                                        jnp.zeros((1, 1), jnp.int32))))['params']

  def walk(tree, shape_tree):
    if isinstance(tree, dict) and AQT_NAME in tree:
      frozen = tree[AQT_NAME]['qrhs']
      kernel = frozen['value'].astype(jnp.float32) * frozen['scale']   # exact: see the module docstring
      return {'kernel': kernel.reshape(shape_tree['kernel'].shape)}
    if isinstance(tree, dict):
      return {key: walk(value, shape_tree[key]) for key, value in tree.items()}
    return jnp.asarray(tree, jnp.float32)

  return float_config, walk(params, shapes)
