"""A Command R7B-shaped slice on one GPU beside transformers + torch on the same card, in one call (issue 41).

    PYTHONPATH=. python experiments/benchmarks/gpu.py               # one H100/H200, about 7 minutes
    PYTHONPATH=. python experiments/benchmarks/gpu.py --layers=2    # a smaller slice
    PYTHONPATH=. JAX_PLATFORMS=cpu python experiments/benchmarks/gpu.py --smoke   # tiny shapes, any machine

Needs no install from the repository root: it imports only jax, flax, optax, torch, transformers and
`luckystar.model`, `luckystar.sampling`, `luckystar.engine.{state,step,logprobs,optim}` (none of which pull
in grain, AQT, ml_collections, math-verify or faker; tests/test_layers.py checks that).

The slice: `command_r7b`'s hidden 4,096, 32 heads over 8 KV heads (head_dim 128), MLP 14,336, vocab 256,000,
window 4,096, logit scale 0.25, its first --layers layers (default 4: one period, 3 sliding + 1 full),
random weights, bf16 params and activations on both sides. transformers' model is built from a
`Cohere2Config` of the same fields (not `interop.hf.config_to_hf`, which imports AQT), `attn_implementation`
'sdpa', eager (no torch.compile) except where a row says so. Sections, in order, each skipped once the
--budget_s (default 420 s) would be overrun, each timing a warm-up and then --repeats runs (median, min–max):

1. bf16 matmul, --matmul³ (8192³), jitted in JAX and `a @ b` in torch: the card's peak for MFU is the best
   run of either.
2. SFT step, --batch × --seq_len tokens (2 × 4,096): ours is `step.make_update_fn` on
   `logprobs.token_cross_entropy` (what the sft stage and `aot_plan` compile; AdamW with clipping and the
   non-finite guard, attention 'auto' = cuDNN on GPU), built by `sft_step.compiled_update`. The peer is
   transformers' `Cohere2ForCausalLM(labels=...)`, backward, `clip_grad_norm_`, torch AdamW (fused on
   CUDA). Model FLOPs per step (`sft_step.train_flops_per_step`): 6 · params · tokens (the tied LM head
   counted once, the embedding lookup free) + 12 · hidden · keys · tokens for attention's forward and
   backward, keys = mean keys a query attends to summed over layers (causal: (T+1)/2; sliding: capped by
   the window). MFU = those FLOPs / step seconds / peak. XLA's own count (`cost_analysis`, which leaves out custom calls
   such as cuDNN's attention) is printed beside.
3. Attention forward + backward (a vjp with a random cotangent, gradients of q, k, v) at --attention_lengths
   (8k, 32k) tokens, one row, the slice's 32 query / 8 KV heads, head_dim 128, bf16, for a full (causal)
   and a sliding (window 4,096) layer: `model.attention.attend` with impl cudnn, blockwise and xla (xla
   skipped where its [T, T] fp32 scores, probabilities and their gradients, ≈ 12 · heads · T² bytes,
   exceed half the device's memory), beside torch `scaled_dot_product_attention`: the flash kernel with
   is_causal for the full layer; for the sliding one a [T, T] boolean mask on the memory-efficient kernel
   with KV heads repeated, as transformers runs its sliding layers under sdpa (SDPA's flash kernel takes no
   window). FLOPs: 12 · heads · head_dim · T · keys (QKᵀ and PV forward, twice that backward, nothing
   for recomputation), keys as above for that one layer.
4. Greedy sampling, --sample_batch prompts (64) of --prompt_tokens (128) random tokens, --new_tokens (256)
   new tokens each, no early stop: `sampling.sample` greedy (jitted prefill + while_loop decode)
   beside `generate(do_sample=False, min_new_tokens=max_new_tokens)` with its default dynamic cache, then
   with cache_implementation='static' (which transformers compiles with torch.compile on CUDA by itself;
   its compile is in the warm-up). tokens/s = batch · new tokens / seconds, prefill included. The weights
   differ between the sides (both random); the work does not depend on them without early stops.

Each result prints as it is measured; a markdown table of all of them (with the device and versions) ends
the output, for docs/benchmarks.md verbatim. torch goes first in each section and empties its cache after,
and JAX does not preallocate, so the two share the card.
"""

