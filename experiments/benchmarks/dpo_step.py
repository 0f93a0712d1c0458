"""One DPO step of the dpo stage with cached reference log-probs, beside TRL's DPOTrainer (docs/benchmarks.md).

    python experiments/benchmarks/dpo_step.py                  # 8 pairs of 32 + 64 + 64 tokens, bench
    python experiments/benchmarks/dpo_step.py --steps=3        # a quick check

(with luckystar installed, `pip install -e .`, or PYTHONPATH=. from the repository root)

The stage's own code, wired as `luckystar.stages.dpo.run` wires it: configs/dpo.py (sigmoid loss,
β = 0.1, no RPO term, AdamW with clipping and the non-finite guard) with init_from='random:<size>' and
batch_size=--pairs; the update is `step.make_update_fn(dpo.loss_fn, ..., denominator='pairs')`, one
jitted program: a forward and backward of the 2·pairs rows (chosen and rejected), the loss, the
optimizer. Each pair is --prompt_tokens random prompt tokens (loss mask 0) followed by a chosen and a
rejected reply of --reply_tokens random tokens each (mask 1), so every row has prompt + reply tokens
(`dpo.pair_batch`, no padding). The reference log-probs are computed once beforehand by
`dpo.compute_reference_logps` from the starting params and sit in the batch, as the stage's
cache puts them there: the timed step runs no reference model (TRL's `precompute_ref_log_probs`).
Reported: the one-off reference pass, the compile, and the medians of --steps update steps of each side
after --warmup (each blocks until its metrics are on the host), the sides alternating step by step.
Peers, on the same weights and batch in the same run: TRL's `DPOTrainer` (when installed, `pip install -e
".[bench]"`; `--peer=none` skips it) with `precompute_ref_log_probs` (the reference pass runs before training,
outside the timed steps), sigmoid loss, β = 0.1, fp32 on 2 torch threads, the pairs as token ids
(`sft_step.word_tokenizer`), no logging, saving or eval inside a step; TRL appends an EOS token to each reply,
one more token than ours. And the computation inside TRL's step in plain torch: a transformers
`Cohere2ForCausalLM` with our weights (`sft_step.hf_model`, torch AdamW), one forward of the 2·pairs rows,
summed response log-probs, the sigmoid loss against the same cached reference, backward, clipping, AdamW
(TRL's own overhead is not in it, so it is a lower bound on TRL's time). TRL's steps are timed by a callback;
between two of them the other sides take one step each.
"""

import argparse
import functools
import os
import pathlib
import tempfile
import time

import jax
import numpy as np

from luckystar import config as config_lib
from luckystar import model
from luckystar.model import sharding
from luckystar.stages import dpo
from luckystar.engine import optim
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib

import sft_step  # the same-run torch peer, built as the SFT benchmark builds it (this file's directory)

DPO_CONFIG = pathlib.Path(__file__).resolve().parents[2] / 'configs' / 'dpo.py'
GOAL_SECONDS = 0.3


def stage_config(size: str, pairs: int):
  """configs/dpo.py on a random model of `size`, `pairs` pairs per step, without the RPO term: plain
  DPO, as TRL's DPOTrainer runs by default (rpo_alpha=None)."""
  config = config_lib.from_file(DPO_CONFIG)
  config.init_from = f'random:{size}'
  config.batch_size = pairs
  config.dpo.sft_weight = 0.0
  return config


def synthetic_pairs(vocab_size: int, count: int, prompt_tokens: int, reply_tokens: int) -> list[dict]:
  """Pairs as the stage stores them: a shared random prompt, then a random chosen and rejected reply."""
  rng = np.random.default_rng(0)
  pairs = []
  for _ in range(count):
    prompt = rng.integers(4, vocab_size, prompt_tokens).tolist()
    mask = [0] * prompt_tokens + [1] * reply_tokens
    pairs.append({f'{side}_{feature}': value for side in dpo.SIDES for feature, value in (
        ('tokens', prompt + rng.integers(4, vocab_size, reply_tokens).tolist()), ('loss_mask', mask))})
  return pairs


