"""Our jitted KV-cache sampler vs `transformers.generate` on identical weights (docs/benchmarks.md).

    python experiments/benchmarks/sampler.py [--batch_sizes=16,64] [--new_tokens=128] [--repeats=3]

A random transformers `Cohere2ForCausalLM` of the `bench` shape (vocab 8000, hidden 256, MLP 1024,
4 layers, 4 heads, 1 KV head, window 64, 3 sliding + 1 full) is saved and loaded back with
`luckystar.load`; both sides then greedy-decode `new_tokens` tokens after the same 32-token
prompts, no early stop. Each side is warmed up (ours: compiled) before timing; the best of
`repeats` runs counts. Prints tokens/s of each, the ratio ours/theirs, and how many rows agree
token for token (greedy on a random model: a near-tie can flip late tokens, so this is a sanity
check, not a parity test; tests/test_model_parity.py is that).
Goal (docs/benchmarks.md): ours >= 3x theirs at batch 16 and 64; theirs ≈ 2,800 tok/s at batch 16 on 2 cores.

    python experiments/benchmarks/sampler.py --batch_sizes=16 --breakdown   # where the time goes

--breakdown adds, per batch size, each side's parts timed alone (best of `repeats`): the prefill
(ours: jitted `model.prefill` of the prompts into a cache of prompt + new_tokens columns; theirs:
one forward over the prompts with use_cache) and the decode step (ours: a jitted `model.decode` of
one token per row, its cache donated as in the sampler's loop; theirs: one forward of one token
with past_key_values), the step timed as a chain of new_tokens - 1 calls on one cache (as many as a
run makes) divided by their number. Prints ms of each, each decode step's achieved GFLOP/s (model
FLOPs: 2 · params · batch + attention 4 · heads · head_dim · attended keys · layers · batch), and
the ms of each whole run outside prefill + (new_tokens - 1) decode steps: the loop, sampling and
bookkeeping (ours: the jitted while_loop; theirs: `generate`). It can come out negative: a loop
saves the per-call dispatch that the separately timed steps pay, and a shared CPU adds noise.
"""

import argparse
import inspect
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

import luckystar
from luckystar import model as model_lib
from luckystar import sampling

PROMPT_LENGTH = 32
# transformers renamed the forward's `past_key_values` (and the output's) to `cache` within 5.x
CACHE_ARGUMENT = ('cache' if 'cache' in inspect.signature(transformers.Cohere2ForCausalLM.forward).parameters
                  else 'past_key_values')


def build_hf_model(seed: int = 0) -> transformers.Cohere2ForCausalLM:
  bench = model_lib.get('bench')
  config = transformers.Cohere2Config(
      vocab_size=bench.vocab_size, hidden_size=bench.hidden_size, intermediate_size=bench.intermediate_size,
      num_hidden_layers=bench.num_layers, num_attention_heads=bench.num_heads,
      num_key_value_heads=bench.num_kv_heads, sliding_window=bench.sliding_window,
      layer_types=list(bench.layer_types), max_position_embeddings=bench.max_position_embeddings,
      pad_token_id=0, bos_token_id=2, eos_token_id=3)
  torch.manual_seed(seed)
  return transformers.Cohere2ForCausalLM(config).eval()


