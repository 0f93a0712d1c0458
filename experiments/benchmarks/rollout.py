"""The RL rollout path on a trained model with real tool turns: tokens/s, compiles, and the plain sampler.

    python experiments/benchmarks/rollout.py                       # tiny-sft, 16 prompts × 8 samples, 160 tokens
    python experiments/benchmarks/rollout.py --prompts=4 --k=2 --new_tokens=32 --repeats=1   # a quick check

(with luckystar installed, `pip install -e .`, or PYTHONPATH=. from the repository root)

The main job's RLVR rollouts: the bundled `tiny-sft`, the first --prompts train prompts of the stage's pool
(configs/rlvr.py's sources: chat, function calling, math, NL2SQL; reasoning-mode render), --k samples per
prompt as rows n·k + j, its sampling settings (temperature 1.0) and tool limits, the tools of
`rollouts.task_tools` (NL2SQL rows query their database in the sandbox, every row has the calculator).
Each repeat runs, in turn:
  tools        `sampling.rollout` with the tools, a slot per row
  tools/half   the same rows in half as many slots (continuous batching refills them)
  no tools     `sampling.rollout` without tools (a row that calls one ends there)
  sampler      `sampling.sample` on the same prompts, new tokens, temperature and stop tokens (the same work
               as `no tools`: one prefill and one decode loop, no host round trips)
after one warm-up of each (compiles). Medians over --repeats are printed: seconds, generated tokens/s
(model tokens; tool turns spliced in are not counted), tool calls, and the programs compiled after the
warm-up (jit cache sizes of the sampler's programs; 0 means shapes stayed fixed). `no tools / sampler`
is the rollout loop's overhead on identical work; their tokens must agree row for row (per-row keys).
"""

import argparse
import dataclasses
import pathlib
import statistics
import time

import jax
import numpy as np

import luckystar
from luckystar import config as config_lib
from luckystar import sampling
from luckystar.engine import rollouts
from luckystar.engine import curriculum
from luckystar.stages import rlvr

RLVR_CONFIG = pathlib.Path(__file__).resolve().parents[2] / 'configs' / 'rlvr.py'


def compiled_programs() -> int:
  """Programs the sampler has compiled so far (jit cache entries)."""
  return sum(f._cache_size() for f in (sampling.init_state, sampling.grow_state, sampling.admit,
                                       sampling.admit_in_place, sampling.decode_round, sampling.sample_padded))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', default='tiny-sft')
  parser.add_argument('--prompts', type=int, default=16)
  parser.add_argument('--k', type=int, default=8, help='samples per prompt')
  parser.add_argument('--new_tokens', type=int, default=0, help='0: configs/rlvr.py max_new_tokens (160)')
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()

  config = config_lib.from_file(RLVR_CONFIG)
  settings = config.rlvr
  new_tokens = args.new_tokens or config.sampling.max_new_tokens
  model = luckystar.load(args.model)
  tokenizer = model.tokenizer
  pool, _ = curriculum.prompt_pool(settings, 'train', tokenizer, seed=config.seed)
  by_task = [[e for e in pool if e.task == task] for task in sorted({e.task for e in pool})]
  examples = [e for group in zip(*by_task) for e in group][:args.prompts]   # round-robin over the tasks
  rows = [e for e in examples for _ in range(args.k)]
  prompts = [rollouts.render_prompt(tokenizer, e) for e in rows]
  tool_fn = rollouts.task_tools(rows)
  rng = jax.random.key(config.seed)
  rollout_settings = dataclasses.replace(rollouts.rollout_settings(config, 'rlvr'), max_new_tokens=new_tokens)

  def rollout(tools: bool, slots: int | None = None):
    out = sampling.rollout(model.config, model.params, tokenizer, prompts, rng=rng,
                           settings=dataclasses.replace(rollout_settings, slots=slots),
                           tool_fn=tool_fn if tools else None)
    return int(sum(r.loss_mask.sum() for r in out)), sum(len(r.tool_results) for r in out), out

  def sample():
    out = jax.device_get(sampling.sample(model.config, model.params, prompts, rng=rng, max_new_tokens=new_tokens,
                                         settings=rollout_settings.sampling, stop_ids=tokenizer.stop_ids,
                                         length_multiple=settings.length_multiple))
    return int(out.lengths.sum()), 0, out

  modes = {'tools': lambda: rollout(True), 'no tools': lambda: rollout(False), 'sampler': sample,
           'tools/half': lambda: rollout(True, len(rows) // 2)}
  print(f'{args.model}: {len(examples)} prompts × {args.k} samples, {new_tokens} new tokens, temperature '
        f'{config.sampling.temperature}; prompt tokens {min(map(len, prompts))}–{max(map(len, prompts))}; '
        f'jax {jax.__version__} on {jax.devices()[0].platform}')
  results = {name: run() for name, run in modes.items()}   # warm-up: compiles
  warm = compiled_programs()
  times = {name: [] for name in modes}
  for _ in range(args.repeats):
    for name, run in modes.items():
      start = time.perf_counter()
      results[name] = run()
      times[name].append(time.perf_counter() - start)
  compiles = compiled_programs() - warm
  for name in modes:
    seconds, (tokens, calls, _) = statistics.median(times[name]), results[name]
    spread = f'{min(times[name]):.2f}–{max(times[name]):.2f}'
    print(f'{name:<11} {seconds:6.2f} s ({spread}), {tokens:6,} generated tokens, {tokens / seconds:7,.0f} tok/s, '
          f'{calls:3} tool calls')
  print(f'compiled after warm-up: {compiles} programs (sampler programs in all: {compiled_programs()})')
  no_tools, sampled = results['no tools'][2], results['sampler'][2]
  equal = sum(np.array_equal(r.token_ids, sampled.tokens[b, :sampled.lengths[b]]) for b, r in enumerate(no_tools))
  ratio = (results['no tools'][0] / statistics.median(times['no tools'])) / (
      results['sampler'][0] / statistics.median(times['sampler']))
  print(f'no tools / sampler: {ratio:.2f}x tokens/s; rows with equal tokens {equal}/{len(rows)}')


if __name__ == '__main__':
  main()
