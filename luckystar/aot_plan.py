"""Ahead-of-time memory plan of the training steps and the rollout on a large mesh, before any device is touched.

    python -m luckystar.aot_plan                      # command_a_111b on 256 fake CPU devices
    python -m luckystar.aot_plan --layouts=1x256x1 --remat=full --steps=sft
    python -m luckystar.aot_plan --layouts=1x32x8 --steps=rollout

Lowers and compiles the SFT train step and the RLOO update (`step.make_update_fn` on `logprobs.token_cross_entropy`
and `rlvr.loss_fn`, exactly what the stages run) for abstract inputs: the train state is
`state.abstract` (ShapeDtypeStructs with the default sharding rules' NamedShardings) and the batch
ShapeDtypeStructs sharded over ('data', 'fsdp'); nothing is allocated. Then prints XLA's per-device
`memory_analysis()` (arguments + outputs − aliased + temporaries + code) next to the HBM of a TPU v5p
(95 GB) and an H100 (80 GB).

The mesh is made of fake CPU devices (`--xla_force_host_platform_device_count`, set here when run
as a script), so the figures are XLA:CPU's buffer assignment of the per-device SPMD program: the
same shardings and shapes as on TPU/GPU, but not their fusion, layouts or collective buffers;
read them as a plan, not a measurement. The SFT batch is scored at every position (no
`score_columns`: the most a batch can need); the RLOO batch is one row per rollout with full-vocabulary
log-probs at every position, as `rlvr.loss_fn` computes them.

`--steps=rollout` compiles the programs `sampling.rollout` runs for a step of rollouts (`rollout_plans`):
`init_state` (the empty KV cache), `admit_in_place` (a prompt prefilled into every slot) and
`decode_round` (the whole decode loop), the public entry points of `sampling.programs`, with
`sampling.CachedDecoder`; the cache is `model.init_cache` of
prompt + new tokens, sharded by `model.cache_shardings` (rows over data × fsdp, KV heads over tensor).
The params and KV cache columns are per-device sizes computed from shapes and shardings, a check on XLA's
arguments.
"""

import os
import sys

if __name__ == '__main__':  # fake devices for the mesh; XLA reads the flag when jax first starts
  _DEVICES = next((int(a.split('=')[1]) for a in sys.argv if a.startswith('--devices=')), 256)
  if '--xla_force_host_platform_device_count' not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                               f' --xla_force_host_platform_device_count={_DEVICES}').strip()
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import argparse
import dataclasses
import functools
import itertools
import math
import resource
import time
from typing import Any

import jax
import jax.numpy as jnp

from luckystar import config as config_lib
from luckystar import model
from luckystar import sampling
from luckystar.engine import logprobs, optim
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib
from luckystar.model import sharding
from luckystar.stages import rlvr

HBM_BYTES = {'v5p': 95 * 10**9, 'H100': 80 * 10**9}
STEPS = ('sft', 'rlvr', 'rollout')


@dataclasses.dataclass(frozen=True)
class Plan:
  step: str              # 'sft', 'rlvr' or 'rollout/{init,admit,decode}'
  layout: tuple[int, int, int]   # (data, fsdp, tensor)
  remat: str             # 'policy/scope' ('-' when decoding: no gradients)
  batch: int             # global rows
  seq_len: int           # tokens per row (rollout: the cache's columns)
  grad_accum_steps: int
  params_bytes: int      # per device, from the params' shapes and shardings
  cache_bytes: int       # per device, the KV cache's likewise (0: none)
  argument_bytes: int    # per device: state + batch, or params + cache + sampler inputs
  output_bytes: int
  alias_bytes: int       # outputs written in place of donated arguments (the state, the cache)
  temp_bytes: int        # activations, gradients, optimizer temporaries
  code_bytes: int
  compile_s: float

  @property
  def device_bytes(self) -> int:
    return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes

  def fits(self, hbm: str) -> bool:
    return self.device_bytes <= HBM_BYTES[hbm]


