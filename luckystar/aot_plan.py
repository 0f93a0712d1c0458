"""Ahead-of-time memory plan of the training steps on a large mesh, before any device is touched.

    python -m luckystar.aot_plan                      # command_a_111b on 256 fake CPU devices
    python -m luckystar.aot_plan --layouts=1x256x1 --remat=full --steps=sft

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
import resource
import time

import jax
import jax.numpy as jnp

from luckystar import config as config_lib
from luckystar import model
from luckystar.engine import logprobs, optim
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib
from luckystar.model import sharding
from luckystar.stages import rlvr

HBM_BYTES = {'v5p': 95 * 10**9, 'H100': 80 * 10**9}
STEPS = ('sft', 'rlvr')


@dataclasses.dataclass(frozen=True)
class Plan:
  step: str              # 'sft' or 'rlvr'
  layout: tuple[int, int, int]   # (data, fsdp, tensor)
  remat: str             # 'policy/scope'
  batch: int             # global rows
  seq_len: int
  grad_accum_steps: int
  argument_bytes: int    # per device: state + batch
  output_bytes: int
  alias_bytes: int       # outputs written in place of donated arguments (the state)
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


def plan(step: str, model_config: model.ModelConfig, layout: tuple[int, int, int], *, batch: int, seq_len: int,
         grad_accum_steps: int = 1) -> Plan:
  """Compiles one step for `layout` and reads its per-device memory; nothing is allocated."""
  mesh = sharding.make_mesh(layout)
  config = config_lib.base('sft')   # the shared optimizer settings (AdamW, moments in the param dtype)
  optimizer = optim.make(config)
  state = state_lib.abstract(model_config, optimizer, mesh)
  if step == 'sft':
    loss, denominator = functools.partial(logprobs.token_cross_entropy, model_config=model_config), 'tokens'
  else:
    loss, denominator = functools.partial(rlvr.loss_fn, model_config=model_config), 'tokens'
  update_fn = step_lib.make_update_fn(loss, optimizer, jax.tree.map(lambda s: s.sharding, state), mesh=mesh,
                                      learning_rate=optim.learning_rate_schedule(config),
                                      grad_accum_steps=grad_accum_steps, denominator=denominator)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
  start = time.perf_counter()
  compiled = update_fn.lower(state, batch_structs(step, batch, seq_len, mesh), rng).compile()
  compile_s = time.perf_counter() - start
  stats = compiled.memory_analysis()
  return Plan(step=step, layout=layout, remat=f'{model_config.remat_policy}/{model_config.remat_scope}',
              batch=batch, seq_len=seq_len,
              grad_accum_steps=grad_accum_steps, argument_bytes=stats.argument_size_in_bytes,
              output_bytes=stats.output_size_in_bytes, alias_bytes=stats.alias_size_in_bytes,
              temp_bytes=stats.temp_size_in_bytes, code_bytes=stats.generated_code_size_in_bytes,
              compile_s=compile_s)


def table(plans: list[Plan]) -> str:
  """A markdown table, one row per compiled step."""
  gb = lambda n: f'{n / 1e9:.1f}'
  lines = ['| step | data×fsdp×tensor | remat | batch × seq (micro-batches) | state + batch GB | temporaries GB | '
           'per device GB | v5p 95 GB | H100 80 GB | compile s |',
           '|---|---|---|---|---|---|---|---|---|---|']
  for p in plans:
    lines.append(f'| {p.step} | {"×".join(map(str, p.layout))} | {p.remat} | {p.batch} × {p.seq_len} '
                 f'({p.grad_accum_steps}) | {gb(p.argument_bytes)} | {gb(p.temp_bytes)} | **{gb(p.device_bytes)}** | '
                 f'{"fits" if p.fits("v5p") else "no"} | {"fits" if p.fits("H100") else "no"} | {p.compile_s:.0f} |')
  return '\n'.join(lines)


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
  parser.add_argument('--grad_accum_steps', default='1', help='comma-separated micro-batch counts')
  parser.add_argument('--attention', default='blockwise', help='attention_impl (model.attention; the fake '
                      'devices are CPUs, so `auto` would mean their choice, not the accelerator\'s)')
  parser.add_argument('--remat_scope', default='group,layer', help="comma-separated, of 'group' and 'layer' "
                      '(model.config)')
  args = parser.parse_args(argv)
  if jax.device_count() != args.devices:
    raise SystemExit(f'error: {jax.device_count()} devices, --devices={args.devices}; run as '
                     f'`python -m luckystar.aot_plan` (it sets the fake device count before jax starts)')
  plans = []
  for step in args.steps.split(','):
    if step not in STEPS:
      raise SystemExit(f'error: --steps entry {step!r}; expected one of {STEPS}')
    batch, seq_len = (args.sft_batch, args.sft_seq_len) if step == 'sft' else (args.rlvr_batch, args.rlvr_seq_len)
    for remat, scope in itertools.product(args.remat.split(','), args.remat_scope.split(',')):
      model_config = model.get(args.size, param_dtype='bfloat16', dtype='bfloat16', remat_policy=remat,
                               remat_scope=scope, attention_impl=args.attention)
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
