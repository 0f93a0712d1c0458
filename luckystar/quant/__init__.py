"""AQT int4 weight-only quantization (TRAIN / CONVERT / SERVE), the compressed-tensors int4 format,
and the memory planner (docs/int4_and_export.md)."""

from luckystar.quant.quantize import (MODES, QuantSettings, cast_float_params, convert, dequantize, is_served,
                                      with_quant)

__all__ = ['MODES', 'QuantSettings', 'cast_float_params', 'convert', 'dequantize', 'is_served', 'with_quant']
