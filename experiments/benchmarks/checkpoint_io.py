"""Checkpoint I/O memory: loading a transformers checkpoint onto a device mesh and saving it again, ours (each
device reads its own block, `hf.load_sharded`; modules stream out one at a time, `hf.save_hf`) against
`transformers.AutoModelForCausalLM.from_pretrained` on the same files.

    python experiments/benchmarks/checkpoint_io.py                 # a 2.2 GB bf16 checkpoint in /tmp
    python experiments/benchmarks/checkpoint_io.py --layers=4      # a quick 0.5 GB run

The checkpoint: random Cohere2 weights in bfloat16 (vocab 32,000, hidden 2,048, MLP 5,632, 16 heads of 128,
4 KV heads, `--layers` layers), written once in 512 MB shards; its largest tensor (the embedding) is ~6% of it.
Each measurement runs in its own subprocess on 8 fake CPU devices (mesh fsdp 4 × tensor 2), params in
bfloat16: 1 process × 8 devices, and 2 processes × 4 devices on 127.0.0.1 (jax.distributed, gloo). The
figure per process: peak RSS (ru_maxrss) minus the bytes of params resident in that process, against the
budget 2 × largest tensor + 0.5 GB (the interpreter and jax's own ~0.4 GB count against the 0.5 GB).
transformers' figure is its peak RSS minus its params' bytes, after touching every weight (it may map the files
and read them lazily; mapped pages count in RSS once read).
"""

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

import numpy as np

GB = 1 << 30
ROOT = pathlib.Path(__file__).resolve().parents[2]


def model_config(layers: int):
  from luckystar import model
  return model.ModelConfig(vocab_size=32_000, hidden_size=2048, intermediate_size=5632, num_layers=layers,
                           num_heads=16, num_kv_heads=4, layer_types=model.pattern_layer_types(layers),
                           sliding_window=4096, param_dtype='bfloat16', dtype='bfloat16')


def build(directory: pathlib.Path, layers: int) -> None:
  """Random bf16 weights, generated and written a leaf at a time."""
  import jax
  from luckystar import model
  from luckystar.interop import hf
  config = model_config(layers)
  rng = np.random.default_rng(0)
  shapes = jax.tree.map(lambda leaf: leaf.shape, jax.eval_shape(model.init, config, jax.random.key(0)))
  params = jax.tree.map(lambda shape: (0.02 * rng.standard_normal(shape, np.float32)).astype(jax.numpy.bfloat16),
                        shapes, is_leaf=lambda x: isinstance(x, tuple))
  hf.save_hf(directory, config, params, dtype='bfloat16', max_shard_bytes=512 << 20)


def _resident_bytes(params) -> int:
  import jax
  return sum(shard.data.nbytes for leaf in jax.tree.leaves(params) for shard in leaf.addressable_shards)


def measure(args) -> None:
  """One subprocess's measurement, printed as a JSON line."""
  import jax
  if args.processes > 1:
    jax.distributed.initialize(coordinator_address=f'127.0.0.1:{args.port}', num_processes=args.processes,
                               process_id=args.process_id)
  from luckystar import model
  from luckystar.interop import hf
  baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
  config, headers = hf.read_config(args.checkpoint, param_dtype='bfloat16', dtype='bfloat16')
  mesh = model.sharding.make_mesh(dict(data=1, fsdp=4, tensor=2))
  started = time.perf_counter()
  params = hf.load_sharded(config, headers, model.param_shardings(config, mesh))
  jax.block_until_ready(params)
  seconds = time.perf_counter() - started
  if args.measure == 'save':
    started = time.perf_counter()
    hf.save_hf(pathlib.Path(args.out), config, params, dtype='bfloat16', max_shard_bytes=512 << 20)
    seconds = time.perf_counter() - started
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
  largest = max(np.prod(h.shape) * 2 for h in headers.values())
  print(json.dumps({'what': args.measure, 'process': jax.process_index(), 'processes': jax.process_count(),
                    'peak_gb': peak / GB, 'baseline_gb': baseline / GB, 'params_gb': _resident_bytes(params) / GB,
                    'overhead_gb': (peak - _resident_bytes(params)) / GB,
                    'budget_gb': (2 * largest + GB / 2) / GB, 'seconds': seconds}))


