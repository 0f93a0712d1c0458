"""Rejection sampling from the teacher: the cold-start SFT data (docs/rl.md, paper §2.3).

    python -m luckystar.main --config=configs/sft.py:teacher --workdir=/tmp/luckystar-teacher   # the teacher first
    python -m luckystar.main --config=configs/rejection_sampling.py --workdir=/tmp/luckystar-rs
    python -m luckystar.main --config=configs/sft.py --workdir=/tmp/luckystar-sft \
        --config.sft.sources=bundled:conversations/reasoning@0.76,bundled:conversations/concise@0.2,rs_traces:/tmp/luckystar-rs/rs_traces.jsonl@0.04

Best-of-8 at temperature 1.0 from the teacher (`configs/sft.py:teacher`: `tiny-base` with a full
512-token attention window, trained 800 steps on the teacher split's own databases and questions plus
32 mixed-wording and 16 training-wording teacher databases per domain) over the student's RS-only train
prompts: every NL2SQL prompt in both languages (144) and Korean math of difficulty 2 (238), the SQL run in the
sandbox. Keeps every verified-correct trace, deduplicated; for Korean prompts only English thinking
with a Korean response. Writes rs_traces.jsonl, rs_stats.json and rs_stats.md (pass@1 and pass@8 per
task and language, kept traces per prompt, drops by the Korean language filter); re-running on the
same workdir reuses them.
No teacher is bundled: train it first (above), or point --config.init_from at another teacher run dir.
Expected with that teacher (NL2SQL prompts only): ~7 min, pass@8 about a third (experiments/cold_start.md).

`:smoke` (tests): an untrained `tiny` teacher, 1 prompt per task × 2 samples of ≤ 16 tokens; it
keeps nothing, but runs every step and writes every file.
"""

from luckystar import config as config_lib


def get_config(arg=None):
  config = config_lib.base('rejection_sampling')
  config.init_from = '/tmp/luckystar-teacher'   # the teacher's run dir (or an HF dir); 'random:<size>': smoke
  config.sampling.temperature = 1.0     # best-of-N needs diverse samples
  config.sampling.max_new_tokens = 256  # thinking + SQL call + tool result + answer fit with room
  # FORMAT:PATH items (docs/data.md); add e.g. ',bird:/data/bird/train/train.json' or ',math_jsonl:/data/x.jsonl'.
  config.rejection_sampling.sources = 'bundled:nl2sql,bundled:math'
  config.rejection_sampling.math_difficulties = (2,)     # intermediate (bundled math only)
  config.rejection_sampling.math_languages = ('ko',)     # bundled math only
  config.rejection_sampling.max_prompts = 0              # per source; 0 = all (of a bundled suite: its RS-only prompts)
  config.rejection_sampling.samples_per_prompt = 8       # N of best-of-N
  config.rejection_sampling.batch_size = 64              # rollouts generated together (8 prompts × 8)
  config.rejection_sampling.max_tool_turns = 2
  config.rejection_sampling.max_tool_result_tokens = 128

  if arg == 'smoke':
    config.init_from = 'random:tiny'
    config.sampling.max_new_tokens = 16
    config.rejection_sampling.max_prompts = 1
    config.rejection_sampling.samples_per_prompt = 2
    config.rejection_sampling.batch_size = 4
  elif arg:
    raise ValueError(f'unknown variant configs/rejection_sampling.py:{arg}; expected '
                     f'configs/rejection_sampling.py or configs/rejection_sampling.py:smoke')
  return config
