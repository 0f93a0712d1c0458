"""The `pipeline` stage (configs/pipeline.py, luckystar.stages.pipeline): wiring, resume by stage, the report."""

import json
import pathlib
import types

import ml_collections
import pytest

from luckystar import config as config_lib
from luckystar import errors
from luckystar.stages import pipeline as reproduce
from luckystar.stages import rlvr as rloo
import main_runs


def _pipeline(order, **stages):
  config = config_lib.base('pipeline')
  config.pipeline = ml_collections.ConfigDict(dict(order=order, stages=ml_collections.ConfigDict(stages)))
  return config


def _stage(stage='sft', **values):
  config = config_lib.base(stage)
  config.update(values)
  return config


def test_references_become_stage_dirs_and_the_pipeline_seed_is_every_stages():
  config = _stage(init_from='@sft', seed=5)
  config.sft.rs_traces = '@rejection_sampling/rs_traces.jsonl'
  resolved = reproduce.resolve(config, pathlib.Path('/runs/paper'), seed=1)
  assert (resolved.init_from, resolved.sft.rs_traces, resolved.seed) == (
      '/runs/paper/sft', '/runs/paper/rejection_sampling/rs_traces.jsonl', 1)
  assert config.init_from == '@sft'   # the pipeline's own config is left as it was


def test_a_stage_must_run_after_the_stages_it_reads():
  rs = _stage('rejection_sampling', init_from='@teacher')
  with pytest.raises(errors.UserError, match=r"stages.rejection_sampling.init_from='@teacher' reads stage 'teacher'"):
    reproduce.check_order(_pipeline(('rejection_sampling', 'teacher'), teacher=_stage(), rejection_sampling=rs))
  with pytest.raises(errors.UserError, match=r"names \['dpo'\]"):
    reproduce.check_order(_pipeline(('teacher', 'dpo'), teacher=_stage()))
  reproduce.check_order(_pipeline(('teacher', 'rejection_sampling'), teacher=_stage(), rejection_sampling=rs))
  sft = _stage()
  sft.sft.rs_traces = '@rejection_sampling/rs_traces.jsonl'   # a nested key is named by its dotted path
  with pytest.raises(errors.UserError, match=r"stages.sft.sft.rs_traces='@rejection_sampling/rs_traces.jsonl'"):
    reproduce.check_order(_pipeline(('sft', 'rejection_sampling'), sft=sft, rejection_sampling=rs))


def test_every_shipped_pipeline_reads_only_earlier_stages():
  for variant in (None, 'cold_start', 'smoke'):
    reproduce.check_order(config_lib.from_file('configs/pipeline.py', variant))


def test_a_finished_stage_is_skipped_and_one_with_a_changed_config_is_an_error(tmp_path, monkeypatch):
  calls = []
  fake = types.SimpleNamespace(run=lambda config, workdir: calls.append(workdir))
  monkeypatch.setattr(config_lib, 'stage_module', lambda stage: fake)
  config = _stage(total_steps=3)
  reproduce.run_stage('sft', config, tmp_path / 'sft')
  reproduce.run_stage('sft', config, tmp_path / 'sft')
  assert calls == [str(tmp_path / 'sft')]
  assert json.loads((tmp_path / 'sft' / 'config.json').read_text())['total_steps'] == 3
  with pytest.raises(errors.UserError, match='finished with another config'):
    reproduce.run_stage('sft', _stage(total_steps=4), tmp_path / 'sft')
  assert len(calls) == 1


def _write_stage(workdir, name, rows=(), results=None):
  stage_dir = workdir / name
  stage_dir.mkdir()
  (stage_dir / reproduce.DONE_FILE).write_text(json.dumps({'config': {}, 'wall_s': 60.0}))
  (stage_dir / 'metrics.jsonl').write_text(''.join(json.dumps(row) + '\n' for row in rows))
  if results is not None:
    (stage_dir / 'results.json').write_text(json.dumps(results))


def _results(**suites):
  return {'suites': {name: {mode: {'accuracy': value} for mode, value in modes.items()} for name, modes in suites.items()}}


