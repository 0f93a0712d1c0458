"""The `quantize` stage: AQT int4 CONVERT of `config.init_from`, before/after quality, int4 export.

    python -m luckystar.main --config=configs/quantize.py --workdir=runs/quantize

metrics.jsonl: step 0 is the float model, step 1 the int4 (SERVE) model, with the same names:
`eval/loss` and `eval/accuracy` (held-out conversations, assistant tokens), and with
`quantize.task_eval.per_task_language` > 0 the held-out task metrics of `luckystar.engine.evals`
(greedy, both modes). Step 1 adds `quant/logits_max_rel_diff` (int4 vs float on the held-out rows),
`quant/linear_bytes` and `quant/linear_bytes_ratio` (int4 values + scales over bf16).
With `quantize.export`, writes DIR/hf_int4 (compressed-tensors pack-quantized, `Model.save_hf(...,
quantization='int4')`), which `luckystar.load` and transformers/vLLM read.
"""

import functools
import json
import math
import pathlib

import jax
import numpy as np

from luckystar import errors
from luckystar.data import conversations
from luckystar.engine import evals, logprobs
from luckystar.engine import metrics as metrics_lib
from luckystar.engine import state as state_lib
from luckystar.model import sharding
from luckystar.quant import quantize

SUMMARY_FILE = 'quantize_summary.json'
# Printed float → int4 at the end (metrics.jsonl steps 0 and 1), then the int4 linears' size over bf16.
SUMMARY_KEYS = ('eval/loss', 'eval/accuracy', 'eval/correctness', 'eval/concise/correctness',
                'quant/linear_bytes_ratio', 'quant/logits_max_rel_diff')


def linear_bytes(config, params) -> tuple[int, int]:
  """(bytes of the quantized linears' int values + scales as exported, bytes of the same linears in bf16)."""
  scale_bytes = np.dtype(jax.numpy.dtype(config.quant.scale_dtype)).itemsize
  stored, bf16 = 0, 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    if not quantize.is_quantized_leaf(path):
      continue
    if jax.tree_util.keystr(path).endswith("['value']"):
      stored += math.ceil(leaf.size * config.quant.bits / 8)
      bf16 += 2 * leaf.size
    else:
      stored += scale_bytes * leaf.size
  return stored, bf16


def heldout_metrics(model_config, params, batches) -> dict[str, float]:
  """eval/loss and eval/accuracy over every trained token of the held-out batches (SFT's eval)."""
  loss = functools.partial(logprobs.token_cross_entropy, model_config=model_config)
  return evals.make_eval_fn(loss, batches, sharding.make_mesh())(params, 0)


def run(config, workdir: str) -> None:
  settings = config.quantize
  float_model = state_lib.load_model(config)
  tokenizer = float_model.tokenizer
  try:
    int4_model = float_model.quantize(group_size=settings.group_size, scale_dtype=settings.scale_dtype,
                                      bits=settings.bits)
  except ValueError as e:
    raise errors.UserError(f'config.quantize: {e}') from None

  heldout, _ = conversations.sft_sources(tokenizer, seed=config.seed, split='heldout')  # both modes
  batches = evals.heldout_batches(evals.eval_subset(heldout, settings.eval_examples_per_source, config.seed),
                                seq_len=settings.seq_len, batch_size=config.batch_size)
  task_settings = evals.Settings.from_config(settings.task_eval)
  rows = []
  for model in (float_model, int4_model):
    row = heldout_metrics(model.config, model.params, batches)
    if task_settings.per_task_language:
      row.update(evals.evaluate(model.config, model.params, tokenizer, task_settings))
    rows.append({name: float(value) for name, value in row.items()})
  float_logits = float_model.logits(batches[0]['tokens'])
  int4_logits = int4_model.logits(batches[0]['tokens'])
  stored, bf16 = linear_bytes(int4_model.config, int4_model.params)
  rows[1].update({'quant/logits_max_rel_diff': float(np.abs(int4_logits - float_logits).max()
                                                     / np.abs(float_logits).max()),
                  'quant/linear_bytes': stored, 'quant/linear_bytes_ratio': stored / bf16})

  writer = metrics_lib.Writer(workdir)
  for step, row in enumerate(rows):
    writer.write(step, row)
  writer.close()
  workdir = pathlib.Path(workdir)
  outputs = [('summary', workdir.absolute() / SUMMARY_FILE)]
  if settings.export:
    out = workdir / 'hf_int4'
    if not out.exists():  # re-running on the same workdir keeps the first export
      int4_model.save_hf(out, dtype=settings.scale_dtype, quantization='int4')
    outputs.append(('int4 model', out.absolute()))
  summary = {'float': rows[0], 'int4': rows[1], 'quantize': settings.to_dict()}
  (workdir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + '\n')
  metrics_lib.summarize(workdir, SUMMARY_KEYS, title=f'quantize: {config.init_from}, float → int{settings.bits}',
                        outputs=outputs, labels=('float', f'int{settings.bits}'))
