"""The paper in miniature, one command: teacher → rejection sampling → hybrid SFT → RLVR → DPO → int4
export → eval, with the ablations behind the paper's findings (docs/reproduction.md).

    python -m luckystar.main --config=configs/pipeline.py --workdir=/tmp/luckystar-paper
    python -m luckystar.main --config=configs/pipeline.py:smoke --workdir=/tmp/luckystar-paper-smoke

Each stage is the config of its own `configs/<stage>.py`, with smaller step counts, under
`config.pipeline.stages.<name>`, run in `config.pipeline.order`, each in workdir/<name>. A value
'@<name>[/path]' is that stage's run directory (or a file in it), so `init_from='@sft'` starts from the
pipeline's own SFT. `config.seed` seeds every stage. Override any stage key on the command line, e.g.
`--config.pipeline.stages.rlvr.total_steps=32`. A finished stage leaves workdir/<name>/stage_done.json;
re-running the same command skips it and resumes the first unfinished one where its checkpoint left
off (a stage whose config changed since is an error: use a new workdir or delete that stage's dir).

  teacher               SFT of `tiny-base` on the teacher split only (its own databases and questions)
  rejection_sampling    best-of-8 from the teacher on RS-only NL2SQL and Korean math prompts, verified
  sft                   hybrid SFT of `tiny-base` with the kept traces (English thinking)
  sft_korean_thinking   the same SFT, Korean prompts thinking in Korean, no RS traces (Table 1's ablation)
  eval_sft, eval_sft_korean_thinking   reasoning-mode math and Korean MC of both (Table 1)
  nl2sql_from_base      RLOO on NL2SQL alone from `tiny-base`, no language penalty: the cold start
  nl2sql_from_sft       the same from the pipeline's SFT
  rlvr, rlvr_no_penalty the RLVR run (language penalty 1.0) and its penalty-0 twin (Table 2)
  dpo                   conciseness DPO of the RLVR policy
  quantize              AQT int4 of the DPO policy, exported to compressed-tensors (workdir/quantize/hf_int4)
  eval_base, eval_final, eval_int4   the eval stage on `tiny-base`, the DPO policy and its int4 export
                        (Tables 3 and 4; BFCL and CHAMP are cut to a few problems each for time)

Each stage writes its own outputs in workdir/<name>; `python experiments/paper_report.py --workdir=DIR`
then reports every paper finding with its numbers. Expected on 2 CPU cores: ~73 min (experiments/paper_reproduction.md).
`:smoke` (tests): the chain teacher → rejection_sampling → sft → rlvr → dpo → quantize → eval with a
few steps and prompts each; DPO starts from a random policy (a barely trained one is never verbose,
so it would have no pairs).
"""

import pathlib

import ml_collections

from luckystar import config as config_lib

CONFIGS = pathlib.Path(__file__).resolve().parent
FULL_ORDER = ('teacher', 'rejection_sampling', 'sft', 'sft_korean_thinking', 'eval_sft', 'eval_sft_korean_thinking',
              'nl2sql_from_base', 'nl2sql_from_sft', 'rlvr', 'rlvr_no_penalty', 'dpo', 'quantize',
              'eval_base', 'eval_final', 'eval_int4')
SMOKE_ORDER = ('teacher', 'rejection_sampling', 'sft', 'rlvr', 'dpo', 'quantize', 'eval_int4')


def stage(name: str, arg: str | None = None, **changes) -> ml_collections.ConfigDict:
  """configs/<name>.py[:arg] with `changes` (dotted keys as 'a__b') applied."""
  config = config_lib.from_file(CONFIGS / f'{name}.py', arg)
  for key, value in changes.items():
    *parents, leaf = key.split('__')
    node = config
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return config


def _cold_start(init_from: str, **changes) -> ml_collections.ConfigDict:
  """RLOO on NL2SQL alone, every candidate kept (no [1/8, 7/8] filter: the point is to see the signal), and
  no language penalty, so a group's rewards vary only where its correctness does. Held-out: new questions
  over the training databases (`engine.curriculum.reserve_eval`, drawn before prompt selection); the student learns
  NL2SQL
  from traces over those alone."""
  return stage('rlvr', init_from=init_from, **{**dict(
      total_steps=6, checkpoint_every=3, rlvr__language_penalty=0.0, rlvr__sources='bundled:nl2sql',
      rlvr__selection_prompts=ml_collections.ConfigDict(dict(nl2sql=48)), rlvr__select_pass_rate=(0.0, 1.0),
      rlvr__eval_prompts=64, rlvr__eval_samples=0, rlvr__eval_split='train'), **changes})