import os
import time

STARTED = time.perf_counter()  # the budget counts the imports too
# Both frameworks share one card: JAX takes memory as it needs it instead of 75% up front.
os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')

import argparse  # pylint: disable=g-import-not-at-top,wrong-import-position
import contextlib
import dataclasses
import gc
import statistics
import sys
import traceback
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from luckystar import model
from luckystar import sampling
from luckystar.model import attention

import sft_step  # this file's directory: the SFT step, its FLOPs and batch, as the CPU benchmark builds them

# A guess at each item's worst cost on one H100, compile and warm-up included: an item starts only if it still
# fits in --budget_s, so the whole call stays within the 8 minutes a lent GPU gives it.
COST_S = {'matmul': 20, 'torch sft': 60, 'ours sft': 120, 'attention': 20, 'generate': 45, 'ours sample': 60,
          'static generate': 120}

SMOKE_SHAPES = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2,
                    sliding_window=128)


@dataclasses.dataclass
class Row:
  """One timed thing: `seconds` of each repeat (empty when not run: `note` says why)."""
  section: str
  shape: str
  impl: str
  work: float = 0.0              # per run: FLOPs (unit TFLOP/s) or tokens (unit tok/s)
  unit: str = 'TFLOP/s'
  seconds: list[float] = dataclasses.field(default_factory=list)
  model_flops: float = 0.0       # per run, for MFU (the SFT step)
  note: str = ''
  peer: 'Row | None' = None      # ours is compared with this row

  @property
  def rate(self) -> float | None:
    if not self.seconds:
      return None
    return self.work / statistics.median(self.seconds) / (1e12 if self.unit == 'TFLOP/s' else 1)


class Budget:
  """Wall seconds since the script started; an item runs only if its rough cost still fits."""

  def __init__(self, seconds: float):
    self.seconds, self.start = seconds, STARTED

  def elapsed(self) -> float:
    return time.perf_counter() - self.start

  def allows(self, needed: float) -> bool:
    return self.elapsed() + needed <= self.seconds


def format_seconds(seconds: list[float]) -> str:
  scale, unit = (1e3, 'ms') if statistics.median(seconds) < 1 else (1, 's')
  return (f'{statistics.median(seconds) * scale:.2f} {unit} '
          f'({min(seconds) * scale:.2f}–{max(seconds) * scale:.2f})')


def format_rate(row: Row) -> str:
  rate = row.rate
  if rate is None:
    return '–'
  return f'{rate:.4g} {row.unit}' if row.unit == 'TFLOP/s' else f'{rate:,.0f} {row.unit}'


class Bench:
  """The rows so far, the budget, and how each item runs: warm-up, repeats, failures kept as notes."""

  def __init__(self, args):
    self.args, self.rows, self.peak = args, [], None
    self.budget = Budget(args.budget_s)
    self.cuda = torch.cuda.is_available()
    self.torch_device = torch.device('cuda' if self.cuda else 'cpu')

  def sync(self):
    if self.cuda:
      torch.cuda.synchronize()

  def free_torch(self):
    gc.collect()
    if self.cuda:
      torch.cuda.empty_cache()

  def measure(self, row: Row, needed_s: float, prepare: Callable[[], Callable[[], None]]) -> Row:
    """`prepare()` builds the thing and returns a `run()` that blocks until its work is done; run() once to
    warm up (compile), then --repeats times timed."""
    self.rows.append(row)
    if not self.budget.allows(needed_s):
      row.note = f'skipped: {self.budget.elapsed():.0f} s of the {self.budget.seconds:.0f} s budget used'
    else:
      try:
        run = prepare()
        run()
        for _ in range(self.args.repeats):
          start = time.perf_counter()
          run()
          row.seconds.append(time.perf_counter() - start)
      except Exception as e:  # pylint: disable=broad-except  # one failed row must not cost the others
        traceback.print_exc(limit=3)
        row.seconds, row.note = [], f'failed: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ""}'
      finally:
        run = None
        self.free_torch()
    timing = format_seconds(row.seconds) if row.seconds else row.note
    print(f'[{self.budget.elapsed():5.0f} s] {row.section} | {row.shape} | {row.impl}: {timing}, {format_rate(row)}'
          + (f'; {row.note}' if row.seconds and row.note else ''), flush=True)
    return row

  def table(self) -> str:
    lines = ['| section | shape | implementation | time, median (min–max) | rate | MFU | vs peer |',
             '|---|---|---|---|---|---|---|']
    for row in self.rows:
      timing = format_seconds(row.seconds) if row.seconds else row.note
      mfu = (f'{row.model_flops / statistics.median(row.seconds) / self.peak:.1%}'
             if row.model_flops and row.seconds and self.peak else '')
      versus = (f'{row.rate / row.peer.rate:.2f}×' if row.peer and row.rate and row.peer.rate else '')
      note = f' ({row.note})' if row.seconds and row.note else ''
      lines.append(f'| {row.section} | {row.shape} | {row.impl}{note} | {timing} | {format_rate(row)} | {mfu} | '
                   f'{versus} |')
    return '\n'.join(lines)


