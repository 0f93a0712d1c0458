"""The NL2SQL cold start alone (issue 5), as a pipeline config: its teacher and its student each started from a
copy phase (experiments/cold_start.py runs it and writes experiments/cold_start.md).

    python -m luckystar.main --config=experiments/cold_start_pipeline.py --workdir=/tmp/luckystar-cold-start
    python -m luckystar.main --config=experiments/cold_start_pipeline.py:copy --workdir=/tmp/luckystar-copy

Imports experiments/cold_start_data.py, which registers the copy drills as SFT data ('copy', 'copy_plain',
'copy_named', 'copy_schema') and the RL-only NL2SQL prompts ('nl2sql_rl_only') with `luckystar.data.sources`;
the stages run in the process that loads this file, so they find them.
The paper pipeline (configs/pipeline.py) keeps its 400-step teacher from `tiny-base` without these phases, for
time: they would add ≈ 27 min (copy 7, a teacher of 800 steps 20) for NL2SQL traces that its student, fine-tuned
from `tiny-base` without a copy phase of its own, could not use (experiments/cold_start.md: 0 of 96 held-out
without one).

`:copy` is the copy phase alone, an SFT config: `tiny-base` on the quoted copy drill (`Repeat: '<word>'` or
`'<word>': repeat it` → `It is '<word>'`, the word made up or a person's or company's name), 800 steps, ≈ 8 min;
eval/loss 8.3 → 0.63, greedy: 15 of 32 made-up words and 4 of 32 of the student's NL2SQL values copied.
`:copy_plain` is experiments/copy_probe.py's unquoted made-up-word drill (eval/loss 7.9 → 0.12, 84% exact
teacher-forced). `:copy_named` (128-token rows) is the student's drill in the reasoning traces' form
(`'<word>'에 대해 알려 주세요.` → thinking `The question names '<word>'.`). From `tiny-sft` after the quoted drill,
greedy thinking names 0 of 32 student NL2SQL values after 300 steps, 14 of 32 after 1500 (21 min; made-up words
28 of 32), but only 3 of 48 with a database schema before the question (experiments/cold_start.md, Notes).
`:copy_schema` (512-token rows, batch 8) is that drill behind the schema (a training database's schema, a
template's question naming made-up values, the row ending at the thinking): 600 steps after `copy_named`
(≈ 15 min), greedy thinking names 25 of 144 held-out NL2SQL questions' values exactly (2 before).
"""

import importlib.util
import pathlib
import sys

import ml_collections

from luckystar import config as config_lib

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
  sys.path.insert(0, str(HERE))
import cold_start_data  # noqa: E402  (registers the data sources named below)

_spec = importlib.util.spec_from_file_location('pipeline_config', HERE.parent / 'configs' / 'pipeline.py')
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)
stage = pipeline.stage
COPY_VARIANTS = {'copy': {}, 'copy_plain': {}, 'copy_named': dict(sft__seq_len=128),
                 'copy_schema': dict(sft__seq_len=512, batch_size=8)}
assert set(COPY_VARIANTS) == set(cold_start_data.DRILL_SOURCES)


def copy_phase(data: str = 'copy', **changes) -> ml_collections.ConfigDict:
  """SFT on the copy drill `data` alone, the phase a run starts from: `tiny-base` has no copy circuit
  (experiments/copy_probe.md: 0% exact, 65% after 400 steps of the drill near the peak learning rate, 94% at
  800). The probe's shape: 16 rows of one drill (~75 tokens) each, with the teacher's 512-token window."""
  return stage('sft', **{**dict(
      init_from='tiny-base', model_overrides=ml_collections.ConfigDict(dict(sliding_window=512)), total_steps=800,
      batch_size=16, learning_rate=1e-3, warmup_steps=20, eval_every=200, checkpoint_every=100,
      sft__sources=f'bundled:{data}', sft__seq_len=96, sft__eval_examples_per_source=128,
      sft__task_eval__per_task_language=0), **changes})


def nl2sql_rl(init_from: str, **changes) -> ml_collections.ConfigDict:
  """RLOO on NL2SQL alone, every candidate kept (no [1/8, 7/8] filter: the point is to see the signal), and
  no language penalty, so a group's rewards vary only where its correctness does. Held-out: new questions
  over the training databases (`engine.curriculum.reserve_eval`, drawn before prompt selection); the student learns
  NL2SQL
  from traces over those alone. The paper pipeline's NL2SQL arms, at this experiment's sizes."""
  return stage('rlvr', init_from=init_from, **{**dict(
      total_steps=6, checkpoint_every=3, rlvr__language_penalty=0.0, rlvr__sources='bundled:nl2sql',
      rlvr__selection_prompts=ml_collections.ConfigDict(dict(nl2sql=48)), rlvr__select_pass_rate=(0.0, 1.0),
      rlvr__eval_prompts=64, rlvr__eval_samples=0, rlvr__eval_split='train'), **changes})