def best_seconds(run, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return min(times)


def decode_step_flops(config: model_lib.ModelConfig, batch: int, first_length: int, steps: int) -> float:
  """Mean model FLOPs of one decode step over `steps` steps whose first token makes the row first_length long:
  2 · params per token (tied LM head counted once, the lookup free) + QKᵀ and PV over the attended keys."""
  lengths = np.arange(first_length, first_length + steps)
  keys = sum(np.minimum(lengths, config.sliding_window).mean() if kind == model_lib.SLIDING else lengths.mean()
             for kind in config.layer_types)
  return batch * (2 * model_lib.param_count(config) + 4 * config.num_heads * config.head_dim * keys)


def ours_breakdown(ours, prompts: np.ndarray, new_tokens: int, repeats: int) -> dict[str, float]:
  """Seconds of our prefill and of one decode step (the mean of a chain as long as a run's)."""
  config, params = ours.config, ours.params
  tokens, lengths = (jnp.asarray(a) for a in sampling.right_pad(prompts.tolist()))
  max_length = tokens.shape[1] + new_tokens
  prefill = jax.jit(model_lib.prefill, static_argnums=(0, 4))
  decode = jax.jit(model_lib.decode, static_argnums=0, donate_argnums=3)  # in place, as in the while_loop
  next_tokens = jnp.full((tokens.shape[0], 1), 16, jnp.int32)  # [B, 1]; the cost does not depend on the ids
  steps = max(new_tokens - 1, 1)

  def decode_chain(cache):
    for _ in range(steps):
      logits, cache = decode(config, params, next_tokens, cache)
    jax.block_until_ready(logits)

  jax.block_until_ready(prefill(config, params, tokens, lengths, max_length))  # compiles
  decode_chain(prefill(config, params, tokens, lengths, max_length)[1])     # compiles
  caches = [jax.block_until_ready(prefill(config, params, tokens, lengths, max_length)[1]) for _ in range(repeats)]
  return {'prefill': best_seconds(lambda: jax.block_until_ready(prefill(config, params, tokens, lengths, max_length)),
                                  repeats),
          'decode step': best_seconds(lambda: decode_chain(caches.pop()), repeats) / steps}


def theirs_breakdown(hf_model, prompts: np.ndarray, new_tokens: int, repeats: int) -> dict[str, float]:
  """Seconds of transformers' forward over the prompts and of one forward of one token with past_key_values."""
  input_ids = torch.tensor(prompts)
  next_tokens = torch.full((prompts.shape[0], 1), 16, dtype=torch.long)
  steps = max(new_tokens - 1, 1)

  def prefill():
    return getattr(hf_model(input_ids=input_ids, use_cache=True), CACHE_ARGUMENT)

  def decode_chain(cache):
    for _ in range(steps):
      hf_model(input_ids=next_tokens, use_cache=True, **{CACHE_ARGUMENT: cache})  # appends to cache in place

  with torch.no_grad():
    decode_chain(prefill())  # warm-up
    caches = [prefill() for _ in range(repeats)]
    return {'prefill': best_seconds(prefill, repeats),
            'decode step': best_seconds(lambda: decode_chain(caches.pop()), repeats) / steps}


def print_breakdown(config: model_lib.ModelConfig, batch: int, new_tokens: int, ours_parts: dict[str, float],
                    theirs_parts: dict[str, float], ours_s: float, theirs_s: float):
  steps = max(new_tokens - 1, 1)
  flops = decode_step_flops(config, batch, PROMPT_LENGTH + 1, steps)
  for name, parts, whole in (('ours', ours_parts, ours_s), ('transformers', theirs_parts, theirs_s)):
    outside = whole - parts['prefill'] - (new_tokens - 1) * parts['decode step']
    print(f'  {name:<12} prefill {parts["prefill"] * 1e3:8.2f} ms; decode step {parts["decode step"] * 1e3:7.3f} ms '
          f'({flops / parts["decode step"] / 1e9:.1f} GFLOP/s); outside prefill + {new_tokens - 1} steps: '
          f'{outside * 1e3:8.2f} ms of {whole * 1e3:.2f} ms')
  print(f'  decode step theirs / ours: {theirs_parts["decode step"] / ours_parts["decode step"]:.2f}x; '
        f'prefill theirs / ours: {theirs_parts["prefill"] / ours_parts["prefill"]:.2f}x')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--batch_sizes', default='16,64')
  parser.add_argument('--new_tokens', type=int, default=128)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--breakdown', action='store_true',
                      help='also time prefill and one decode step of each side alone; see the docstring')
  args = parser.parse_args()

  hf_model = build_hf_model()
  with tempfile.TemporaryDirectory() as directory:
    hf_model.save_pretrained(directory)
    ours = luckystar.load(directory)
  bench = model_lib.get('bench')
  assert model_lib.param_count(ours.config) == model_lib.param_count(bench), f'loaded {ours.config}, not bench'
  print(f'bench model: {model_lib.param_count(ours.config):,} params; jax {jax.__version__} on '
        f'{jax.devices()[0].platform}, torch {torch.__version__} with {torch.get_num_threads()} threads')

  summary = []
  for batch in map(int, args.batch_sizes.split(',')):
    prompts = np.random.default_rng(batch).integers(16, ours.config.vocab_size, (batch, PROMPT_LENGTH))

    def ours_run():
      out = sampling.sample(ours.config, ours.params, prompts.tolist(), rng=jax.random.key(0),
                            max_new_tokens=args.new_tokens, settings=sampling.SamplingSettings(temperature=0.0))
      return jax.block_until_ready(out)

    def theirs_run(new_tokens=args.new_tokens):
      with torch.no_grad():
        return hf_model.generate(torch.tensor(prompts), attention_mask=torch.ones(prompts.shape, dtype=torch.long),
                                 do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 pad_token_id=0)

    ours_tokens = np.asarray(ours_run().tokens)  # compiles
    theirs_tokens = theirs_run(4)                # warm-up
    theirs_tokens = theirs_run()[:, PROMPT_LENGTH:].numpy()
    ours_s, theirs_s = best_seconds(ours_run, args.repeats), best_seconds(theirs_run, args.repeats)
    generated = batch * args.new_tokens
    ours_rate, theirs_rate = generated / ours_s, generated / theirs_s
    rows_equal = int((ours_tokens == theirs_tokens).all(axis=1).sum())
    first_equal = float((ours_tokens[:, 0] == theirs_tokens[:, 0]).mean())
    print(f'batch {batch:3d}: ours {ours_rate:9,.0f} tok/s ({ours_s:.3f} s), transformers {theirs_rate:9,.0f} tok/s '
          f'({theirs_s:.3f} s), ratio {ours_rate / theirs_rate:.2f}x; rows equal {rows_equal}/{batch}, '
          f'first tokens equal {first_equal:.0%}')
    if args.breakdown:
      print_breakdown(ours.config, batch, args.new_tokens, ours_breakdown(ours, prompts, args.new_tokens, args.repeats),
                      theirs_breakdown(hf_model, prompts, args.new_tokens, args.repeats), ours_s, theirs_s)
    summary.append(f'b{batch} {ours_rate / theirs_rate:.2f}x ({ours_rate:,.0f} vs {theirs_rate:,.0f} tok/s)')
  print(f'sampler vs transformers.generate, greedy {args.new_tokens} new tokens: ' + '; '.join(summary))


if __name__ == '__main__':
  main()
