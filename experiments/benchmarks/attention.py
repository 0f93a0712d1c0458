"""One decoder layer's forward + backward with the dense attention of earlier releases ('xla': [T, T] fp32 scores
and mask) against the blockwise one (online softmax over the key blocks a query block can see), on CPU.

    python experiments/benchmarks/attention.py [--lengths=2048,8192,32768] [--repeats=3] [--block=512]

The layer is `cohere2.Block` (LayerNorm, attention, MLP; its parameters and input both differentiated)
of a sliding layer with a 4,096-token window, hidden 512, 8 query heads over 2 KV heads (head_dim 64),
MLP 1536, fp32, one row of T tokens. For each T and backend: XLA's compiled temporary bytes
(`memory_analysis()`, the activations and scores the step needs beyond its inputs and outputs) and
the median wall time of `repeats` runs after a warm-up, with the spread (min–max). Rows whose compiled
temporaries exceed `--max_run_gb` are compiled but not run (the dense backend at 32k: its scores alone
are 2 · 4 · 32k² · 4 B ≈ 34 GB). Prints a markdown table; the ratios are taken in this run.

    python experiments/benchmarks/attention.py --bench_step [--lengths=128,256,512,1024,2048]

instead times the whole SFT update of the `bench` model (`sft_step.ours_step`: AdamW, one jit)
with each backend at every length, rows × T = 2,048 tokens per step, xla and blockwise alternating step by
step (`sft_step.alternate`, --rounds × --repeats steps each): the measurement behind `attention_impl='auto'`
on CPU.
"""

import argparse
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from luckystar import model
from luckystar.model import cohere2

WINDOW = 4096


def layer_config(impl: str, block: int) -> model.ModelConfig:
  return model.get('tiny', hidden_size=512, intermediate_size=1536, num_heads=8, num_kv_heads=2, num_layers=1,
                   layer_types=(model.SLIDING,), sliding_window=WINDOW, max_position_embeddings=32768,
                   attention_impl=impl, attention_block=block)


def measure(impl: str, length: int, block: int, repeats: int, max_run_bytes: float) -> dict:
  config = layer_config(impl, block)
  layer = cohere2.Block(config, sliding=True)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(1, length, config.hidden_size)), jnp.float32)
  positions = jnp.arange(length)[None]
  segments = jnp.ones((1, length), jnp.int32)
  params = jax.jit(layer.init)(jax.random.key(0), x[:, :8], positions[:, :8], segments[:, :8])

  def loss(params, x):
    return (layer.apply(params, x, positions, segments) ** 2).mean()

  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  start = time.perf_counter()
  compiled = step.lower(params, x).compile()
  compile_s = time.perf_counter() - start
  temp = compiled.memory_analysis().temp_size_in_bytes
  times = []
  if temp <= max_run_bytes:
    jax.block_until_ready(compiled(params, x))
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(compiled(params, x))
      times.append(time.perf_counter() - start)
  return {'impl': impl, 'length': length, 'temp_bytes': temp, 'compile_s': compile_s, 'times': times}


def bench_step(lengths: list[int], rounds: int, repeats: int) -> None:
  import sft_step   # pylint: disable=g-import-not-at-top  (a sibling script: run from this directory's parent)
  print('| T | rows | xla step s (min–max) | blockwise step s (min–max) | xla / blockwise |')
  print('|---|---|---|---|---|')
  for length in lengths:
    rows = max(1, 2048 // length)
    configs = {impl: model.get('bench', attention_impl=impl) for impl in ('xla', 'blockwise')}
    times = sft_step.alternate({impl: sft_step.ours_step(config, sft_step.synthetic_batch(config, rows, length))
                                for impl, config in configs.items()}, steps=rounds * repeats, warmup=2)
    spread = lambda t: f'{statistics.median(t):.3f} ({min(t):.3f}–{max(t):.3f})'
    ratio = statistics.median(times['xla']) / statistics.median(times['blockwise'])
    print(f"| {length:,} | {rows} | {spread(times['xla'])} | {spread(times['blockwise'])} | {ratio:.2f}× |",
          flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--lengths', default='2048,8192,32768')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--block', type=int, default=512)
  parser.add_argument('--max_run_gb', type=float, default=12.0, help='compile only above this many temp GB')
  parser.add_argument('--bench_step', action='store_true', help='the bench SFT step per backend (docstring)')
  parser.add_argument('--rounds', type=int, default=3, help='--bench_step: alternating rounds')
  args = parser.parse_args()
  if args.bench_step:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    return bench_step(list(map(int, args.lengths.split(','))), args.rounds, max(args.repeats, 3))
  rows = []
  for length in map(int, args.lengths.split(',')):
    pair = [measure(impl, length, args.block, args.repeats, args.max_run_gb * 1e9) for impl in ('xla', 'blockwise')]
    rows.append(pair)
    for r in pair:
      print(f"{r['impl']:>9} T={length}: temp {r['temp_bytes'] / 1e9:.2f} GB, compile {r['compile_s']:.1f} s, "
            f"runs {[round(t, 2) for t in r['times']]}", flush=True)

  def timing(r):
    if not r['times']:
      return 'not run'
    return f"{statistics.median(r['times']):.2f} ({min(r['times']):.2f}–{max(r['times']):.2f})"

  print(f'\nJAX {jax.__version__}, {jax.devices()[0].device_kind}, {jax.local_device_count()} device(s); '
        f'window {WINDOW}, block {args.block}, {args.repeats} timed runs each\n')
  print('| T | dense temp GB | blockwise temp GB | memory ratio | dense s (min–max) | blockwise s (min–max) | '
        'speed-up |')
  print('|---|---|---|---|---|---|---|')
  for dense, blockwise in rows:
    speedup = (f"{statistics.median(dense['times']) / statistics.median(blockwise['times']):.2f}×"
               if dense['times'] and blockwise['times'] else '–')
    print(f"| {dense['length']:,} | {dense['temp_bytes'] / 1e9:.2f} | {blockwise['temp_bytes'] / 1e9:.2f} | "
          f"{dense['temp_bytes'] / blockwise['temp_bytes']:.1f}× | {timing(dense)} | {timing(blockwise)} | "
          f"{speedup} |")


if __name__ == '__main__':
  main()
