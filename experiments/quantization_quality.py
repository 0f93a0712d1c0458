"""Full precision vs AQT int4 (group-wise and per-channel) on a bundled model: docs/int4_and_export.md's table.

    python experiments/quantization_quality.py                  # tiny-sft, 64 held-out prompts per task × language
    python experiments/quantization_quality.py --model=tiny-base --per_task_language=16

(with luckystar installed, `pip install -e .`, or PYTHONPATH=. from the repository root)

The float model is `luckystar.load(--model)` in fp32; each int4 variant is `Model.quantize(group_size=g)`
(CONVERT, scales rounded to bf16, then SERVE from the int values). Every variant gets the same held-out
figures: perplexity of the held-out SFT conversations of both modes (exp of the mean token NLL on assistant
tokens, `quant.run.heldout_metrics`), and greedy held-out correctness per task and language in both modes
(`luckystar.engine.evals.evaluate`). Writes `experiments/quantization_quality.md` (the table docs/int4_and_export.md
quotes) and prints it. About 10 minutes on 2 CPU cores for tiny-sft at 64 prompts per task × language.
"""

import argparse
import math
import pathlib
import time

import luckystar
from luckystar.data import conversations
from luckystar.engine import evals
from luckystar.stages import quantize as quant_run

ROOT = pathlib.Path(__file__).resolve().parents[1]
REPORT = ROOT / 'experiments' / 'quantization_quality.md'
VARIANTS = (('fp32', None), ('int4, group 128', 128), ('int4, per channel', 0))
HELDOUT_CONVERSATIONS = 64   # per mode, for perplexity
SEQ_LEN = 512


def measure(model, batches, settings: evals.Settings) -> dict[str, float]:
  metrics = quant_run.heldout_metrics(model.config, model.params, batches)
  metrics['eval/perplexity'] = math.exp(metrics['eval/loss'])
  metrics.update(evals.evaluate(model.config, model.params, model.tokenizer, settings))
  return metrics


def table(name: str, results: dict[str, dict[str, float]], settings: evals.Settings) -> str:
  labels = list(results)
  lines = [f'`{name}`, held-out split; correctness (%) is greedy on the first {settings.per_task_language} '
           'prompts per task and language; perplexity over the assistant tokens of '
           f'{HELDOUT_CONVERSATIONS} held-out conversations per mode.', '',
           '| metric | ' + ' | '.join(labels) + ' |', '|---|' + '---|' * len(labels)]
  lines.append('| perplexity | ' + ' | '.join(f'{results[l]["eval/perplexity"]:.3f}' for l in labels) + ' |')
  lines.append('| next-token accuracy (%) | ' + ' | '.join(f'{100 * results[l]["eval/accuracy"]:.2f}'
                                                         for l in labels) + ' |')
  first = results[labels[0]]
  keys = sorted(k for k in first if k.startswith('eval/') and '/correctness' in k and k.count('/') >= 3)
  for mode in settings.modes:
    lines.append(f'| **{mode}: all tasks** | ' + ' | '.join(
        f'{100 * results[l][f"eval/{mode}/correctness"]:.1f}' for l in labels) + ' |')
    for key in keys:
      task = key.rsplit('/', 1)[1]
      if key.startswith(f'eval/{mode}/correctness/') and key.count('/') == 3 and task in settings.tasks:
        lines.append(f'| {mode}: {task} | ' + ' | '.join(f'{100 * results[l].get(key, float("nan")):.1f}'
                                                         for l in labels) + ' |')
  return '\n'.join(lines) + '\n'


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', default='tiny-sft')
  parser.add_argument('--per_task_language', type=int, default=64)
  parser.add_argument('--output', default=str(REPORT))
  args = parser.parse_args()

  float_model = luckystar.load(args.model)
  heldout, _ = conversations.sft_sources(float_model.tokenizer, split='heldout')
  batches = evals.heldout_batches(evals.eval_subset(heldout, HELDOUT_CONVERSATIONS, seed=0), seq_len=SEQ_LEN,
                                batch_size=8)
  settings = evals.Settings(per_task_language=args.per_task_language, max_new_tokens=192, batch_size=64)
  results = {}
  for label, group_size in VARIANTS:
    model = float_model if group_size is None else float_model.quantize(group_size=group_size)
    start = time.time()
    results[label] = measure(model, batches, settings)
    print(f'{label}: measured in {time.time() - start:.0f} s', flush=True)
  report = table(args.model, results, settings)
  pathlib.Path(args.output).write_text(f'# {args.model}: fp32 vs AQT int4\n\n'
                                       f'Written by `python experiments/quantization_quality.py --model={args.model}`.'
                                       f'\n\n{report}', encoding='utf-8')
  print(report)


if __name__ == '__main__':
  main()