# ---- the slice and its transformers twin ------------------------------------------------------------------


def slice_config(layers: int, smoke: bool) -> model.ModelConfig:
  """command_r7b's first `layers` layers in bf16 (smoke: the same layout at toy widths)."""
  return model.get('command_r7b', num_layers=layers, layer_types=model.pattern_layer_types(layers),
                   param_dtype='bfloat16', dtype='bfloat16', **(SMOKE_SHAPES if smoke else {}))


def hf_model(config: model.ModelConfig, device: torch.device) -> transformers.Cohere2ForCausalLM:
  """A random bf16 transformers Cohere2ForCausalLM of config's shape, built on `device` (seed 0)."""
  hf_config = transformers.Cohere2Config(
      vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
      num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
      num_key_value_heads=config.num_kv_heads, layer_types=list(config.layer_types),
      sliding_window=config.sliding_window, layer_norm_eps=config.layer_norm_eps, logit_scale=config.logit_scale,
      max_position_embeddings=config.max_position_embeddings, tie_word_embeddings=True,
      rope_parameters={'rope_type': 'default', 'rope_theta': config.rope_theta},
      attn_implementation='sdpa', pad_token_id=0, bos_token_id=2, eos_token_id=3)
  torch.manual_seed(0)
  default_dtype = torch.get_default_dtype()
  torch.set_default_dtype(torch.bfloat16)  # built in bf16 on the card: no fp32 copy on the host first
  try:
    with torch.device(device):
      return transformers.Cohere2ForCausalLM(hf_config)
  finally:
    torch.set_default_dtype(default_dtype)


# ---- 1. matmul peak ---------------------------------------------------------------------------------------


def matmul_section(bench: Bench):
  size = bench.args.matmul
  shape, flops = f'{size}³ bf16', 2 * size**3

  def torch_matmul():
    a, b = (torch.randn(size, size, dtype=torch.bfloat16, device=bench.torch_device) for _ in range(2))
    return lambda: (a @ b, bench.sync())

  def jax_matmul():
    a, b = (jax.random.normal(jax.random.key(i), (size, size), jnp.bfloat16) for i in range(2))
    matmul = jax.jit(jnp.matmul)
    return lambda: matmul(a, b).block_until_ready()

  theirs = bench.measure(Row('matmul', shape, 'torch', flops), COST_S['matmul'], torch_matmul)
  ours = bench.measure(Row('matmul', shape, 'jax', flops, peer=theirs), COST_S['matmul'], jax_matmul)
  best = [flops / min(r.seconds) for r in (ours, theirs) if r.seconds]
  bench.peak = max(best) if best else None
  if bench.peak:
    print(f'peak for MFU: {bench.peak / 1e12:.1f} TFLOP/s (best run of either)', flush=True)


