"""Hybrid SFT of the bundled `tiny-base` into `tiny-sft` (DESIGN §5, paper §2.2).

    python -m luckystar.main --config=configs/sft.py --workdir=/tmp/luckystar-sft
    python -m luckystar.main --config=configs/sft.py:smoke --workdir=/tmp/luckystar-sft-smoke

80% reasoning-mode / 20% concise-mode conversations (`luckystar.data.conversations.sft_sources`),
packed into rows of `sft.seq_len` tokens, loss on assistant tokens only. Re-running the same
command on the same workdir resumes. Writes metrics.jsonl, TensorBoard events, plots/*.png and
checkpoints/ (loadable as `init_from` of the next stage). Until the bundled `tiny-base` exists, add
`--config.init_from=random:tiny`.
Expected on 2 CPU cores: TODO(real numbers once `tiny-base` ships) — ~N min; train/loss from ≈ A to B,
eval/loss (held-out conversations) from C to D.

`:smoke` (tests; ~35 s on 2 busy cores, mostly compiling): a random `tiny` model on a synthetic
reverse-the-prompt task, 4 steps, a checkpoint every 2.
"""

import ml_collections

from luckystar import config as config_lib


def get_config(arg=None):
  config = config_lib.base('sft')
  config.init_from = 'tiny-base'      # or 'random:<size>' for a random init of a named size
  config.total_steps = 2000
  config.batch_size = 16               # global rows per step (all processes together)
  config.learning_rate = 3e-4          # peak; linear warmup, then cosine to 0 at total_steps
  config.warmup_steps = 100
  config.weight_decay = 0.1            # not on LayerNorm weights
  config.log_every = 10
  config.eval_every = 200
  config.checkpoint_every = 200
  config.sft.data = 'conversations'    # or 'synthetic' (a tiny learnable task, no tokenizer)
  config.sft.seq_len = 512
  config.sft.mixture = ml_collections.ConfigDict(dict(reasoning=0.8, concise=0.2))
  config.sft.eval_examples_per_source = 64   # held-out conversations per source for eval/loss; 0: no eval
  # Held-out task correctness (luckystar.evals.core.Settings): greedy, both modes, per task and language.
  config.sft.task_eval = ml_collections.ConfigDict(dict(per_task_language=16, max_new_tokens=160, batch_size=32))

  if arg == 'smoke':
    config.init_from = 'random:tiny'
    config.total_steps = 4
    config.batch_size = 4
    config.learning_rate = 1e-3
    config.warmup_steps = 2
    config.log_every = 1
    config.eval_every = 2
    config.checkpoint_every = 2
    config.sft.data = 'synthetic'
    config.sft.seq_len = 64
    config.sft.eval_examples_per_source = 8
    config.sft.task_eval.per_task_language = 0   # synthetic tokens: no chat template to evaluate
  elif arg:
    raise ValueError(f'unknown variant configs/sft.py:{arg}; expected configs/sft.py or configs/sft.py:smoke')
  return config
