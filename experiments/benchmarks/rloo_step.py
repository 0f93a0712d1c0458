"""One RLOO step of the RLVR stage: seconds per step and its split into rollout / scoring / update (DESIGN §9).

    python experiments/benchmarks/rloo_step.py                     # 8 prompts × 8 rollouts × 64 new tokens, bench
    python experiments/benchmarks/rloo_step.py --prompts=2 --k=2 --new_tokens=8 --steps=1   # a quick check

(with luckystar installed, `pip install -e .`, or PYTHONPATH=. from the repository root)

The stage's own code, wired as `luckystar.stages.rlvr.run` wires it: configs/rlvr.py with
init_from='random:<size>', batch_size=--prompts, samples_per_prompt=--k, max_new_tokens=--new_tokens
(temperature 1.0 as configured); the bundled tokenizer; the first --prompts train prompts of the
stage's prompt pool (`rloo.prompt_pool`: reasoning-mode render, RS-only prompts left out), taken
round-robin over --tasks. Each step, as the training loop runs it, is timed in four phases:
  rollout   `rollouts.generate_and_score` minus its verifier calls: `sampling.rollout` with the SQL
            tool loop, k samples per prompt
  scoring   the `rewards.reward.score` calls inside it (one per rollout; timed by wrapping the function)
  batch     `rloo.training_batch` (RLOO advantages, padded rows), `rloo.rollout_metrics`, `put_batch`
  update    the compiled `step.make_update_fn(rloo.loss_fn, ...)`: forward, backward, clipping, AdamW
One warm-up step first (it compiles the sampler and the update; printed apart), then the step with the
median total of --steps steps, with its split (compiling for a new batch shape, should one appear, is
printed apart and left out). A random model almost never emits a stop token, so rollouts run to the
budget and are dropped as overlong (zero advantages): the update's arithmetic is the same.
Our rendered prompts (chat template, system turn) are longer than the peer's 32 tokens; the prompt
lengths are printed.
Peer (DESIGN §9): TRL 1.16 `RLOOTrainer` on this shape and a `bench`-shaped model, 6.1–6.5 s per step
on 2 CPU cores; goal ≤ 2 s.
"""

import argparse
import contextlib
import functools
import os
import pathlib
import time

import jax
import numpy as np

from luckystar import config as config_lib
from luckystar import model
from luckystar import tokenizer as tokenizer_lib
from luckystar.model import sharding
from luckystar.rewards import reward as reward_lib
from luckystar.engine import optim, rollouts
from luckystar.stages import rlvr as rloo
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib

RLVR_CONFIG = pathlib.Path(__file__).resolve().parents[2] / 'configs' / 'rlvr.py'
PEER_SECONDS = (6.1, 6.5)  # TRL 1.16 RLOOTrainer, DESIGN §9
PHASES = ('rollout', 'scoring', 'batch', 'update')


def stage_config(size: str, prompts: int, samples_per_prompt: int, new_tokens: int):
  """configs/rlvr.py on a random model of `size`, at the benchmark's shape."""
  config = config_lib.from_file(RLVR_CONFIG)
  config.init_from = f'random:{size}'
  config.batch_size = prompts
  config.rlvr.samples_per_prompt = samples_per_prompt
  config.sampling.max_new_tokens = new_tokens
  return config