# ---- 2. SFT step ------------------------------------------------------------------------------------------


def sft_section(bench: Bench, config: model.ModelConfig):
  args = bench.args
  batch = sft_step.synthetic_batch(config, args.batch, args.seq_len)
  tokens = batch['tokens'].size
  flops = sft_step.train_flops_per_step(config, args.batch, args.seq_len)
  shape = f'{config.num_layers} layers, {args.batch} × {args.seq_len:,} tokens'

  def torch_step():
    peer = hf_model(config, bench.torch_device).train()
    optimizer = torch.optim.AdamW(peer.parameters(), lr=sft_step.OPTIMIZER['learning_rate'],
                                  betas=(sft_step.OPTIMIZER['b1'], sft_step.OPTIMIZER['b2']),
                                  weight_decay=sft_step.OPTIMIZER['weight_decay'], fused=bench.cuda or None)
    input_ids = torch.from_numpy(batch['tokens']).long().to(bench.torch_device)
    if bench.cuda:
      torch.cuda.reset_peak_memory_stats()

    def step():
      peer(input_ids=input_ids, labels=input_ids).loss.backward()
      torch.nn.utils.clip_grad_norm_(peer.parameters(), sft_step.OPTIMIZER['max_grad_norm'])
      optimizer.step()
      optimizer.zero_grad(set_to_none=True)
      bench.sync()
    return step

  def ours_step():
    start = time.perf_counter()
    compiled, state, device_batch, rng = sft_step.compiled_update(config, batch)
    costs = compiled.cost_analysis()
    costs = costs[0] if isinstance(costs, (list, tuple)) else costs
    xla_flops = (costs or {}).get('flops')
    print(f'  SFT step compiled in {time.perf_counter() - start:.0f} s; XLA counts '
          + (f'{xla_flops / 1e12:.2f}' if xla_flops else '?') + f' TFLOP, the formula {flops / 1e12:.2f}', flush=True)
    holder = [state]  # the update donates its state

    def step():
      holder[0], metrics = compiled(holder[0], device_batch, rng)
      jax.block_until_ready(metrics)
    return step

  theirs = bench.measure(Row('SFT step', shape, 'transformers + torch AdamW', tokens, 'tok/s', model_flops=flops),
                         COST_S['torch sft'], torch_step)
  if bench.cuda and theirs.seconds:
    theirs.note = f'peak {torch.cuda.max_memory_allocated() / 1e9:.0f} GB'
  ours = bench.measure(Row('SFT step', shape, 'luckystar make_update_fn', tokens, 'tok/s', model_flops=flops,
                           peer=theirs), COST_S['ours sft'], ours_step)
  stats = jax.devices()[0].memory_stats() or {}
  if ours.seconds and 'peak_bytes_in_use' in stats:
    ours.note = f'peak {stats["peak_bytes_in_use"] / 1e9:.0f} GB'


# ---- 3. attention -----------------------------------------------------------------------------------------


def device_memory_bytes() -> float:
  """What the first JAX device may allocate (host RAM on CPU)."""
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get('bytes_limit') or os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def attention_section(bench: Bench, config: model.ModelConfig):
  heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
  groups = heads // kv_heads
  for length in map(int, bench.args.attention_lengths.split(',')):
    for kind in (model.FULL, model.SLIDING):
      window = config.sliding_window if kind == model.SLIDING else None
      layer = config.replace(num_layers=1, layer_types=(kind,))
      flops = 12 * heads * head_dim * length * sft_step.attended_keys(layer, length)
      shape = (f'T={length:,}, ' + (f'sliding {window:,}' if window else 'full causal') +
               f', {heads}/{kv_heads} heads × {head_dim}')
      theirs = Row('attention fwd+bwd', shape, 'torch sdpa', flops)
      bench.measure(theirs, COST_S['attention'],
                    lambda: torch_attention(bench, theirs, length, heads, kv_heads, head_dim, window))
      for impl in ('cudnn', 'blockwise', 'xla'):
        resolved = attention.resolve(impl, jax.default_backend())
        row = Row('attention fwd+bwd', shape, impl if resolved == impl else f'{impl} (ran {resolved})', flops,
                  peer=theirs)
        score_bytes = 12 * heads * length**2
        if impl == 'xla' and score_bytes > device_memory_bytes() / 2:
          row.note = f'skipped: scores ≈ {score_bytes / 1e9:.0f} GB'
          bench.rows.append(row)
          print(f'{row.section} | {shape} | {impl}: {row.note}', flush=True)
          continue
        bench.measure(row, COST_S['attention'],
                      lambda impl=impl: jax_attention(length, kv_heads, groups, head_dim, window, impl))


