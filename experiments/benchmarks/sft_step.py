"""SFT train-step throughput: our jitted step vs a plain torch AdamW step, and MFU (docs/benchmarks.md).

    python experiments/benchmarks/sft_step.py                      # bench and small, 8 × 256 tokens
    python experiments/benchmarks/sft_step.py --sizes=bench --steps=3

(with luckystar installed, `pip install -e .`, or PYTHONPATH=. from the repository root)

For each size: tokens/s of `luckystar.engine` 's SFT update (AdamW, clipping, non-finite guard, one
jit) and of a transformers `Cohere2ForCausalLM` of the same shape trained with `torch.optim.AdamW`
(forward with labels, backward, clip, step); MFU of both against the best of several 2048² fp32
matmuls timed in this process. Model FLOPs per step = 6 · params · tokens (tied embeddings: the
LM head is counted once, the lookup is free) + attention: 12 · layers · hidden · keys per query
(fwd+bwd of QKᵀ and PV), keys = causal mean (T+1)/2 on full layers, min(window, ...) on sliding ones.
Goals (docs/benchmarks.md): ≥ 1.5× the torch step's tokens/s on `bench`, ≥ 40% MFU on `small`.

    python experiments/benchmarks/sft_step.py --sizes=bench --breakdown   # where the step's time goes

--breakdown adds, per size, a table of the step's parts timed alone on the same batch (median of
--steps after --warmup): forward + loss (ours: jitted `logprobs.token_cross_entropy`; torch: the model with labels
under no_grad), forward + backward (jitted `jax.value_and_grad`; `loss.backward()`), the full update
step (the rows above), and the vocabulary projection alone: a [B·T, hidden] × [vocab, hidden]ᵀ
matmul + mean token cross-entropy on random inputs, forward, and forward + backward (gradients of
both operands). Columns: seconds of each side, torch s / ours s (> 1: ours is faster), each part's
share of its side's full step, and achieved GFLOP/s of each side (model FLOPs: a third of the step's
for the forward, the step's for forward + backward; 2·B·T·hidden·vocab for the projection's
forward, 3× that with the backward).
"""

import argparse
import functools
import os
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax

from luckystar import model
from luckystar.model import sharding
from luckystar.engine import logprobs
from luckystar.engine import optim
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib

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


def _median_seconds(fn, steps: int, warmup: int) -> float:
  """Median wall time of fn() (which must block until its work is done) over `steps` after `warmup` calls."""
  for _ in range(warmup):
    fn()
  return float(np.median([_timed(fn) for _ in range(steps)]))


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


