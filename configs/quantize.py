"""AQT int4 weight-only quantization of `tiny-sft` and its compressed-tensors export (docs/int4_and_export.md).

    python -m luckystar.main --config=configs/quantize.py --workdir=/tmp/luckystar-quantize
    python -m luckystar.main --config=configs/quantize.py:per_channel --workdir=/tmp/luckystar-quantize-pc
    python -m luckystar.main --config=configs/quantize.py:smoke --workdir=/tmp/luckystar-quantize-smoke

Symmetric int4 weights (values in [-7, 7]) with one scale per `group_size` input features (0: per
output channel), scales rounded to `scale_dtype` (the export dtype); the tied embedding stays float.
metrics.jsonl: step 0 = float, step 1 = int4, same `eval/*` names, plus `quant/*` at step 1;
DIR/hf_int4 is the int4 checkpoint for transformers / vLLM (`luckystar.load` reads it back).
Quantization-aware fine-tuning: any stage's model config with `luckystar.quant.with_quant(config,
'train', group_size=...)` trains through AQT's fake quant (gradients straight through).
"""

import ml_collections

from luckystar import config as config_lib


def get_config(arg=None):
  config = config_lib.base('quantize')
  config.init_from = 'tiny-sft'         # bundled name, run directory, HF directory, or 'random:<size>'
  config.batch_size = 8                 # held-out rows per eval batch
  config.quantize.bits = 4
  config.quantize.group_size = 128      # 0: per output channel
  config.quantize.scale_dtype = 'bfloat16'
  config.quantize.export = True         # write DIR/hf_int4
  config.quantize.seq_len = 512
  config.quantize.eval_examples_per_source = 32   # held-out SFT conversations per mode for eval/loss
  # Held-out task correctness (luckystar.engine.evals.Settings), float vs int4; 0 = skip (it is the slow part).
  config.quantize.task_eval = ml_collections.ConfigDict(dict(per_task_language=0, max_new_tokens=160,
                                                             batch_size=40))

  if arg == 'per_channel':
    config.quantize.group_size = 0
  elif arg == 'smoke':  # a random tiny model, a few held-out rows, no task eval: the stage end to end
    config.init_from = 'random:tiny'
    config.quantize.seq_len = 128
    config.quantize.eval_examples_per_source = 2
    config.batch_size = 2
  elif arg:
    raise ValueError(f'unknown variant configs/quantize.py:{arg}; expected configs/quantize.py, '
                     'configs/quantize.py:per_channel or configs/quantize.py:smoke')
  return config