def parse_layout(text: str) -> tuple[int, int, int]:
  """'1x32x8' → (data, fsdp, tensor)."""
  try:
    data, fsdp, tensor = (int(n) for n in text.lower().split('x'))
  except ValueError:
    raise ValueError(f'--layouts entry {text!r}: expected DATAxFSDPxTENSOR, e.g. 1x32x8') from None
  return data, fsdp, tensor


def batch_structs(step: str, batch: int, seq_len: int, mesh: jax.sharding.Mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """The update's batch as the stages build it (`logprobs.token_cross_entropy`, `rlvr.training_batch`), rows over data × fsdp."""
  rows = step_lib.batch_sharding(mesh)
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rows)
  fields = {name: spec((batch, seq_len), jnp.int32) for name in ('tokens', 'positions', 'segment_ids', 'loss_mask')}
  if step == 'rlvr':
    fields |= {'old_logprobs': spec((batch, seq_len), jnp.float32), 'advantages': spec((batch,), jnp.float32),
               'used': spec((batch,), jnp.int32)}
  return fields


def sharded_bytes(tree: Any) -> int:
  """Bytes one device holds of a pytree of ShapeDtypeStructs with shardings (a replicated leaf counts whole)."""
  return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))


def with_shardings(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s), tree, shardings)


def measure(step: str, jitted: Any, *args, static: dict[str, Any] | None = None, **fields) -> tuple[Plan, Any]:
  """Lowers and compiles `jitted` for abstract `args` (and `static` keyword arguments) and reads XLA's
  per-device memory → (Plan of `step` with `fields`, the compiled program)."""
  start = time.perf_counter()
  compiled = jitted.lower(*args, **(static or {})).compile()
  stats = compiled.memory_analysis()
  return Plan(step=step, argument_bytes=stats.argument_size_in_bytes, output_bytes=stats.output_size_in_bytes,
              alias_bytes=stats.alias_size_in_bytes, temp_bytes=stats.temp_size_in_bytes,
              code_bytes=stats.generated_code_size_in_bytes, compile_s=time.perf_counter() - start, **fields), compiled


def abstract_state(model_config: model.ModelConfig, mesh: jax.sharding.Mesh) -> tuple[Any, Any, state_lib.TrainState]:
  """(config, optimizer, `state.abstract`) with the shared optimizer settings (AdamW, moments in the param dtype)."""
  config = config_lib.base('sft')
  optimizer = optim.make(config)
  return config, optimizer, state_lib.abstract(model_config, optimizer, mesh)


def replicated_key(mesh: jax.sharding.Mesh) -> jax.ShapeDtypeStruct:
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)


def plan(step: str, model_config: model.ModelConfig, layout: tuple[int, int, int], *, batch: int, seq_len: int,
         grad_accum_steps: int = 1) -> Plan:
  """Compiles one step for `layout` and reads its per-device memory; nothing is allocated."""
  mesh = sharding.make_mesh(layout)
  config, optimizer, state = abstract_state(model_config, mesh)
  if step == 'sft':
    loss, denominator = functools.partial(logprobs.token_cross_entropy, model_config=model_config), 'tokens'
  else:
    loss, denominator = functools.partial(rlvr.loss_fn, model_config=model_config), 'tokens'
  update_fn = step_lib.make_update_fn(loss, optimizer, jax.tree.map(lambda s: s.sharding, state), mesh=mesh,
                                      learning_rate=optim.learning_rate_schedule(config),
                                      grad_accum_steps=grad_accum_steps, denominator=denominator)
  return measure(step, update_fn, state, batch_structs(step, batch, seq_len, mesh), replicated_key(mesh),
                 layout=layout, remat=f'{model_config.remat_policy}/{model_config.remat_scope}', batch=batch,
                 seq_len=seq_len, grad_accum_steps=grad_accum_steps, params_bytes=sharded_bytes(state.params),
                 cache_bytes=0)[0]