def compiled_update(config: model.ModelConfig, batch: dict[str, np.ndarray]):
  """(compiled SFT update, a fresh random state, the batch on the mesh, an rng) on a data-parallel mesh of
  every device: what the sft stage runs (`step.make_update_fn` on `logprobs.token_cross_entropy`). The
  update donates its state: call it as `state, metrics = compiled(state, batch, rng)`."""
  optimizer = optim.make(types.SimpleNamespace(**OPTIMIZER))
  mesh = sharding.make_mesh()
  state = state_lib.create(config, optimizer, mesh, seed=0)
  update = step_lib.make_update_fn(functools.partial(logprobs.token_cross_entropy, model_config=config), optimizer,
                                   step_lib.state_shardings_of(state), mesh=mesh)
  device_batch = update.put_batch(batch)
  compiled = update.lower(state, device_batch, state_lib.step_rng(state)).compile()
  rng = jax.device_put(jax.random.key(0), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  return compiled, state, device_batch, rng


def ours_step(config: model.ModelConfig, batch: dict[str, np.ndarray]):
  """One SFT update per call, blocking until its metrics are ready (the state carried between calls)."""
  compiled, state, device_batch, rng = compiled_update(config, batch)

  def run():
    nonlocal state
    state, metrics = compiled(state, device_batch, rng)
    jax.block_until_ready(metrics)

  return run


def alternate(runs: dict, steps: int, warmup: int) -> dict[str, list[float]]:
  """Seconds of each of `runs` (name → a blocking step), `warmup` calls each first, then one step of each in
  turn, `steps` times: a busy CPU slows every side alike."""
  for run in runs.values():
    for _ in range(warmup):
      run()
  times = {name: [] for name in runs}
  for _ in range(steps):
    for name, run in runs.items():
      times[name].append(_timed(run))
  return times


def torch_peer(config: model.ModelConfig):
  """A transformers Cohere2ForCausalLM of config's shape in train mode and its torch AdamW (seed 0)."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count())
  peer = hf_model(config)
  optimizer = torch.optim.AdamW(peer.parameters(), lr=OPTIMIZER['learning_rate'], betas=(0.9, 0.95),
                                weight_decay=OPTIMIZER['weight_decay'])
  return peer, optimizer


def hf_model(config: model.ModelConfig, params=None):
  """A transformers Cohere2ForCausalLM of config's shape (fp32, train mode), holding `params` (our tree,
  exported with `interop.hf.params_to_hf`) or, without them, transformers' own random init (seed 0)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from luckystar.interop import hf  # pylint: disable=g-import-not-at-top  # here: it imports AQT (gpu.py runs without)
  torch.manual_seed(0)
  hf_config = transformers.Cohere2Config(pad_token_id=0, bos_token_id=2, eos_token_id=3, **{
      k: v for k, v in hf.config_to_hf(config).items() if k not in ('model_type', 'architectures')})
  peer = transformers.Cohere2ForCausalLM(hf_config).train()
  if params is not None:
    tensors = {name: torch.from_numpy(np.array(value, np.float32)) for name, value in hf.params_to_hf(
        jax.device_get(params), config).items()}
    missing, unexpected = peer.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {'lm_head.weight'}, (missing, unexpected)  # tied to the embedding
  return peer


