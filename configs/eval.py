"""Evaluate one model on every suite, in both modes (the `eval` stage, docs/evaluation.md).

    python -m luckystar.main --config=configs/eval.py --workdir=/tmp/luckystar-eval
    python -m luckystar.main --config=configs/eval.py --workdir=/tmp/eval-base --config.init_from=tiny-base
    python -m luckystar.main --config=configs/eval.py --workdir=/tmp/eval-int4 --config.init_from=/tmp/hf_int4
    python -m luckystar.main --config=configs/eval.py:smoke --workdir=/tmp/luckystar-eval-smoke

`init_from`: anything `luckystar.load` reads (bundled name, run directory, transformers directory,
int4 export directory) or `random:<size>`. Suites: bundled math (pass@1 greedy, pass@k sampled),
CHAMP competition math (needs `pip install champ-dataset`; skipped and reported otherwise), agentic
NL2SQL with the SQL tool loop, real BFCL simple / multiple / parallel (needs `pip install --no-deps
bfcl-eval==2026.3.23`), KoBALT-format Korean MC, concise chat, rule-verified instruction following.
Writes DIR/report.md, DIR/results.json, DIR/metrics.jsonl and DIR/plots/*.png.
Expected on 2 CPU cores with tiny-sft: ~3 min; reasoning-mode math ~100%, near 0 on NL2SQL, BFCL, CHAMP.
"""

import ml_collections

from luckystar import config as config_lib


def get_config(arg=None):
  config = config_lib.base('eval')
  config.init_from = 'tiny-sft'
  config.eval = ml_collections.ConfigDict(dict(
      suites=('math', 'champ', 'nl2sql', 'bfcl', 'korean_mc', 'chat', 'instruction_following'),
      modes=('reasoning', 'concise'),
      per_suite_language=16,        # first N held-out prompts per (suite, language)
      bfcl_categories=('simple_python', 'multiple', 'parallel'),
      bfcl_per_category=16,         # first N questions of each BFCL category
      champ_problems=16,            # first N CHAMP problems (English)
      # More suites, FORMAT:PATH items (docs/data.md), each its own suite: e.g. 'kobalt_jsonl:/data/kobalt.jsonl,'
      # 'bird:/data/bird/dev/dev.json,math_jsonl:/data/aime.jsonl'.
      sources='',
      pass_k=(1, 4),                # pass@k reported for math and champ (reasoning mode)
      pass_k_samples=4,             # sampled replies per problem (≥ max pass_k); 0 = no pass@k
      pass_k_problems=8,            # problems per language that get sampled replies
      pass_k_temperature=1.0,
      max_new_tokens=160,
      max_prompt_tokens=768,        # longer prompts (some BFCL docs) are left out and counted in the report
      max_tool_turns=2,
      max_tool_result_tokens=96,
      batch_size=32,
      seed=0,
  ))

  if arg == 'smoke':  # tests: two prompts per suite and language, short replies
    config.eval.per_suite_language = 2
    config.eval.bfcl_per_category = 2
    config.eval.champ_problems = 2
    config.eval.pass_k = (1, 2)
    config.eval.pass_k_samples = 2
    config.eval.pass_k_problems = 1
    config.eval.max_new_tokens = 24
    config.eval.batch_size = 16
  elif arg:
    raise ValueError(f'unknown variant configs/eval.py:{arg}; expected configs/eval.py or configs/eval.py:smoke')
  return config