def jax_attention(length, kv_heads, groups, head_dim, window, impl):
  keys = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(keys[0], (1, length, kv_heads, groups, head_dim), jnp.bfloat16)
  k, v = (jax.random.normal(key, (1, length, kv_heads, head_dim), jnp.bfloat16) for key in keys[1:3])
  d_out = jax.random.normal(keys[3], q.shape, jnp.bfloat16)
  segments = jnp.ones((1, length), jnp.int32)

  @jax.jit
  def forward_backward(q, k, v, d_out):
    _, vjp = jax.vjp(lambda q, k, v: attention.attend(q, k, v, segments, window=window, impl=impl,
                                                      dtype=jnp.bfloat16), q, k, v)
    return vjp(d_out)

  return lambda: jax.block_until_ready(forward_backward(q, k, v, d_out))


def torch_attention(bench, row, length, heads, kv_heads, head_dim, window):
  """SDPA as transformers calls it: flash + is_causal for a full layer, a boolean [T, T] band mask on the
  memory-efficient kernel (KV heads repeated) for a sliding one; whichever kernel the build offers when
  that one is missing (CPU). The row's impl names the kernel."""
  from torch.nn.attention import SDPBackend, sdpa_kernel  # pylint: disable=g-import-not-at-top
  device = bench.torch_device
  generator = torch.Generator(device).manual_seed(0)
  q = torch.randn(1, heads, length, head_dim, dtype=torch.bfloat16, device=device, generator=generator)
  k, v = (torch.randn(1, kv_heads, length, head_dim, dtype=torch.bfloat16, device=device, generator=generator)
          for _ in range(2))
  d_out = torch.randn_like(q)
  if window is None:
    mask, backend, gqa = None, SDPBackend.FLASH_ATTENTION, True
  else:
    positions = torch.arange(length, device=device)
    offset = positions[:, None] - positions[None, :]
    mask, backend, gqa = (offset >= 0) & (offset < window), SDPBackend.EFFICIENT_ATTENTION, False
    k, v = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (k, v))
  q, k, v = (x.requires_grad_() for x in (q, k, v))

  def forward_backward():
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                           enable_gqa=gqa)
    torch.autograd.grad(out, (q, k, v), d_out)

  def run():
    with sdpa_kernel(backend) if backend else contextlib.nullcontext():
      forward_backward()
    bench.sync()

  row.impl = f'torch sdpa ({"flash" if window is None else "mem-efficient, [T, T] mask"})'
  try:
    run()
  except RuntimeError:   # that kernel is not in this build (CPU): SDPA chooses
    backend, row.impl = None, 'torch sdpa (its choice of kernel)'
    run()
  return run


# ---- 4. greedy sampling -----------------------------------------------------------------------------------


