"""One RLOO step of the RLVR stage: seconds per step and its split into rollout / scoring / update (docs/benchmarks.md).

    python experiments/benchmarks/rlvr_step.py                     # 8 prompts × 8 rollouts × 64 new tokens, bench
    python experiments/benchmarks/rlvr_step.py --prompts=2 --k=2 --new_tokens=8 --steps=1 --peer=none  # a quick check

(with luckystar installed, `pip install -e .`, or PYTHONPATH=. from the repository root)

The stage's own code, wired as `luckystar.stages.rlvr.run` wires it: configs/rlvr.py with
init_from='random:<size>', batch_size=--prompts, samples_per_prompt=--k, max_new_tokens=--new_tokens
(temperature 1.0 as configured); the bundled tokenizer; the first --prompts train prompts of the
stage's prompt pool (`engine.curriculum.prompt_pool`: reasoning-mode render, RS-only prompts left out), taken
round-robin over --tasks. Each step, as the training loop runs it, is timed in four phases:
  rollout   `rollouts.generate_and_score` minus its verifier calls: `sampling.rollout` with the SQL
            tool loop, k samples per prompt
  scoring   the `rewards.reward.score` calls inside it (one per rollout; timed by wrapping the function)
  batch     `rlvr.training_batch` (RLOO advantages, padded rows), `rlvr.rollout_metrics`, `put_batch`
  update    the compiled `step.make_update_fn(rlvr.loss_fn, ...)`: forward, backward, clipping, AdamW
One warm-up step first (it compiles the sampler and the update; printed apart), then the step with the
median total of --steps steps (5), with its split (compiling for a new batch shape, should one appear, is
printed apart and left out). A random model almost never emits a stop token, so rollouts run to the
budget and are dropped as overlong (zero advantages): the update's arithmetic is the same.
Our rendered prompts (chat template, system turn) are longer than a bare question; the prompt
lengths are printed, and the peer gets the very same token ids.

Peer, in the same run (`--peer=trl`, the default, when TRL is installed: `pip install -e ".[bench]"`): TRL's
`RLOOTrainer` on our random weights (`sft_step.hf_model`: exported with `interop.hf.params_to_hf` into a
transformers `Cohere2ForCausalLM`), fp32 on 2 torch threads, the same prompts as token ids
(`sft_step.word_tokenizer`: its word i is token i), k generations of exactly --new_tokens tokens
(`min_new_tokens`, as our random model runs every rollout to its budget), temperature 1, no KL term (beta 0,
as configs/rlvr.py), no gradient checkpointing, one optimizer step per generation batch, no logging, saving
or eval inside a step. One TRL step and one of ours alternate (a callback runs ours between TRL's steps,
outside its timed window),
--steps times after a warm-up each; medians, spreads and the ratio are printed, with the step's model
FLOPs and the floor they imply at the fp32 matmul peak measured in this run (jax, 2,048² matmuls).
Then the plain sampler (`sampling.sample`) on the step's rollout rows, same new tokens and temperature,
one prefill per row and no tool loop, and the share of its tokens/s that the step's rollout reaches.
"""

import argparse
import contextlib
import functools
import os
import pathlib
import statistics
import tempfile
import time

import jax
import numpy as np

from luckystar import config as config_lib
from luckystar import model
from luckystar import sampling
from luckystar import tokenizer as tokenizer_lib
from luckystar.model import sharding
from luckystar.rewards import reward as reward_lib
from luckystar.engine import optim, rollouts
from luckystar.engine import curriculum
from luckystar.stages import rlvr
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib

import sft_step  # the same-run peers' shared parts (this file's directory)

RLVR_CONFIG = pathlib.Path(__file__).resolve().parents[2] / 'configs' / 'rlvr.py'
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
  pool, _ = curriculum.prompt_pool(settings, 'train', tokenizer, seed=config.seed)
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