def rollout_plans(model_config: model.ModelConfig, layout: tuple[int, int, int], *, rows: int, prompt_len: int,
                  max_new_tokens: int) -> list[Plan]:
  """Compiles the programs `sampling.rollout` runs for `rows` slots (prompts × samples) and reads their
  per-device memory; nothing is allocated.

  init: `sampling.init_state`, the empty cache (laid out by `model.init_cache`'s constraints).
  admit: the prefill of a prompt of `prompt_len` tokens in every slot: `sampling.admit_in_place`, which
  `rollout` runs when the rows are split over devices; its cache is in `model.cache_shardings`' layout.
  decode: `sampling.decode_round`, the decode loop of `max_new_tokens` (the multiple of 64 `rollout` rounds
  to), taking what admit returns (its logits and cache, with the shardings XLA gave them). The host loop's numpy inputs
  are ShapeDtypeStructs without sharding, as jit sees numpy arrays.
  """
  mesh = sharding.make_mesh(layout)
  decoder = sampling.CachedDecoder(model_config)
  params = abstract_state(model_config, mesh)[2].params
  cache_len = prompt_len + max_new_tokens
  cache = with_shardings(jax.eval_shape(lambda: decoder.init(rows, cache_len)),
                         model.cache_shardings(model_config, mesh))
  host = lambda *shape, dtype=jnp.int32: jax.ShapeDtypeStruct(shape, dtype)
  fields = dict(layout=layout, remat='-', batch=rows, seq_len=cache_len, grad_accum_steps=1,
                params_bytes=sharded_bytes(params), cache_bytes=sharded_bytes(cache))
  with sharding.activate(mesh):   # as `rollout` runs under the stage's mesh: the model's constraints bind to it
    init, _ = measure('rollout/init', sampling.init_state,
                      static=dict(decoder=decoder, batch=rows, max_length=cache_len), **fields)
    admit, compiled = measure('rollout/admit', sampling.admit_in_place, decoder, params, cache,
                              host(rows, prompt_len), host(rows), host(rows, dtype=bool), **fields)
    logits, admitted = compiled.out_info
    start = sampling.DecodeStart(logits=logits, last=host(rows), continuing=host(rows, dtype=bool))
    decode_rows = sampling.DecodeRows(budgets=host(rows), row_ids=host(rows), offsets=host(rows))
    decode, _ = measure('rollout/decode', sampling.decode_round, decoder, params, admitted, start, decode_rows,
                        sampling.stop_array(()), replicated_key(mesh), host(),
                        static=dict(max_new_tokens=max_new_tokens, settings=sampling.SamplingSettings()), **fields)
  return [init, admit, decode]