def test_the_report_reads_each_finding_from_the_stage_outputs(tmp_path):
  mismatch = lambda values, end: [{'step': i + 1, 'train/language_mismatch': v} for i, v in enumerate(values)] + [
      {'step': 0, 'eval/language_mismatch': 0.0, 'eval/correctness': 0.2},
      {'step': len(values), 'eval/language_mismatch': end, 'eval/correctness': 0.3}]
  _write_stage(tmp_path, 'rlvr', mismatch([0.0, 0.0, 0.1, 0.0], 0.0))
  _write_stage(tmp_path, 'rlvr_no_penalty', mismatch([0.0, 0.1, 0.2, 0.3], 0.25))
  for name, zero_variance, correct, end in (('nl2sql_from_base', 1.0, 0.0, 0.0), ('nl2sql_from_sft', 0.5, 0.1, 0.1)):
    _write_stage(tmp_path, name, [{'step': 0, 'eval/correctness': 0.0},
                                  {'step': 1, 'train/zero_variance_groups': zero_variance, 'train/correctness': correct},
                                  {'step': 1, 'eval/correctness': end}])
    rates = {'a': 0.0, 'b': 0.0, 'c': 0.0, 'd': 0.0} if name == 'nl2sql_from_base' else {'a': 0.0, 'b': 0.25}
    (tmp_path / name / rloo.SELECTION_FILE).write_text(json.dumps({'pass_rates': rates}))
  _write_stage(tmp_path, 'dpo', [{'step': 0, 'eval/concise/response_length': 20.0, 'eval/concise/correctness': 0.5,
                                  'eval/reasoning/response_length': 60.0, 'eval/reasoning/correctness': 0.2},
                                 {'step': 9, 'eval/concise/response_length': 12.0, 'eval/concise/correctness': 0.49,
                                  'eval/reasoning/response_length': 58.0, 'eval/reasoning/correctness': 0.19}])
  _write_stage(tmp_path, 'eval_base', results=_results(math={'reasoning': 0.1, 'concise': 0.1}, chat={'concise': 0.5}))
  _write_stage(tmp_path, 'eval_final', results=_results(math={'reasoning': 0.3, 'concise': 0.1}, chat={'concise': 0.45}))
  for name, korean in (('eval_sft', 0.05), ('eval_sft_korean_thinking', 0.02)):
    _write_stage(tmp_path, name, results={'suites': {'math': {'reasoning': {
        'accuracy': 0.04, 'accuracy/en': 0.03, 'accuracy/ko': korean, 'examples': 128}}}})
  order = ('eval_sft', 'eval_sft_korean_thinking', 'rlvr', 'rlvr_no_penalty', 'nl2sql_from_base', 'nl2sql_from_sft', 'dpo', 'eval_base', 'eval_final',
           'eval_int4')   # eval_int4 never finished: its finding is left out
  results = reproduce.report(tmp_path, order, {name: 60.0 for name in order})
  findings = {f['title'].split(':')[0]: f for f in results['findings']}
  assert sorted(findings) == ['Cold start', 'DPO for conciseness', 'Table 1', 'Table 2', 'Table 3', 'Table 4']
  assert findings['Table 1']['reproduced'] and '+3.0 points (64 Korean prompts)' in findings['Table 1']['verdict']
  penalised, free = findings['Table 2']['rows']
  assert penalised[1:5] == pytest.approx([0.0, 5.0, 0.0, 0.0]) and free[1:5] == pytest.approx([5.0, 25.0, 0.0, 25.0])
  assert findings['Table 2']['reproduced']
  cold_start = findings['Cold start']
  assert cold_start['reproduced'] and [row[1] for row in cold_start['rows']] == [100.0, 50.0]
  assert findings['DPO for conciseness']['reproduced']      # −40% length, −1 point in each mode
  assert '40.0%' in findings['DPO for conciseness']['verdict']
  assert findings['Table 3']['reproduced'] and '+20.0 points' in findings['Table 3']['verdict']
  assert not findings['Table 4']['reproduced'] and '-5.0 points' in findings['Table 4']['verdict']
  assert results['rlvr']['eval/correctness'] == (0.2, 0.3)
  reproduce.write(tmp_path, results)
  assert '| Table 4: general quality preserved | **no** |' in (tmp_path / 'report.md').read_text()
  assert (tmp_path / 'plots' / 'table2_language_mismatch.png').is_file()


def test_smoke_pipeline_runs_the_chain_and_a_rerun_skips_every_stage(tmp_path):
  workdir = tmp_path / 'paper'
  code, log = main_runs.finish(main_runs.start('configs/pipeline.py:smoke', workdir, cache_dir=tmp_path / 'cache'))
  assert code == 0, log[-3000:]
  order = config_lib.from_file('configs/pipeline.py', 'smoke').pipeline.order
  assert all((workdir / name / reproduce.DONE_FILE).is_file() for name in order)
  assert json.loads((workdir / 'sft' / 'config.json').read_text())['sft']['rs_traces'] == str(
      workdir / 'rejection_sampling' / 'rs_traces.jsonl')
  assert (workdir / 'quantize' / 'hf_int4' / 'config.json').is_file()
  assert json.loads((workdir / 'eval_int4' / 'results.json').read_text())['init_from'] == str(
      workdir / 'quantize' / 'hf_int4')
  report = (workdir / 'report.md').read_text()
  assert 'DPO for conciseness' in report and '## Stage wall times' in report
  int4 = (workdir / 'quantize' / 'hf_int4' / 'model.safetensors').stat().st_mtime_ns
  code, log = main_runs.finish(main_runs.start('configs/pipeline.py:smoke', workdir, cache_dir=tmp_path / 'cache'))
  assert code == 0, log[-3000:]
  assert log.count('finished before') == len(order)
  assert (workdir / 'quantize' / 'hf_int4' / 'model.safetensors').stat().st_mtime_ns == int4