def sampling_section(bench: Bench, config: model.ModelConfig):
  args = bench.args
  prompts = np.random.default_rng(0).integers(16, config.vocab_size, (args.sample_batch, args.prompt_tokens))
  generated = args.sample_batch * args.new_tokens
  shape = f'batch {args.sample_batch}, {args.prompt_tokens} + {args.new_tokens} tokens'

  def hf_generate(cache):
    hf = hf_model(config, bench.torch_device).eval()
    input_ids = torch.from_numpy(prompts).long().to(bench.torch_device)
    extra = {} if cache == 'dynamic' else {'cache_implementation': cache}

    def run():
      with torch.inference_mode():
        hf.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                    max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=0, **extra)
      bench.sync()
    return run

  def ours_sample():
    params = model.init(config, jax.random.key(0))
    prompt_lists = prompts.tolist()

    def run():
      out = sampling.sample(config, params, prompt_lists, rng=jax.random.key(0), max_new_tokens=args.new_tokens,
                            settings=sampling.SamplingSettings(temperature=0.0))
      jax.block_until_ready(out.tokens)
    return run

  dynamic = bench.measure(Row('greedy sampling', shape, 'transformers generate, dynamic cache', generated,
                              'tok/s'), COST_S['generate'], lambda: hf_generate('dynamic'))
  bench.measure(Row('greedy sampling', shape, 'luckystar sampling.sample', generated, 'tok/s', peer=dynamic),
                COST_S['ours sample'], ours_sample)
  if not args.smoke:  # on a CPU it runs the dynamic row's code again, uncompiled, for 10 s of a smoke run
    bench.measure(Row('greedy sampling', shape, 'transformers generate, static cache' +
                      (' (torch.compile)' if bench.cuda else ''), generated, 'tok/s'),
                  COST_S['static generate'], lambda: hf_generate('static'))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--layers', type=int, default=4,
                      help="command_r7b's first layers (4: 3 sliding + 1 full; fewer: sliding only)")
  parser.add_argument('--batch', type=int, default=2, help='SFT rows')
  parser.add_argument('--seq_len', type=int, default=4096, help='SFT tokens per row')
  parser.add_argument('--attention_lengths', default='8192,32768')
  parser.add_argument('--sample_batch', type=int, default=64)
  parser.add_argument('--prompt_tokens', type=int, default=128)
  parser.add_argument('--new_tokens', type=int, default=256)
  parser.add_argument('--matmul', type=int, default=8192, help='side of the square bf16 matmul for the peak')
  parser.add_argument('--repeats', type=int, default=3, help='timed runs after the warm-up')
  parser.add_argument('--budget_s', type=float, default=420, help='sections that would overrun it are skipped')
  parser.add_argument('--smoke', action='store_true', help='toy widths and lengths: checks the script runs '
                      '(any machine, CPU included, well under a minute); its figures mean nothing')
  args = parser.parse_args(argv)
  if args.smoke:
    args.batch, args.seq_len, args.attention_lengths = 2, 64, '256'
    args.sample_batch, args.prompt_tokens, args.new_tokens, args.matmul = 4, 8, 8, 256
  if args.repeats < 3:
    parser.error('--repeats must be at least 3')
  if not args.smoke and jax.default_backend() == 'cpu':
    parser.error('no GPU: the full slice would take hours on a CPU; --smoke checks the script runs')

  bench = Bench(args)
  config = slice_config(args.layers, args.smoke)
  device = jax.devices()[0]
  torch_name = torch.cuda.get_device_name() if bench.cuda else 'cpu'
  header = (f'JAX {jax.__version__} on {device.device_kind} ({device.platform}); torch {torch.__version__} on '
            f'{torch_name}; transformers {transformers.__version__}; Python {sys.version.split()[0]}')
  print(header)
  print(f'slice: command_r7b, {config.num_layers} layers ({", ".join(t.split("_")[0] for t in config.layer_types)}), '
        f'{model.param_count(config) / 1e9:.2f}B params, bf16' + (' (smoke widths)' if args.smoke else ''), flush=True)

  matmul_section(bench)
  sft_section(bench, config)
  attention_section(bench, config)
  sampling_section(bench, config)

  print(f'\n{header}; {bench.budget.elapsed():.0f} s in all.')
  print(f'command_r7b slice: {config.num_layers} layers, {model.param_count(config) / 1e9:.2f}B params, bf16 '
        f'(params, activations, AdamW moments); MFU against {bench.peak / 1e12:.1f} TFLOP/s, the best bf16 '
        f'{args.matmul}³ matmul of either framework in this run; "vs peer": ours / the row it is compared with.'
        if bench.peak else 'no matmul peak measured: no MFU.')
  print()
  print(bench.table())


if __name__ == '__main__':
  main()