def _eval(init_from: str, **changes) -> ml_collections.ConfigDict:
  config = stage('eval', init_from=init_from)
  config.eval.update(dict(per_suite_language=16, bfcl_per_category=2, champ_problems=4, pass_k_problems=4))
  config.eval.update(changes)
  return config


# Hybrid SFT with the rejection-sampled traces as a source of their own: a few hundred traces among ~8000
# reasoning conversations, at about the share they had when they joined the reasoning source.
SFT_WITH_TRACES = ('bundled:conversations/reasoning@0.76,bundled:conversations/concise@0.2,'
                   'rs_traces:@rejection_sampling/rs_traces.jsonl@0.04')


def full_stages() -> dict[str, ml_collections.ConfigDict]:
  sft_changes = dict(init_from='tiny-base', total_steps=500, warmup_steps=25, eval_every=0, checkpoint_every=100,
                     sft__eval_examples_per_source=16, sft__task_eval__per_task_language=0)
  rlvr_changes = dict(init_from='@sft', total_steps=16, checkpoint_every=4, rlvr__eval_prompts=120,
                      rlvr__eval_samples=0, rlvr__selection_prompts=ml_collections.ConfigDict(
                          dict(chat=96, function_calling=32, math=32, nl2sql=32)))
  table1 = dict(suites=('math', 'korean_mc'), modes=('reasoning',), per_suite_language=64, pass_k_samples=0)
  return {
      'teacher': stage('sft', 'teacher', total_steps=400),
      'rejection_sampling': stage('rejection_sampling', init_from='@teacher', rejection_sampling__max_prompts=64,
                                  sampling__max_new_tokens=192),
      'sft': stage('sft', **sft_changes, sft__sources=SFT_WITH_TRACES),
      'sft_korean_thinking': stage('sft', **sft_changes, sft__thinking_language='ko'),
      'eval_sft': _eval('@sft', **table1),
      'eval_sft_korean_thinking': _eval('@sft_korean_thinking', **table1),
      'nl2sql_from_base': _cold_start('tiny-base'),
      'nl2sql_from_sft': _cold_start('@sft'),
      'rlvr': stage('rlvr', **rlvr_changes),
      'rlvr_no_penalty': stage('rlvr', **rlvr_changes, rlvr__language_penalty=0.0),
      'dpo': stage('dpo', init_from='@rlvr', total_steps=40, checkpoint_every=10),
      'quantize': stage('quantize', init_from='@dpo'),
      'eval_base': _eval('tiny-base'),
      'eval_final': _eval('@dpo'),
      'eval_int4': _eval('@quantize/hf_int4'),
  }


def smoke_stages() -> dict[str, ml_collections.ConfigDict]:
  tiny_sft = dict(total_steps=2, batch_size=2, warmup_steps=0, eval_every=0, checkpoint_every=2,
                  sft__seq_len=256, sft__eval_examples_per_source=0, sft__task_eval__per_task_language=0)
  rlvr = stage('rlvr', 'smoke', init_from='@sft', total_steps=2, checkpoint_every=2, eval_every=0,
               sampling__max_new_tokens=16, rlvr__sources='bundled:korean_mc', rlvr__select_pass_rate=(0.0, 1.0),
               rlvr__selection_prompts=ml_collections.ConfigDict(dict(korean_mc=2)),
               rlvr__samples_per_prompt=2, rlvr__selection_samples=2, rlvr__eval_prompts=2, rlvr__eval_samples=0)
  return {
      'teacher': stage('sft', 'teacher', init_from='tiny-base', **tiny_sft),
      'rejection_sampling': stage('rejection_sampling', 'smoke', init_from='@teacher'),
      'sft': stage('sft', init_from='tiny-base', **tiny_sft, sft__sources=SFT_WITH_TRACES),
      'rlvr': rlvr,
      'dpo': stage('dpo', 'smoke', total_steps=2, checkpoint_every=2),
      'quantize': stage('quantize', 'smoke', init_from='@dpo'),
      'eval_int4': stage('eval', 'smoke', init_from='@quantize/hf_int4', eval__suites=('math', 'korean_mc'),
                         eval__per_suite_language=1, eval__pass_k_samples=0, eval__max_new_tokens=8),
  }


def get_config(arg=None):
  config = config_lib.base('pipeline')
  config.init_from = ''                  # unused: each stage names its own (`tiny-base` or '@<stage>')
  if arg == 'smoke':
    order, stages = SMOKE_ORDER, smoke_stages()
  elif arg:
    raise ValueError(f'unknown variant configs/pipeline.py:{arg}; expected configs/pipeline.py or '
                     'configs/pipeline.py:smoke')
  else:
    order, stages = FULL_ORDER, full_stages()
  config.pipeline = ml_collections.ConfigDict(dict(order=order, stages=ml_collections.ConfigDict(stages)))
  return config
