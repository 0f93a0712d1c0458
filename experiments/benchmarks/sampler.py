"""Our jitted KV-cache sampler vs `transformers.generate` on identical weights (DESIGN §9).

    python experiments/benchmarks/sampler.py [--batch_sizes=16,64] [--new_tokens=128] [--repeats=3]

A random transformers `Cohere2ForCausalLM` of the `bench` shape (vocab 8000, hidden 256, MLP 1024,
4 layers, 4 heads, 1 KV head, window 64, 3 sliding + 1 full) is saved and loaded back with
`luckystar.load`; both sides then greedy-decode `new_tokens` tokens after the same 32-token
prompts, no early stop. Each side is warmed up (ours: compiled) before timing; the best of
`repeats` runs counts. Prints tokens/s of each, the ratio ours/theirs, and how many rows agree
token for token (greedy on a random model: a near-tie can flip late tokens, so this is a sanity
check, not a parity test; tests/test_model_parity.py is that).
Goal (DESIGN §9): ours >= 3x theirs at batch 16 and 64; theirs ≈ 2,800 tok/s at batch 16 on 2 cores.
"""

import argparse
import tempfile
import time

import jax
import numpy as np
import torch
import transformers

import luckystar
from luckystar import model as model_lib
from luckystar import sampling

PROMPT_LENGTH = 32


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


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--batch_sizes', default='16,64')
  parser.add_argument('--new_tokens', type=int, default=128)
  parser.add_argument('--repeats', type=int, default=3)
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
                            max_new_tokens=args.new_tokens, temperature=0.0)
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
    summary.append(f'b{batch} {ours_rate / theirs_rate:.2f}x ({ours_rate:,.0f} vs {theirs_rate:,.0f} tok/s)')
  print(f'sampler vs transformers.generate, greedy {args.new_tokens} new tokens: ' + '; '.join(summary))


if __name__ == '__main__':
  main()