def measure_transformers(args) -> None:
  import torch
  import transformers
  started = time.perf_counter()
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.bfloat16)
  with torch.no_grad():   # its weights may be memory-mapped and read lazily: touch every one, as a forward would
    for parameter in hf_model.parameters():
      parameter.sum()
  seconds = time.perf_counter() - started
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
  params = sum(p.numel() * p.element_size() for p in hf_model.parameters())
  print(json.dumps({'what': 'transformers load', 'process': 0, 'processes': 1, 'peak_gb': peak / GB,
                    'params_gb': params / GB, 'overhead_gb': (peak - params) / GB, 'seconds': seconds}))


def run(what: str, checkpoint: pathlib.Path, processes: int, out: pathlib.Path | None = None) -> list[dict]:
  env = {**os.environ, 'XLA_FLAGS': f'--xla_force_host_platform_device_count={8 // processes}',
         'PYTHONPATH': str(ROOT)}
  command = [sys.executable, __file__, f'--measure={what}', f'--checkpoint={checkpoint}',
             f'--processes={processes}', f'--port={12_000 + os.getpid() % 1000}', f'--out={out or ""}']
  children = [subprocess.Popen([*command, f'--process_id={i}'], env=env, stdout=subprocess.PIPE, text=True)
              for i in range(processes)]
  rows = []
  for child in children:
    stdout, _ = child.communicate()
    if child.returncode:
      raise SystemExit(f'{what} on {processes} processes failed ({child.returncode})')
    rows.append(json.loads(stdout.strip().splitlines()[-1]))
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--layers', type=int, default=24)
  parser.add_argument('--workdir', default='/tmp/luckystar-checkpoint-io')
  parser.add_argument('--measure', default='', help=argparse.SUPPRESS)
  parser.add_argument('--checkpoint', default='', help=argparse.SUPPRESS)
  parser.add_argument('--processes', type=int, default=1, help=argparse.SUPPRESS)
  parser.add_argument('--process_id', type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument('--port', type=int, default=12_345, help=argparse.SUPPRESS)
  parser.add_argument('--out', default='', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.measure == 'transformers':
    return measure_transformers(args)
  if args.measure:
    return measure(args)

  workdir = pathlib.Path(args.workdir)
  checkpoint = workdir / f'cohere2-{args.layers}l'
  if not checkpoint.exists():
    build(checkpoint, args.layers)
  size = sum(f.stat().st_size for f in checkpoint.glob('*.safetensors'))
  print(f'checkpoint {checkpoint}: {size / GB:.2f} GB in {len(list(checkpoint.glob("*.safetensors")))} files')
  rows = []
  for processes in (1, 2):
    rows += run('load', checkpoint, processes)
    out = workdir / f'saved-{processes}'
    subprocess.run(['rm', '-rf', str(out)], check=True)
    rows += run('save', checkpoint, processes, out)
  from luckystar.interop import hf
  source = hf.read_headers(checkpoint)
  for processes in (1, 2):
    saved = hf.read_headers(workdir / f'saved-{processes}')
    same = set(saved) == set(source) and all(np.array_equal(
        hf.read_block(source[name], hf._whole(source[name].shape)),
        hf.read_block(saved[name], hf._whole(saved[name].shape))) for name in source)
    print(f'saved by {processes} process(es): {"bit-identical to" if same else "DIFFERS from"} the source')
  env = {**os.environ, 'PYTHONPATH': str(ROOT)}
  child = subprocess.run([sys.executable, __file__, '--measure=transformers', f'--checkpoint={checkpoint}'], env=env,
                         stdout=subprocess.PIPE, text=True, check=True)
  rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
  print(f'{"what":<18} {"processes":>9} {"process":>7} {"peak GB":>8} {"params GB":>9} {"peak-params GB":>14} '
        f'{"budget GB":>9} {"seconds":>8}')
  for row in rows:
    print(f'{row["what"]:<18} {row["processes"]:>9} {row["process"]:>7} {row["peak_gb"]:>8.2f} '
          f'{row["params_gb"]:>9.2f} {row["overhead_gb"]:>14.2f} {row.get("budget_gb", float("nan")):>9.2f} '
          f'{row["seconds"]:>8.1f}')


if __name__ == '__main__':
  main()
