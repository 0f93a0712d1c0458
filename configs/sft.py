"""Hybrid SFT of the bundled `tiny-base` into `tiny-sft` (docs/training.md, paper §2.2).

    python -m luckystar.main --config=configs/sft.py --workdir=/tmp/luckystar-sft
    python -m luckystar.main --config=configs/sft.py:smoke --workdir=/tmp/luckystar-sft-smoke
    python -m luckystar.main --config=configs/sft.py:teacher --workdir=/tmp/luckystar-teacher   # the RS teacher

80% reasoning-mode / 20% concise-mode conversations (`luckystar.data.conversations.sft_sources`),
packed into rows of `sft.seq_len` tokens, loss on assistant tokens only. Re-running the same
command on the same workdir resumes. Writes metrics.jsonl, TensorBoard events, plots/summary.png and
checkpoints/ (loadable as `init_from` of the next stage).
Expected on 2 CPU cores: ≈ 33 min; held-out reasoning-mode math 6% → ~100% (experiments/notes.md).

`:base` makes `tiny-base` from random init (≈ 60 min).
`python experiments/bundled_models.py tiny-base tiny-sft` runs both and exports them.
`:smoke` (tests; ~35 s on 2 busy cores, mostly compiling): a random `tiny` model on a synthetic
reverse-the-prompt task, 4 steps, a checkpoint every 2.
"""

import ml_collections

from luckystar import config as config_lib


def get_config(arg=None):
  config = config_lib.base('sft')
  config.init_from = 'tiny-base'      # or 'random:<size>' for a random init of a named size
  config.total_steps = 1200
  config.batch_size = 8                # global rows per step (all processes together)
  config.learning_rate = 1e-3          # peak; linear warmup, then cosine to 0 at total_steps
  config.warmup_steps = 40
  config.weight_decay = 0.1            # not on LayerNorm weights
  config.log_every = 10
  config.eval_every = 600
  config.checkpoint_every = 100
  # FORMAT:PATH[@WEIGHT] items (docs/data.md): the hybrid conversations, 80% reasoning / 20% concise. Add your own
  # with e.g. ',chat_jsonl:/data/chats.jsonl@0.3' or the RS traces with ',rs_traces:/tmp/luckystar-rs/rs_traces.jsonl@0.1'.
  config.sft.sources = 'bundled:conversations/reasoning@0.8,bundled:conversations/concise@0.2'
  config.sft.eval_sources = ''          # held-out eval/loss data; '' = the held-out split of the bundled sources
  config.sft.seq_len = 512
  config.sft.eval_examples_per_source = 64   # held-out conversations per source for eval/loss; 0: no eval
  config.sft.thinking_language = 'en'   # 'ko': Korean prompts think in Korean (the paper's Table 1 ablation)
  config.sft.chat_tool_fraction = 0.3   # reasoning chat arithmetic that calls the calculator (the rest answers)
  # Held-out task correctness (luckystar.engine.evals.Settings): greedy, both modes, per task and language.
  config.sft.task_eval = ml_collections.ConfigDict(dict(per_task_language=8, max_new_tokens=160, batch_size=40))

  if arg == 'base':  # `tiny-base`, from random init: concise chat, Korean MC, math answers, plain text
    config.init_from = 'random:tiny'
    config.total_steps = 2400             # Korean MC's option-letter lookup appears late (at chance at 1000)
    config.batch_size = 8
    config.learning_rate = 2e-3
    config.warmup_steps = 60
    config.eval_every = 600
    config.checkpoint_every = 200
    config.sft.sources = 'bundled:base'   # chat 0.35, korean_mc 0.45, math 0.1, text 0.1
    config.sft.eval_examples_per_source = 32
    config.sft.task_eval.per_task_language = 0   # the bundling script evaluates the result
  elif arg == 'teacher':  # the rejection-sampling teacher (docs/rl.md): tiny-base on the teacher's data only
    # The teacher split plus `nl2sql.teacher_suite` (32 mixed-wording and 16 training-wording databases per
    # domain): ~4000 reasoning and ~960 concise conversations. Every layer sees the whole 512-token row: a query
    # names tables and columns from the schema and values from the question, 60-250 tokens back, beyond
    # `tiny`'s 64-token window (only 1 layer in 4 is global there). ~33 min on 2 CPU cores.
    config.init_from = 'tiny-base'
    config.model_overrides = ml_collections.ConfigDict(dict(sliding_window=512))
    config.total_steps = 800
    config.batch_size = 8
    config.learning_rate = 1e-3
    config.warmup_steps = 20
    config.eval_every = 0
    config.checkpoint_every = 100
    config.sft.sources = 'bundled:teacher'
    config.sft.eval_examples_per_source = 16     # held-out conversations of the teacher's tasks, NL2SQL included
    config.sft.task_eval.per_task_language = 0   # the rejection_sampling stage's pass@1/pass@N judge it
  elif arg == 'smoke':
    config.init_from = 'random:tiny'
    config.total_steps = 4
    config.batch_size = 4
    config.learning_rate = 1e-3
    config.warmup_steps = 2
    config.log_every = 1
    config.eval_every = 2
    config.checkpoint_every = 2
    config.sft.sources = 'bundled:synthetic'
    config.sft.seq_len = 64
    config.sft.eval_examples_per_source = 8
    config.sft.task_eval.per_task_language = 0   # synthetic tokens: no chat template to evaluate
  elif arg:
    raise ValueError(f'unknown variant configs/sft.py:{arg}; expected configs/sft.py, configs/sft.py:base, '
                     'configs/sft.py:teacher or configs/sft.py:smoke')
  return config