def torch_step(config: model.ModelConfig, params, batch: dict[str, np.ndarray], beta: float):
  """One plain-torch DPO step (module docstring) on `batch` (`dpo.pair_batch`'s layout) per call."""
  import torch  # pylint: disable=g-import-not-at-top
  peer = sft_step.hf_model(config, params)
  optimizer = torch.optim.AdamW(peer.parameters(), lr=sft_step.OPTIMIZER['learning_rate'], betas=(0.9, 0.95),
                                weight_decay=sft_step.OPTIMIZER['weight_decay'])
  rows = {k: torch.from_numpy(np.array(v)).long() for k, v in dpo.flatten_pairs(
      {k: np.asarray(v) for k, v in batch.items() if k != 'reference_logps'}).items()}   # [2B, T]
  mask = rows['loss_mask'][:, 1:].float()
  reference = torch.from_numpy(np.asarray(batch['reference_logps']))                      # [B, 2]
  pairs = reference.shape[0]

  def step():
    logits = peer(input_ids=rows['tokens']).logits[:, :-1]
    logps = (torch.log_softmax(logits, -1).gather(-1, rows['tokens'][:, 1:, None])[..., 0] * mask).sum(-1)
    h = (logps[:pairs] - reference[:, 0]) - (logps[pairs:] - reference[:, 1])
    loss = -torch.nn.functional.logsigmoid(beta * h).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(peer.parameters(), sft_step.OPTIMIZER['max_grad_norm'])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

  return step