def step_flops(model_config: model.ModelConfig, prompt_lengths: list[int], k: int, new_tokens: int) -> dict:
  """Model FLOPs of one step (2 · params per token forward plus QKᵀ and PV over the attended keys; embedding
  lookups free): each prompt prefilled once and k · new_tokens decoded per prompt, then the update's forward +
  backward over every row of prompt + completion, counted as the SFT benchmark counts a step."""
  params = model.param_count(model_config)
  attention = lambda length: sum(  # per token at context `length`, all layers
      4 * model_config.num_heads * model_config.head_dim *
      (min(length, model_config.sliding_window) if kind == model.SLIDING else length)
      for kind in model_config.layer_types)
  rollout = sum(length * (2 * params + attention(length) / 2) +
                k * sum(2 * params + attention(length + t) for t in range(new_tokens)) for length in prompt_lengths)
  update = sum(sft_step.train_flops_per_step(model_config, k, length + new_tokens) for length in prompt_lengths)
  return {'rollout': rollout, 'update': update}


def plain_sampler_tokens_per_second(model_config: model.ModelConfig, params, tokenizer, prompts: list[list[int]],
                                    k: int, settings, repeats: int = 3) -> float:
  """Generated tokens/s of `sampling.sample` on the step's rollout rows (prompt i's k samples as rows i·k + j),
  median of `repeats` after a compiling run."""
  rows = [p for p in prompts for _ in range(k)]
  run = lambda: jax.device_get(sampling.sample(
      model_config, params, rows, rng=jax.random.key(0), max_new_tokens=settings.max_new_tokens,
      settings=sampling.SamplingSettings(settings.temperature, settings.top_k, settings.top_p),
      stop_ids=tokenizer.stop_ids, length_multiple=64))
  run()
  rates = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = run()
    rates.append(int(out.lengths.sum()) / (time.perf_counter() - start))
  return statistics.median(rates)


