"""Memory planner: bytes of weights and KV cache for a model size, weight dtype, context and batch, and
whether they fit one GPU (default an 80 GB H100) (docs/int4_and_export.md).

    python -m luckystar.quant.planner --size=command_a_111b --weights=int4 --context=131072 --batch=1

Counts come from `jax.eval_shape` of the real model, nothing is allocated: the float model's params
(embedding, dense kernels, norms) and, for int4, the SERVE model's own frozen tensors (int values and
their scales, `luckystar.quant.quantize`), so the scale layout counted is the one that ships.

  bf16   every weight 2 bytes
  fp8    dense kernels 1 byte + one float32 scale per output channel; embedding and norms bf16
  int4   dense kernels ½ byte + one `scale_dtype` scale per group (or output channel); embedding
         (tied LM head, left unquantized as compressed-tensors' `ignore: [lm_head]`) and norms bf16

KV cache: our layout (`model.init_cache`): per layer, keys and values [batch, kv_heads, slots, head_dim]
with slots = context for full-attention layers and min(sliding_window, context) for sliding ones (a
server that keeps the whole context for sliding layers too needs more; `sliding_cache=False`).
"""

import argparse
import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from luckystar import model as model_lib
from luckystar.model.config import SLIDING, ModelConfig
from luckystar.quant.quantize import AQT_NAME, QuantSettings

WEIGHT_DTYPES = ('bf16', 'fp8', 'int4')
H100_BYTES = 80 * 10**9          # "80 GB" (nvidia-smi shows 81,559 MiB ≈ 85.5e9; we keep the round, smaller figure)
RUNTIME_RESERVE_BYTES = 6 * 10**9  # CUDA context, activations and workspace of a serving engine: a stated guess
_DTYPE_BYTES = {'bfloat16': 2, 'float16': 2, 'float32': 4, 'fp8': 1}


def _leaf_sizes(tree: Any) -> list[tuple[str, int]]:
  return [(jax.tree_util.keystr(path), int(np.prod(leaf.shape)))
          for path, leaf in jax.tree_util.tree_flatten_with_path(nn.unbox(tree))[0]]


def param_counts(config: ModelConfig) -> dict[str, int]:
  """{'embedding', 'linear', 'other', 'total'} parameter counts from `jax.eval_shape` of the model."""
  return dict(_param_counts(config.replace(quant=None)))


def int4_tensor_counts(config: ModelConfig, group_size: int, bits: int = 4) -> dict[str, int]:
  """{'values', 'scales'}: element counts of the SERVE model's frozen tensors (eval_shape of its init)."""
  return dict(_int4_tensor_counts(config.replace(quant=QuantSettings('serve', bits, group_size))))


@functools.lru_cache(maxsize=32)   # tracing a large model takes seconds; configs are hashable
def _param_counts(config: ModelConfig) -> dict[str, int]:
  counts = {'embedding': 0, 'linear': 0, 'other': 0}
  for path, size in _leaf_sizes(model_lib.abstract_params(config)):
    kind = 'embedding' if path == "['embedding']" else 'linear' if path.endswith("['kernel']") else 'other'
    counts[kind] += size
  return {**counts, 'total': sum(counts.values())}


@functools.lru_cache(maxsize=32)
def _int4_tensor_counts(served: ModelConfig) -> dict[str, int]:
  counts = {'values': 0, 'scales': 0}
  for path, size in _leaf_sizes(model_lib.abstract_params(served)):
    if f"['{AQT_NAME}']" in path:
      counts['values' if path.endswith("['value']") else 'scales'] += size
  return counts


