"""SFT train-step throughput: our jitted step vs a plain torch AdamW step, and MFU (DESIGN §9).

    python experiments/benchmarks/sft_step.py                      # bench and small, 8 × 256 tokens
    python experiments/benchmarks/sft_step.py --sizes=bench --steps=3

(with luckystar installed, `pip install -e .`, or PYTHONPATH=. from the repository root)

For each size: tokens/s of `luckystar.train` 's SFT update (AdamW, clipping, non-finite guard, one
jit) and of a transformers `Cohere2ForCausalLM` of the same shape trained with `torch.optim.AdamW`
(forward with labels, backward, clip, step); MFU of both against the best of several 2048² fp32
matmuls timed in this process. Model FLOPs per step = 6 · params · tokens (tied embeddings: the
LM head is counted once, the lookup is free) + attention: 12 · layers · hidden · keys per query
(fwd+bwd of QKᵀ and PV), keys = causal mean (T+1)/2 on full layers, min(window, ...) on sliding ones.
Goals (DESIGN §9): ≥ 1.5× the torch step's tokens/s on `bench`, ≥ 40% MFU on `small`.
"""

import argparse
import functools
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from luckystar import model
from luckystar.interop import hf
from luckystar.model import sharding
from luckystar.train import optim
from luckystar.train import sft
from luckystar.train import state as state_lib
from luckystar.train import step as step_lib

OPTIMIZER = dict(learning_rate=1e-4, warmup_steps=0, total_steps=1000, weight_decay=0.1, b1=0.9, b2=0.95,
                 max_grad_norm=1.0)


def matmul_peak_flops(size: int = 2048, repeats: int = 8) -> float:
  """Best fp32 FLOP/s of a size² matmul, jitted, in this process."""
  a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
  matmul = jax.jit(lambda x: x @ x)
  matmul(a).block_until_ready()
  best = min(_timed(lambda: matmul(a).block_until_ready()) for _ in range(repeats))
  return 2 * size**3 / best


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def attended_keys(config: model.ModelConfig, length: int) -> float:
  """Mean keys per query over all layers (causal; the window caps sliding layers)."""
  positions = np.arange(1, length + 1)
  per_layer = [np.minimum(positions, config.sliding_window).mean() if kind == model.SLIDING else positions.mean()
               for kind in config.layer_types]
  return float(np.sum(per_layer))


def train_flops_per_step(config: model.ModelConfig, batch: int, length: int) -> float:
  tokens = batch * length
  return 6 * model.param_count(config) * tokens + 12 * config.hidden_size * attended_keys(config, length) * tokens


def synthetic_batch(config: model.ModelConfig, batch: int, length: int) -> dict[str, np.ndarray]:
  """One document per row, every token trained on (as the torch peer's labels)."""
  tokens = np.random.default_rng(0).integers(4, config.vocab_size, (batch, length)).astype(np.int32)
  return {'tokens': tokens, 'loss_mask': np.ones_like(tokens), 'segment_ids': np.ones_like(tokens),
          'positions': np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape).copy()}


def ours_step_seconds(config: model.ModelConfig, batch: dict[str, np.ndarray], steps: int, warmup: int) -> float:
  optimizer = optim.make(ml_collections.ConfigDict(OPTIMIZER))
  mesh = sharding.make_mesh()
  state = state_lib.create(config, optimizer, mesh, seed=0)
  update = step_lib.make_update_fn(functools.partial(sft.loss_fn, model_config=config), optimizer,
                                   step_lib.state_shardings_of(state), mesh=mesh)
  device_batch = update.put_batch(batch)
  compiled = update.lower(state, device_batch, state_lib.step_rng(state)).compile()
  rng = jax.device_put(jax.random.key(0), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  for _ in range(warmup):
    state, metrics = compiled(state, device_batch, rng)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = compiled(state, device_batch, rng)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def torch_step_seconds(config: model.ModelConfig, batch: dict[str, np.ndarray], steps: int, warmup: int) -> float:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  torch.set_num_threads(os.cpu_count())
  hf_config = transformers.Cohere2Config(pad_token_id=0, bos_token_id=2, eos_token_id=3, **{
      k: v for k, v in hf.config_to_hf(config).items() if k not in ('model_type', 'architectures')})
  peer = transformers.Cohere2ForCausalLM(hf_config).train()
  optimizer = torch.optim.AdamW(peer.parameters(), lr=OPTIMIZER['learning_rate'], betas=(0.9, 0.95),
                                weight_decay=OPTIMIZER['weight_decay'])
  input_ids = torch.from_numpy(batch['tokens']).long()

  def step():
    loss = peer(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(peer.parameters(), OPTIMIZER['max_grad_norm'])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

  for _ in range(warmup):
    step()
  return float(np.median([_timed(step) for _ in range(steps)]))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sizes', default='bench,small')
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--seq_len', type=int, default=256)
  parser.add_argument('--steps', type=int, default=5, help='timed steps (median reported)')
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--no_torch', action='store_true', help='skip the torch peer')
  args = parser.parse_args()

  peak = matmul_peak_flops()
  tokens = args.batch * args.seq_len
  print(f'devices: {jax.device_count()} × {jax.devices()[0].device_kind}, {os.cpu_count()} CPU cores; '
        f'matmul peak (best 2048² fp32): {peak / 1e9:.1f} GFLOP/s; batch {args.batch} × {args.seq_len} tokens\n')
  print(f'{"size":<7} {"params":>8} {"impl":<7} {"s/step":>8} {"tokens/s":>10} {"MFU":>7}')
  for size in args.sizes.split(','):
    config = model.get(size)
    batch = synthetic_batch(config, args.batch, args.seq_len)
    flops = train_flops_per_step(config, args.batch, args.seq_len)
    results = {'ours': ours_step_seconds(config, batch, args.steps, args.warmup)}
    if not args.no_torch:
      results['torch'] = torch_step_seconds(config, batch, args.steps, args.warmup)
    for impl, seconds in results.items():
      print(f'{size:<7} {model.param_count(config) / 1e6:>7.2f}M {impl:<7} {seconds:>8.3f} {tokens / seconds:>10.0f} '
            f'{flops / seconds / peak:>6.1%}')
    if 'torch' in results:
      print(f'{size:<7} ours / torch tokens/s: {results["torch"] / results["ours"]:.2f}×')
  print('\nGoals: ≥ 1.5× torch on bench; ≥ 40% MFU on small (DESIGN §9). A shared CPU lowers every figure.')


if __name__ == '__main__':
  main()