def trl_trainer(model_config: model.ModelConfig, params, prompts: list[list[int]], k: int, new_tokens: int,
                temperature: float, steps: int, between, workdir: str):
  """TRL's RLOOTrainer on `params` and `prompts` (module docstring); `between()` runs after each of its steps.
  Returns (trainer, list of its step seconds)."""
  import datasets  # pylint: disable=g-import-not-at-top
  import torch
  import trl
  torch.set_num_threads(2)
  peer = sft_step.hf_model(model_config, params)
  tokenizer = sft_step.word_tokenizer(model_config.vocab_size)
  dataset = datasets.Dataset.from_dict({'prompt': [sft_step.as_words(p) for p in prompts]})
  config = trl.RLOOConfig(
      output_dir=workdir, per_device_train_batch_size=k * len(prompts), gradient_accumulation_steps=1,
      steps_per_generation=1, num_generations=k, max_completion_length=new_tokens, temperature=temperature,
      generation_kwargs={'min_new_tokens': new_tokens}, beta=0.0, max_steps=steps, num_train_epochs=steps,
      learning_rate=1e-5, shuffle_dataset=False, log_completions=False, **sft_step.TRL_ARGS)
  timer, seconds = sft_step.timed_steps(between)
  reward = lambda completions, **kwargs: [float(len(c) % 3) for c in completions]  # cheap, and rewards vary
  trainer = trl.RLOOTrainer(model=peer, reward_funcs=reward, args=config, train_dataset=dataset,
                            processing_class=tokenizer, callbacks=[timer])
  return trainer, seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--prompts', type=int, default=8)
  parser.add_argument('--k', type=int, default=8, help='rollouts per prompt')
  parser.add_argument('--new_tokens', type=int, default=64)
  parser.add_argument('--size', default='bench')
  parser.add_argument('--tasks', default='math', help='comma-separated, e.g. math,korean_mc')
  parser.add_argument('--steps', type=int, default=5, help='timed steps of each side (medians are reported)')
  parser.add_argument('--peer', default='trl', choices=('trl', 'none'))
  args = parser.parse_args()

  config = stage_config(args.size, args.prompts, args.k, args.new_tokens)
  settings = config.rlvr
  tokenizer = tokenizer_lib.default()
  examples, prompts = benchmark_prompts(config, tokenizer, args.tasks.split(','), args.prompts)

  # As rlvr.run builds them.
  model_config, params, *_ = state_lib.initial_model(config.init_from)
  mesh = sharding.make_mesh(dict(config.mesh))
  optimizer = optim.make(config, settings.updates_per_batch)
  state = state_lib.create(model_config, optimizer, mesh, seed=config.seed, params=params)
  loss = functools.partial(rlvr.loss_fn, model_config=model_config, temperature=config.sampling.temperature,
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
                                           **rlvr.rollout_options(config))
    sampled = time.perf_counter()
    batch, zero_variance = rlvr.training_batch(prompts, groups, length_multiple=settings.length_multiple,
                                               score_multiple=config.sampling.max_new_tokens)
    rlvr.rollout_metrics(groups, zero_variance)
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

  timed, peer_seconds = [], []

  def timed_step():
    nonlocal state
    if len(timed) < args.steps:
      state, seconds, facts = step(state)
      timed.append((sum(seconds[p] for p in PHASES), seconds, facts))  # compilation left out

  peer = args.peer
  if peer == 'trl':
    try:
      import trl  # pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      print('TRL is not installed (pip install -e ".[bench]"): no peer this run')
      peer = 'none'
  if peer == 'trl':
    with tempfile.TemporaryDirectory() as workdir:
      trainer, peer_seconds = trl_trainer(model_config, state.params, prompts, args.k,
                                          args.new_tokens, config.sampling.temperature, args.steps + 1,
                                          timed_step, workdir)
      trainer.train()    # TRL's first step is its warm-up; ours runs after each of its steps
    peer_seconds = peer_seconds[1:]
  while len(timed) < args.steps:
    timed_step()
  totals = [t[0] for t in timed]
  total, seconds, facts = sorted(timed, key=lambda t: t[0])[len(timed) // 2]
  print(f'update batch {facts["batch_shape"][0]} × {facts["batch_shape"][1]} tokens; {facts["generated"]} tokens '
        f'generated; {facts["scored"]} rollouts scored, {facts["overlong"]}/{facts["rollouts"]} overlong, '
        f'{facts["used"]} rows in the loss; loss {facts["loss"]:.4f}\n')
  print(f'{"phase":<9} {"s/step":>8} {"share":>7}')
  for phase in PHASES:
    print(f'{phase:<9} {seconds[phase]:>8.4f} {seconds[phase] / total:>6.1%}')
  if seconds['compile'] > 0:
    print(f'(and {seconds["compile"]:.2f} s compiling the update for a new batch shape, not counted)')
  print(f'{"total":<9} {total:>8.4f}         median of {len(timed)} step(s); range {min(totals):.2f}–'
        f'{max(totals):.2f} s; rollout {facts["generated"] / seconds["rollout"]:.0f} generated tokens/s')
  sampler = plain_sampler_tokens_per_second(model_config, state.params, tokenizer, prompts, args.k, config.sampling)
  print(f'the plain sampler on the same work (`sampling.sample`: these {len(prompts) * args.k} rows, '
        f'{args.new_tokens} new tokens, temperature {config.sampling.temperature}, one prefill per row, no tool loop): '
        f'{sampler:.0f} tokens/s; the step\'s rollout reaches '
        f'{facts["generated"] / seconds["rollout"] / sampler:.0%} of it')
  flops = step_flops(model_config, lengths, args.k, args.new_tokens)
  peak = sft_step.matmul_peak_flops()
  floor = {name: value / peak for name, value in flops.items()}
  print(f'\nmodel FLOPs: rollout {flops["rollout"] / 1e9:.1f} G, update {flops["update"] / 1e9:.1f} G; at the '
        f'measured fp32 matmul peak {peak / 1e9:.0f} GFLOP/s the floor is {sum(floor.values()):.2f} s '
        f'(rollout {floor["rollout"]:.2f}, update {floor["update"]:.2f}); ours is {sum(floor.values()) / total:.0%} '
        f'of it (rollout {floor["rollout"] / seconds["rollout"]:.0%}, update {floor["update"] / seconds["update"]:.0%})')
  if peer_seconds:
    theirs = statistics.median(peer_seconds)
    print(f'TRL {trl.__version__} RLOOTrainer, same run, alternating: {theirs:.2f} s/step (range '
          f'{min(peer_seconds):.2f}–{max(peer_seconds):.2f}, {len(peer_seconds)} steps); ours / TRL = '
          f'{total / theirs:.2f} (speed-up {theirs / total:.2f}×); TRL is {sum(floor.values()) / theirs:.0%} of the floor')


if __name__ == '__main__':
  main()