def trl_trainer(config: model.ModelConfig, params, pairs: list[dict], prompt_tokens: int, beta: float, steps: int,
                between, workdir: str):
  """TRL's DPOTrainer on `params` and `pairs` (module docstring); `between()` runs after each of its steps.
  Returns (trainer, list of its step seconds)."""
  import datasets  # pylint: disable=g-import-not-at-top
  import torch
  import trl
  torch.set_num_threads(2)
  records = {'prompt': [], 'chosen': [], 'rejected': []}
  for pair in pairs:
    records['prompt'].append(sft_step.as_words(pair['chosen_tokens'][:prompt_tokens]))
    for side in ('chosen', 'rejected'):
      records[side].append(sft_step.as_words(pair[f'{side}_tokens'][prompt_tokens:]))
  settings = trl.DPOConfig(
      output_dir=workdir, per_device_train_batch_size=len(pairs), gradient_accumulation_steps=1, beta=beta,
      loss_type=['sigmoid'], precompute_ref_log_probs=True, max_steps=steps, num_train_epochs=steps,
      learning_rate=sft_step.OPTIMIZER['learning_rate'], **sft_step.TRL_ARGS)
  timer, seconds = sft_step.timed_steps(between)
  trainer = trl.DPOTrainer(model=sft_step.hf_model(config, params), args=settings,
                           train_dataset=datasets.Dataset.from_dict(records),
                           processing_class=sft_step.word_tokenizer(config.vocab_size), callbacks=[timer])
  return trainer, seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--pairs', type=int, default=8)
  parser.add_argument('--prompt_tokens', type=int, default=32)
  parser.add_argument('--reply_tokens', type=int, default=64, help='tokens of each of the chosen and rejected replies')
  parser.add_argument('--size', default='bench')
  parser.add_argument('--steps', type=int, default=5, help='timed steps of each side (medians reported)')
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--no_torch', action='store_true', help='skip the same-run torch peer')
  parser.add_argument('--peer', default='trl', choices=('trl', 'none'))
  args = parser.parse_args()

  config = stage_config(args.size, args.pairs)
  settings = config.dpo
  # As dpo.run builds them.
  model_config, params, *_ = state_lib.initial_model(config.init_from)
  mesh = sharding.make_mesh(dict(config.mesh))
  optimizer = optim.make(config)
  state = state_lib.create(model_config, optimizer, mesh, seed=config.seed, params=params)
  pairs = synthetic_pairs(model_config.vocab_size, args.pairs, args.prompt_tokens, args.reply_tokens)
  start = time.perf_counter()
  reference = dpo.compute_reference_logps(model_config, state.params, pairs, mesh=mesh, batch_size=args.pairs,
                                          length_multiple=settings.length_multiple)
  reference_seconds = time.perf_counter() - start
  loss = functools.partial(dpo.loss_fn, model_config=model_config, beta=settings.beta, loss_type=settings.loss_type,
                           label_smoothing=settings.label_smoothing, sft_weight=settings.sft_weight)
  update_fn = step_lib.make_update_fn(loss, optimizer, step_lib.state_shardings_of(state), mesh=mesh,
                                      learning_rate=optim.learning_rate_schedule(config),
                                      grad_accum_steps=config.grad_accum_steps, denominator='pairs')
  host_batch = dpo.pair_batch(pairs, range(args.pairs), reference, length_multiple=settings.length_multiple)
  batch = update_fn.put_batch(host_batch)
  rng = jax.device_put(jax.random.key(0), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  start = time.perf_counter()
  compiled = update_fn.lower(state, batch, rng).compile()
  compile_seconds = time.perf_counter() - start

  def ours():
    nonlocal state, metrics
    state, metrics = compiled(state, batch, rng)
    metrics = jax.device_get(metrics)

  metrics = None
  runs = {'ours': ours}
  if not args.no_torch:
    runs['torch'] = torch_step(model_config, state.params, host_batch, settings.beta)
  times = sft_step.alternate(runs, 0, args.warmup)   # warm-up only
  peer = args.peer
  if peer == 'trl':
    try:
      import trl  # pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      print('TRL is not installed (pip install -e ".[bench]"): no TRL peer this run')
      peer = 'none'
  peer_seconds = []
  if peer == 'trl':
    def between():   # after TRL's warm-up step, one step of each other side per TRL step
      if len(peer_seconds) > 1:
        for name, run in runs.items():
          times[name].append(sft_step._timed(run))  # pylint: disable=protected-access

    with tempfile.TemporaryDirectory() as workdir:
      trainer, peer_seconds = trl_trainer(model_config, state.params, pairs, args.prompt_tokens, settings.beta,
                                          args.steps + 1, between, workdir)
      trainer.train()
    peer_seconds = peer_seconds[1:]
  else:
    times = sft_step.alternate(runs, args.steps, 0)
  seconds = float(np.median(times['ours']))

  rows, length = 2 * args.pairs, args.prompt_tokens + args.reply_tokens
  print(f'devices: {jax.device_count()} × {jax.devices()[0].device_kind}, {os.cpu_count()} CPU cores '
        f'({len(os.sched_getaffinity(0))} usable); jax {jax.__version__}; {args.size} model '
        f'{model.param_count(model_config) / 1e6:.2f}M params, {model_config.dtype}')
  print(f'shape: {args.pairs} pairs × ({args.prompt_tokens} prompt + {args.reply_tokens} chosen + '
        f'{args.reply_tokens} rejected tokens) = batch {tuple(batch["tokens"].shape)}, {rows} rows × {length} tokens')
  print(f'reference log-probs, once (compile + forward): {reference_seconds:.2f} s; update compile: '
        f'{compile_seconds:.2f} s')
  print(f'last step: loss {metrics["train/loss"]:.4f}, rewards/margins {metrics["train/rewards/margins"]:.4f} '
        f'(after {args.warmup + args.steps} updates on the same batch)\n')
  spread = lambda t: f'median of {len(t)}; range {min(t):.3f}–{max(t):.3f} s'
  print(f'ours (luckystar dpo, cached reference): {seconds:.3f} s/step  {spread(times["ours"])}; '
        f'{rows * length / seconds:.0f} tokens/s')
  if 'torch' in times:
    torch_seconds = float(np.median(times['torch']))
    print(f'plain torch DPO step, same run (TRL minus its overhead): {torch_seconds:.3f} s/step  '
          f'{spread(times["torch"])}; ours / torch = {seconds / torch_seconds:.2f} (speed-up '
          f'{torch_seconds / seconds:.2f}×)')
  if peer_seconds:
    theirs = float(np.median(peer_seconds))
    print(f'TRL {trl.__version__} DPOTrainer, same run (cached reference): {theirs:.3f} s/step  '
          f'{spread(peer_seconds)}; ours / TRL = {seconds / theirs:.2f} (speed-up {theirs / seconds:.2f}×)')
  print(f'Goal: ≤ {GOAL_SECONDS} s/step (docs/benchmarks.md). A shared CPU slows every figure.')


if __name__ == '__main__':
  main()