def table(plans: list[Plan]) -> str:
  """A markdown table, one row per compiled program."""
  gb = lambda n: f'{n / 1e9:.1f}' if n else '-'
  lines = ['| step | data×fsdp×tensor | remat | batch × seq (micro-batches) | params GB | KV cache GB | '
           'arguments GB | outputs GB | aliased GB | temporaries GB | per device GB | v5p 95 GB | H100 80 GB | '
           'compile s |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
  for p in plans:
    lines.append(f'| {p.step} | {"×".join(map(str, p.layout))} | {p.remat} | {p.batch} × {p.seq_len} '
                 f'({p.grad_accum_steps}) | {gb(p.params_bytes)} | {gb(p.cache_bytes)} | {gb(p.argument_bytes)} | '
                 f'{gb(p.output_bytes)} | {gb(p.alias_bytes)} | {gb(p.temp_bytes)} | **{gb(p.device_bytes)}** | '
                 f'{"fits" if p.fits("v5p") else "no"} | {"fits" if p.fits("H100") else "no"} | {p.compile_s:.0f} |')
  return '\n'.join(lines)


def dry_run(args: argparse.Namespace) -> None:
  """`--dry_run`: the flags checked (steps, layouts, micro-batch counts, size) and what would be planned."""
  if unknown := [step for step in args.steps.split(',') if step not in STEPS]:
    raise SystemExit(f'error: --steps entries {unknown}; expected some of {STEPS}')
  try:
    layouts = list(map(parse_layout, args.layouts.split(',')))
    accums = list(map(int, args.grad_accum_steps.split(',')))
    model.get(args.size)
  except ValueError as e:
    raise SystemExit(f'error: {e}') from None
  print(f'would plan: {args.size}, steps {args.steps}, layouts {layouts}, grad_accum_steps {accums}, remat '
        f'{args.remat} × scope {args.remat_scope}, on {args.devices} fake devices')


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--size', default='command_a_111b')
  parser.add_argument('--devices', type=int, default=256, help='fake CPU devices (read before jax starts)')
  parser.add_argument('--layouts', default='1x256x1,1x32x8', help='comma-separated DATAxFSDPxTENSOR')
  parser.add_argument('--remat', default='full', help='comma-separated remat policies (model.config)')
  parser.add_argument('--steps', default='sft,rlvr', help=f'comma-separated, of {STEPS}')
  parser.add_argument('--sft_batch', type=int, default=256)
  parser.add_argument('--sft_seq_len', type=int, default=8192)
  parser.add_argument('--rlvr_batch', type=int, default=256, help='rollouts per update (prompts × k)')
  parser.add_argument('--rlvr_seq_len', type=int, default=4096, help='prompt + generated tokens')
  parser.add_argument('--rollout_rows', type=int, default=256, help='rollout slots (prompts × samples per prompt)')
  parser.add_argument('--rollout_prompt_len', type=int, default=1024, help='padded prompt width')
  parser.add_argument('--rollout_new_tokens', type=int, default=31744, help='decode loop length (cache: prompt + '
                      'this)')
  parser.add_argument('--grad_accum_steps', default='1', help='comma-separated micro-batch counts')
  parser.add_argument('--attention', default='blockwise', help='attention_impl (model.attention; the fake '
                      'devices are CPUs, so `auto` would mean their choice, not the accelerator\'s)')
  parser.add_argument('--remat_scope', default='group,layer', help="comma-separated, of 'group' and 'layer' "
                      '(model.config)')
  parser.add_argument('--dry_run', action='store_true', help='check the flags (steps, layouts, sizes) and say what '
                      'would be compiled, compiling nothing')
  args = parser.parse_args(argv)
  if args.dry_run:
    dry_run(args)
    return
  if jax.device_count() != args.devices:
    raise SystemExit(f'error: {jax.device_count()} devices, --devices={args.devices}; run as '
                     f'`python -m luckystar.aot_plan` (it sets the fake device count before jax starts)')
  plans = []
  for step in args.steps.split(','):
    if step not in STEPS:
      raise SystemExit(f'error: --steps entry {step!r}; expected one of {STEPS}')
    batch, seq_len = (args.sft_batch, args.sft_seq_len) if step == 'sft' else (args.rlvr_batch, args.rlvr_seq_len)
    get_config = functools.partial(model.get, args.size, param_dtype='bfloat16', dtype='bfloat16',
                                   attention_impl=args.attention)
    if step == 'rollout':   # decoding takes no gradients: remat and micro-batches do not apply
      for layout in map(parse_layout, args.layouts.split(',')):
        plans += rollout_plans(get_config(), layout, rows=args.rollout_rows, prompt_len=args.rollout_prompt_len,
                               max_new_tokens=args.rollout_new_tokens)
        print('\n'.join(table(plans[-3:]).splitlines()[2:]), flush=True)
      continue
    for remat, scope in itertools.product(args.remat.split(','), args.remat_scope.split(',')):
      model_config = get_config(remat_policy=remat, remat_scope=scope)
      for layout in map(parse_layout, args.layouts.split(',')):
        for accum in map(int, args.grad_accum_steps.split(',')):
          plans.append(plan(step, model_config, layout, batch=batch, seq_len=seq_len, grad_accum_steps=accum))
          print(table(plans[-1:]).splitlines()[-1], flush=True)
  print(f'\n{args.size}: {model.param_count(model.get(args.size)) / 1e9:.2f}B params, bf16 params and AdamW '
        f'moments, {args.attention} attention, {args.devices} fake CPU devices')
  print(table(plans))
  print(f'peak host RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB')


if __name__ == '__main__':
  main()