def cold_start_stages() -> dict[str, ml_collections.ConfigDict]:
  """A copy phase, a tiny teacher started from it, best-of-8 on the RS-only NL2SQL prompts, `tiny-sft` given the
  same copy phase, the drill in the traces' form (`copy_named`) and that drill behind a schema (`copy_schema`),
  then fine-tuned on its hybrid mixture plus the kept traces and the schema drill; RLOO on NL2SQL from that SFT,
  which then also runs on the unseen held-out databases, and the two controls, RLOO from `tiny-base` and from
  `tiny-sft`. Both copy phases run with the teacher's full 512-token attention window, which the controls do
  not have."""
  control = dict(total_steps=8, checkpoint_every=4, rlvr__eval_prompts=96)
  unseen = stage('eval', init_from='@nl2sql_from_sft')
  unseen.eval.update(dict(per_suite_language=32, bfcl_per_category=2, champ_problems=4, pass_k_problems=4,
                          suites=('nl2sql',), modes=('reasoning',), pass_k_samples=0))
  return {
      # The copy phase (quoted drill), then the teacher from it with the drill kept as a tenth of its rows.
      'copy': copy_phase(),
      'teacher': stage('sft', 'teacher', init_from='@copy',
                       sft__sources='bundled:teacher/reasoning@0.72,bundled:teacher/concise@0.18,bundled:copy@0.1'),
      'rejection_sampling': stage('rejection_sampling', init_from='@teacher',
                                  rejection_sampling__sources='bundled:nl2sql'),
      # The student's own copy phase: `tiny-sft` cannot copy a value either, and fine-tuned on the traces alone
      # it writes one memorised value per template (held-out NL2SQL 0 of 96; experiments/cold_start.md).
      'student_copy': copy_phase(init_from='tiny-sft'),
      # Then the drill in the traces' own form (`cold_start_data.named_messages`): with the `It is` form alone the
      # student's thinking line named a memorised value for every question.
      'student_named': copy_phase('copy_named', init_from='@student_copy', total_steps=1500, sft__seq_len=128),
      # Then the named drill behind an NL2SQL context (`copy_schema`: a training database's schema, a question in
      # a template's wording naming made-up values, the trace's thinking): after `copy_named` alone the student
      # named 14 of 32 values in the drill's own requests but 3 of 48 behind a schema; after this stage, 25 of 144
      # held-out questions' values exactly, and its SFT's held-out NL2SQL went 3.5% → 12.5% (cold_start.md).
      'student_schema': copy_phase('copy_schema', init_from='@student_named', total_steps=600, batch_size=8,
                                   sft__seq_len=512),
      # The kept traces as a mixture source of their own (a few hundred among ~8000 conversations would
      # otherwise be drawn a few times each), and the drill kept up, now behind a schema (with the named drill at
      # 0.1 of 300 steps the thinking line named 4 of 48 held-out-like questions' values and the queries lost their
      # table names: 15 of 48 right).
      'sft': stage('sft', init_from='@student_schema', total_steps=600, learning_rate=3e-4, warmup_steps=10,
                   eval_every=0, checkpoint_every=100, sft__eval_examples_per_source=16,
                   sft__task_eval__per_task_language=0,
                   sft__sources='bundled:conversations/reasoning@0.35,bundled:conversations/concise@0.1,'
                                'rs_traces:@rejection_sampling/rs_traces.jsonl@0.35,bundled:copy_schema@0.2'),
      # RLOO from the SFT with docs/rl.md's prompt selection ([1/8, 7/8] at k = 8): without it, 98% of its groups
      # had zero variance and one lucky group in 16 steps was all the signal it got (the 4.2% → 0.0% run in
      # experiments/cold_start.md). The held-out set is reserved first (`engine.curriculum.reserve_eval`), and selection
      # measures every prompt left (216; 512 is "all"): 31 kept, where 128 candidates measured beside the
      # held-out set kept 14. Overlong rollouts count as wrong: dropped (the default), they were 50% of the RL
      # batches by step 30 and held-out format_ok fell 62% → 26% over 48 steps. Sampled held-out pass@1
      # (2 draws) beside the greedy one, every 16 steps.
      'nl2sql_from_sft': nl2sql_rl('@sft', total_steps=32, checkpoint_every=8, eval_every=16,
                                   rlvr__eval_prompts=144, rlvr__eval_samples=2, rlvr__drop_overlong=False,
                                   rlvr__select_pass_rate=(0.125, 0.875),
                                   rlvr__selection_prompts=ml_collections.ConfigDict(dict(nl2sql=512))),
      'eval_nl2sql_unseen': unseen,
      # The controls keep every candidate (a filter would keep none) and run 8 steps: 48 × 8 selection rollouts
      # and 8 × 64 RL rollouts are enough to show they get no reward signal.
      'nl2sql_from_base': nl2sql_rl('tiny-base', **control),
      'nl2sql_from_tiny_sft': nl2sql_rl('tiny-sft', **control),
  }


def get_config(arg=None):
  """The cold-start pipeline; `arg` a copy drill's name (COPY_VARIANTS): that copy phase alone, an SFT config."""
  if arg in COPY_VARIANTS:
    return copy_phase(arg, **COPY_VARIANTS[arg])
  if arg:
    raise ValueError(f'unknown variant experiments/cold_start_pipeline.py:{arg}; expected no variant or one of '
                     f'{sorted(COPY_VARIANTS)}')
  config = config_lib.base('pipeline')
  config.init_from = ''                  # unused: each stage names its own
  stages = cold_start_stages()
  config.pipeline = ml_collections.ConfigDict(dict(order=tuple(stages), stages=ml_collections.ConfigDict(stages)))
  return config