def benchmark_prompts(config, tokenizer, tasks: list[str], count: int):
  """The first `count` prompts of the stage's train pool, round-robin over `tasks`."""
  settings = config.rlvr.copy_and_resolve_references()
  settings.sources = ','.join(f'bundled:{task}' for task in tasks)
  pool, _ = rloo.prompt_pool(settings, 'train', tokenizer, seed=config.seed)
  by_task = {task: [e for e in pool if e.task == task] for task in tasks}
  examples = [by_task[tasks[i % len(tasks)]][i // len(tasks)] for i in range(count)]
  return examples, [rollouts.render_prompt(tokenizer, e) for e in examples]


@contextlib.contextmanager
def timed_scoring():
  """Yields [seconds, calls] of `reward.score` (the verifiers) while the block runs."""
  original, spent = reward_lib.score, [0.0, 0]  # seconds, calls

  def score(*args, **kwargs):
    start = time.perf_counter()
    try:
      return original(*args, **kwargs)
    finally:
      spent[0] += time.perf_counter() - start
      spent[1] += 1

  reward_lib.score = score
  try:
    yield spent
  finally:
    reward_lib.score = original


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--prompts', type=int, default=8)
  parser.add_argument('--k', type=int, default=8, help='rollouts per prompt')
  parser.add_argument('--new_tokens', type=int, default=64)
  parser.add_argument('--size', default='bench')
  parser.add_argument('--tasks', default='math', help='comma-separated, e.g. math,korean_mc')
  parser.add_argument('--steps', type=int, default=3, help='timed steps (the median one is reported)')
  args = parser.parse_args()

  config = stage_config(args.size, args.prompts, args.k, args.new_tokens)
  settings = config.rlvr
  tokenizer = tokenizer_lib.default()
  examples, prompts = benchmark_prompts(config, tokenizer, args.tasks.split(','), args.prompts)

  # As rloo.run builds them.
  model_config, params, *_ = state_lib.initial_model(config.init_from)
  mesh = sharding.make_mesh(dict(config.mesh))
  optimizer = optim.make(config, settings.updates_per_batch)
  state = state_lib.create(model_config, optimizer, mesh, seed=config.seed, params=params)
  loss = functools.partial(rloo.loss_fn, model_config=model_config, temperature=config.sampling.temperature,
                           clip_epsilon=settings.clip_epsilon, kl_beta=settings.kl_beta, normalize=settings.normalize)
  update_fn = step_lib.make_update_fn(
      loss, optimizer, step_lib.state_shardings_of(state), mesh=mesh,
      learning_rate=optim.learning_rate_schedule(config, settings.updates_per_batch),
      grad_accum_steps=config.grad_accum_steps, denominator=settings.normalize,
      updates_per_batch=settings.updates_per_batch)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  executables = {}  # one compiled update per batch shape, as luckystar.engine.loop keeps them

  def step(state):
    """One training step as the loop takes it: (state, phase seconds, facts)."""
    rollout_rng = jax.random.fold_in(state_lib.step_rng(state), 1)
    update_rng = jax.device_put(state_lib.step_rng(state), replicated)
    start = time.perf_counter()
    with timed_scoring() as scoring:
      groups = rollouts.generate_and_score(model_config, state.params, tokenizer, examples, prompts, rollout_rng,
                                           samples_per_prompt=settings.samples_per_prompt,
                                           **rloo.rollout_options(config))
    sampled = time.perf_counter()
    batch, zero_variance = rloo.training_batch(prompts, groups, length_multiple=settings.length_multiple,
                                               score_multiple=config.sampling.max_new_tokens)
    rloo.rollout_metrics(groups, zero_variance)
    device_batch = jax.block_until_ready(update_fn.put_batch(batch))
    built = time.perf_counter()
    shapes = tuple(sorted((k, v.shape) for k, v in device_batch.items()))
    new_shape = shapes not in executables
    if new_shape:
      executables[shapes] = update_fn.lower(state, device_batch, update_rng).compile()
    compiled = time.perf_counter()
    state, metrics = executables[shapes](state, device_batch, update_rng)
    metrics = jax.device_get(metrics)
    done = time.perf_counter()
    seconds = {'rollout': sampled - start - scoring[0], 'scoring': scoring[0], 'batch': built - sampled,
               'update': done - compiled, 'compile': compiled - built if new_shape else 0.0}
    flat = [s for group in groups for s in group]
    facts = {'scored': scoring[1], 'generated': sum(int(s.rollout.loss_mask.sum()) for s in flat),
             'rollouts': len(flat), 'overlong': sum(bool(s.rollout.overlong) for s in flat),
             'used': int(batch['used'].sum()), 'batch_shape': batch['tokens'].shape,
             'loss': float(metrics['train/loss'])}
    return state, seconds, facts

  lengths = [len(p) for p in prompts]
  print(f'devices: {jax.device_count()} × {jax.devices()[0].device_kind}, {os.cpu_count()} CPU cores '
        f'({len(os.sched_getaffinity(0))} usable); jax {jax.__version__}; {args.size} model '
        f'{model.param_count(model_config) / 1e6:.2f}M params, bundled tokenizer')
  print(f'shape: {args.prompts} prompts ({args.tasks}; {min(lengths)}–{max(lengths)} tokens, mean '
        f'{np.mean(lengths):.0f}) × {args.k} rollouts × ≤ {args.new_tokens} new tokens, temperature '
        f'{config.sampling.temperature}')

  state, warmup, facts = step(state)
  print(f'warm-up step (compiles sampler and update): {sum(warmup.values()):.2f} s = rollout {warmup["rollout"]:.2f}'
        f' + scoring {warmup["scoring"]:.3f} + batch {warmup["batch"]:.3f} + update compile {warmup["compile"]:.2f}'
        f' + update {warmup["update"]:.3f}')

  timed = []
  for _ in range(args.steps):
    state, seconds, facts = step(state)
    timed.append((sum(seconds[p] for p in PHASES), seconds, facts))  # compilation left out
  timed.sort(key=lambda t: t[0])
  total, seconds, facts = timed[len(timed) // 2]
  print(f'update batch {facts["batch_shape"][0]} × {facts["batch_shape"][1]} tokens; {facts["generated"]} tokens '
        f'generated; {facts["scored"]} rollouts scored, {facts["overlong"]}/{facts["rollouts"]} overlong, '
        f'{facts["used"]} rows in the loss; loss {facts["loss"]:.4f}\n')
  print(f'{"phase":<9} {"s/step":>8} {"share":>7}')
  for phase in PHASES:
    print(f'{phase:<9} {seconds[phase]:>8.4f} {seconds[phase] / total:>6.1%}')
  if seconds['compile'] > 0:
    print(f'(and {seconds["compile"]:.2f} s compiling the update for a new batch shape, not counted)')
  spread = f'; range {timed[0][0]:.2f}–{timed[-1][0]:.2f} s' if len(timed) > 1 else ''
  print(f'{"total":<9} {total:>8.4f}         median of {len(timed)} step(s){spread}; '
        f'rollout {facts["generated"] / seconds["rollout"]:.0f} generated tokens/s')
  peer = float(np.mean(PEER_SECONDS))
  print(f'\nTRL 1.16 RLOOTrainer (2 CPU cores, DESIGN §9): {PEER_SECONDS[0]}–{PEER_SECONDS[1]} s/step; '
        f'ours / {peer} s = {total / peer:.2f} (speed-up {peer / total:.1f}×)')
  print('Goal: ≤ 2 s/step on 8 × 8 × 64, bench (DESIGN §9). A shared CPU slows every figure.')


if __name__ == '__main__':
  main()