def kv_cache_bytes(config: ModelConfig, context: int, batch: int, kv_bytes: float = 2,
                   sliding_cache: bool = True) -> int:
  """Keys and values of every layer for `batch` sequences of `context` tokens."""
  total = 0
  for layer_type in config.layer_types:
    slots = min(config.sliding_window, context) if layer_type == SLIDING and sliding_cache else context
    total += 2 * batch * config.num_kv_heads * slots * config.head_dim * kv_bytes
  return int(total)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  size: str
  weights: str                 # one of WEIGHT_DTYPES
  group_size: int
  context: int
  batch: int
  params: dict[str, int]       # param_counts
  linear_bytes: int            # dense kernels: values (and, quantized, their scales)
  scale_bytes: int             # the scales' share of linear_bytes
  embedding_bytes: int
  other_bytes: int             # norms
  kv_bytes: int
  device_bytes: int
  reserve_bytes: int
  config: ModelConfig
  sliding_cache: bool = True

  @property
  def weight_bytes(self) -> int:
    return self.linear_bytes + self.embedding_bytes + self.other_bytes

  @property
  def total_bytes(self) -> int:
    return self.weight_bytes + self.kv_bytes + self.reserve_bytes

  @property
  def fits(self) -> bool:
    return self.total_bytes <= self.device_bytes

  @property
  def max_context(self) -> int:
    """The longest context, up to the model's max_position_embeddings, whose KV cache at this batch still
    fits beside weights and reserve (0: none). The cache is not linear in the context: sliding layers stop
    growing at their window, so this searches `kv_cache_bytes` rather than scaling this plan's."""
    free = self.device_bytes - self.weight_bytes - self.reserve_bytes
    fits = lambda n: kv_cache_bytes(self.config, n, self.batch, sliding_cache=self.sliding_cache) <= free
    lo, hi = 0, self.config.max_position_embeddings   # fits(lo); the answer is in [lo, hi]
    if fits(hi):
      return hi
    while lo < hi:
      mid = (lo + hi + 1) // 2
      lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo

  def report(self) -> str:
    gb = lambda b: f'{b / 1e9:8.2f} GB'
    grouping = f'group {self.group_size}' if self.group_size else 'per channel'
    scheme = {'bf16': 'bf16', 'fp8': 'fp8 + per-channel f32 scales',
              'int4': f'int4 + bf16 scales ({grouping})'}[self.weights]
    lines = [
        f'{self.size}: {self.params["total"] / 1e9:.2f}B params ({self.params["linear"] / 1e9:.2f}B dense, '
        f'{self.params["embedding"] / 1e9:.2f}B embedding, {self.params["other"] / 1e3:.0f}k norms)',
        f'  dense weights   {gb(self.linear_bytes)}   {scheme}; scales {self.scale_bytes / 1e9:.2f} GB',
        f'  embedding       {gb(self.embedding_bytes)}   bf16, unquantized (tied LM head)',
        f'  norms           {gb(self.other_bytes)}',
        f'  KV cache        {gb(self.kv_bytes)}   bf16, context {self.context}, batch {self.batch}',
        f'  runtime reserve {gb(self.reserve_bytes)}',
        f'  total           {gb(self.total_bytes)}   of {self.device_bytes / 1e9:.0f} GB: '
        f'{"fits" if self.fits else "does NOT fit"}; longest context at batch {self.batch}: {self.max_context} '
        f'(of the model\'s {self.config.max_position_embeddings})',
    ]
    return '\n'.join(lines)


def plan(size: str | ModelConfig, weights: str = 'int4', *, group_size: int = 128, context: int = 8192,
         batch: int = 1, device_bytes: int = H100_BYTES, reserve_bytes: int = RUNTIME_RESERVE_BYTES,
         sliding_cache: bool = True) -> MemoryPlan:
  """Bytes of `size` (a name of `luckystar.model.SIZES` or a ModelConfig) with `weights` in bf16/fp8/int4."""
  if weights not in WEIGHT_DTYPES:
    raise ValueError(f'weights must be one of {WEIGHT_DTYPES}, got {weights!r}')
  config = model_lib.get(size) if isinstance(size, str) else size
  params = param_counts(config)
  bf16 = _DTYPE_BYTES['bfloat16']
  scale_bytes = 0
  if weights == 'bf16':
    linear_bytes = bf16 * params['linear']
  elif weights == 'fp8':
    out_channels = int4_tensor_counts(config, group_size=0)['scales']   # per-channel: one scale per output
    scale_bytes = _DTYPE_BYTES['float32'] * out_channels
    linear_bytes = params['linear'] + scale_bytes
  else:
    counts = int4_tensor_counts(config, group_size)
    if counts['values'] != params['linear']:
      raise AssertionError(f'int4 values {counts["values"]} != dense params {params["linear"]}')
    scale_bytes = bf16 * counts['scales']
    linear_bytes = math.ceil(counts['values'] / 2) + scale_bytes
  return MemoryPlan(
      size=size if isinstance(size, str) else 'custom', weights=weights, group_size=group_size if weights == 'int4'
      else 0, context=context, batch=batch, params=params, linear_bytes=int(linear_bytes), scale_bytes=scale_bytes,
      embedding_bytes=bf16 * params['embedding'], other_bytes=bf16 * params['other'],
      kv_bytes=kv_cache_bytes(config, context, batch, sliding_cache=sliding_cache), device_bytes=device_bytes,
      reserve_bytes=reserve_bytes, config=config, sliding_cache=sliding_cache)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description='Weights + KV cache bytes of a model size on one GPU.')
  parser.add_argument('--size', default='command_a_111b')
  parser.add_argument('--weights', default='all', choices=(*WEIGHT_DTYPES, 'all'))
  parser.add_argument('--group_size', type=int, default=128)
  parser.add_argument('--context', type=int, default=131072)
  parser.add_argument('--batch', type=int, default=1)
  parser.add_argument('--device_gb', type=float, default=H100_BYTES / 1e9)
  args = parser.parse_args(argv)
  for weights in WEIGHT_DTYPES if args.weights == 'all' else (args.weights,):
    print(plan(args.size, weights, group_size=args.group_size, context=args.context, batch=args.batch,
               device_bytes=int(args.device_gb * 1e9)).report())


if __name__ == '__main__':
  main()