def word_tokenizer(vocab_size: int):
  """A transformers tokenizer whose word `t<i>` is token i (left padding, pad 0, eos 5): TRL's trainers then
  see exactly our token ids, written as text (`as_words`)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  words = tokenizers.Tokenizer(tokenizers.models.WordLevel({f't{i}': i for i in range(vocab_size)}, unk_token='t0'))
  words.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  return transformers.PreTrainedTokenizerFast(tokenizer_object=words, pad_token='t0', eos_token='t5',
                                              padding_side='left')


# What a TRL trainer's config takes so that its steps are comparable with ours: fp32 on the CPU, no gradient
# checkpointing, and no logging, saving, eval or progress bar inside the timed steps.
TRL_ARGS = dict(gradient_checkpointing=False, bf16=False, fp16=False, use_cpu=True, logging_strategy='no',
                save_strategy='no', eval_strategy='no', report_to='none', dataloader_num_workers=0,
                disable_tqdm=True, seed=0)


def timed_steps(between):
  """(a transformers TrainerCallback, the list it fills with the seconds of each trainer step); `between()`
  runs after each step, outside the timed window (the other sides' steps, alternating)."""
  import transformers  # pylint: disable=g-import-not-at-top
  seconds = []

  class Timer(transformers.TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
      self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
      seconds.append(time.perf_counter() - self.start)
      between()

  return Timer(), seconds


def as_words(ids) -> str:
  return ' '.join(f't{int(i)}' for i in ids)


def torch_step(config: model.ModelConfig, batch: dict[str, np.ndarray]):
  """One plain torch AdamW step of the transformers peer per call (forward with labels, backward, clip, step)."""
  import torch  # pylint: disable=g-import-not-at-top
  peer, optimizer = torch_peer(config)
  input_ids = torch.from_numpy(batch['tokens']).long()

  def run():
    loss = peer(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(peer.parameters(), OPTIMIZER['max_grad_norm'])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

  return run


# ---- --breakdown: the step's parts timed alone ------------------------------------------------------


def ours_part_seconds(config: model.ModelConfig, batch: dict[str, np.ndarray], steps: int, warmup: int
                      ) -> dict[str, float]:
  """Seconds of our forward + loss and forward + backward (the step's gradient, unsharded, no optimizer)."""
  params = model.init(config, jax.random.key(0))
  device_batch = jax.device_put({k: jnp.asarray(v) for k, v in batch.items()})
  loss = functools.partial(logprobs.token_cross_entropy, rng=None, model_config=config)
  forward = jax.jit(loss)
  forward_backward = jax.jit(jax.value_and_grad(loss, has_aux=True))
  return {'forward + loss': _median_seconds(lambda: jax.block_until_ready(forward(params, device_batch)),
                                            steps, warmup),
          'forward + backward': _median_seconds(
              lambda: jax.block_until_ready(forward_backward(params, device_batch)), steps, warmup)}


def torch_part_seconds(config: model.ModelConfig, batch: dict[str, np.ndarray], steps: int, warmup: int
                       ) -> dict[str, float]:
  """The same parts of the torch peer: forward with labels under no_grad, and forward + backward."""
  import torch  # pylint: disable=g-import-not-at-top
  peer, _ = torch_peer(config)
  input_ids = torch.from_numpy(batch['tokens']).long()

  def forward():
    with torch.no_grad():
      peer(input_ids=input_ids, labels=input_ids)

  def forward_backward():
    peer(input_ids=input_ids, labels=input_ids).loss.backward()
    peer.zero_grad(set_to_none=True)  # as the step does, so backward never accumulates

  return {'forward + loss': _median_seconds(forward, steps, warmup),
          'forward + backward': _median_seconds(forward_backward, steps, warmup)}


def vocab_projection_flops(config: model.ModelConfig, tokens: int) -> float:
  """Forward FLOPs of the LM head: [tokens, hidden] × [vocab, hidden]ᵀ."""
  return 2 * tokens * config.hidden_size * config.vocab_size


def ours_vocab_seconds(config: model.ModelConfig, tokens: int, steps: int, warmup: int) -> dict[str, float]:
  """Our LM head alone as the model computes it (fp32 accumulation, logit_scale) + optax's cross-entropy."""
  hidden_key, embedding_key = jax.random.split(jax.random.key(0))
  hidden = jax.random.normal(hidden_key, (tokens, config.hidden_size), config.dtype)          # [N, hidden]
  embedding = jax.random.normal(embedding_key, (config.vocab_size, config.hidden_size), config.param_dtype)
  targets = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, tokens), jnp.int32)  # [N]

  def loss(hidden, embedding):
    logits = jnp.einsum('te,ve->tv', hidden, embedding.astype(config.dtype), preferred_element_type=jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits * config.logit_scale, targets).mean()

  forward = jax.jit(loss)
  forward_backward = jax.jit(jax.grad(loss, argnums=(0, 1)))
  return {'vocab proj fwd': _median_seconds(lambda: forward(hidden, embedding).block_until_ready(), steps, warmup),
          'vocab proj fwd+bwd': _median_seconds(
              lambda: jax.block_until_ready(forward_backward(hidden, embedding)), steps, warmup)}


def torch_vocab_seconds(config: model.ModelConfig, tokens: int, steps: int, warmup: int) -> dict[str, float]:
  """The torch peer's LM head alone: matmul + F.cross_entropy, fp32."""
  import torch  # pylint: disable=g-import-not-at-top
  generator = torch.Generator().manual_seed(0)
  hidden = torch.randn(tokens, config.hidden_size, generator=generator, requires_grad=True)       # [N, hidden]
  embedding = torch.randn(config.vocab_size, config.hidden_size, generator=generator, requires_grad=True)
  targets = torch.randint(0, config.vocab_size, (tokens,), generator=generator)                   # [N]

  def loss():
    return torch.nn.functional.cross_entropy((hidden @ embedding.T) * config.logit_scale, targets)

  def forward():
    with torch.no_grad():
      loss()

  return {'vocab proj fwd': _median_seconds(forward, steps, warmup),
          'vocab proj fwd+bwd': _median_seconds(lambda: torch.autograd.grad(loss(), (hidden, embedding)),
                                                steps, warmup)}


def print_breakdown(config: model.ModelConfig, batch: dict[str, np.ndarray], full_step: dict[str, float],
                    steps: int, warmup: int):
  """The table of --breakdown for one size; full_step: seconds of each side's update step (timed above)."""
  tokens = batch['tokens'].size
  step_flops = train_flops_per_step(config, *batch['tokens'].shape)
  head_flops = vocab_projection_flops(config, tokens)
  flops = {'forward + loss': step_flops / 3, 'forward + backward': step_flops, 'full step': step_flops,
           'vocab proj fwd': head_flops, 'vocab proj fwd+bwd': 3 * head_flops}
  parts = {'ours': {**ours_part_seconds(config, batch, steps, warmup), 'full step': full_step['ours'],
                    **ours_vocab_seconds(config, tokens, steps, warmup)}}
  if 'torch' in full_step:
    parts['torch'] = {**torch_part_seconds(config, batch, steps, warmup), 'full step': full_step['torch'],
                      **torch_vocab_seconds(config, tokens, steps, warmup)}
  print(f'\n  breakdown, {batch["tokens"].shape[0]} × {batch["tokens"].shape[1]} tokens (median of {steps}); '
        'speedup = torch s / ours s; share = part s / that side\'s full step s')
  print(f'  {"part":<19} {"ours s":>8} {"torch s":>8} {"speedup":>8} {"ours share":>10} {"torch share":>11} '
        f'{"ours GFLOP/s":>12} {"torch GFLOP/s":>13}')
  for part, part_flops in flops.items():
    cells = {impl: (seconds[part], seconds[part] / seconds['full step'], part_flops / seconds[part] / 1e9)
             for impl, seconds in parts.items()}
    ours_s, ours_share, ours_rate = cells['ours']
    if 'torch' in cells:
      torch_s, torch_share, torch_rate = cells['torch']
      torch_cells = f'{torch_s:>8.4f} {torch_s / ours_s:>7.2f}× {ours_share:>10.1%} {torch_share:>11.1%}'
      rates = f'{ours_rate:>12.1f} {torch_rate:>13.1f}'
    else:
      torch_cells = f'{"-":>8} {"-":>8} {ours_share:>10.1%} {"-":>11}'
      rates = f'{ours_rate:>12.1f} {"-":>13}'
    print(f'  {part:<19} {ours_s:>8.4f} {torch_cells} {rates}')


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sizes', default='bench,small')
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--seq_len', type=int, default=256)
  parser.add_argument('--steps', type=int, default=5, help='timed steps of each side, alternating (medians)')
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--no_torch', action='store_true', help='skip the torch peer')
  parser.add_argument('--breakdown', action='store_true',
                      help="also time the step's parts alone (forward, backward, vocab projection); see the docstring")
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
    runs = {'ours': ours_step(config, batch)}
    if not args.no_torch:
      runs['torch'] = torch_step(config, batch)
    times = alternate(runs, args.steps, args.warmup)
    results = {impl: float(np.median(seconds)) for impl, seconds in times.items()}
    for impl, seconds in results.items():
      print(f'{size:<7} {model.param_count(config) / 1e6:>7.2f}M {impl:<7} {seconds:>8.3f} {tokens / seconds:>10.0f} '
            f'{flops / seconds / peak:>6.1%}')
    if 'torch' in results:
      print(f'{size:<7} ours / torch tokens/s: {results["torch"] / results["ours"]:.2f}×')
    if args.breakdown:
      print_breakdown(config, batch, results, args.steps, args.warmup)
      print()
  print('\nGoals: ≥ 1.5× torch on bench; ≥ 40% MFU on small (docs/benchmarks.md). '
        'A shared CPU lowers every figure.')


if __name__ == '__main__':
  main()
