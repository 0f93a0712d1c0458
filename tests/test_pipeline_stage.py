"""The `pipeline` stage (configs/pipeline.py, luckystar.stages.pipeline): wiring and resume by stage.

Its findings report, experiments/paper_report.py, is tested in experiments/tests/test_paper_report.py."""

import json
import pathlib
import types

import ml_collections
import pytest

from luckystar import config as config_lib
from luckystar import errors
from luckystar.stages import pipeline
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
  resolved = pipeline.resolve(config, pathlib.Path('/runs/paper'), seed=1)
  assert (resolved.init_from, resolved.sft.rs_traces, resolved.seed) == (
      '/runs/paper/sft', '/runs/paper/rejection_sampling/rs_traces.jsonl', 1)
  assert config.init_from == '@sft'   # the pipeline's own config is left as it was


def test_a_stage_must_run_after_the_stages_it_reads():
  rs = _stage('rejection_sampling', init_from='@teacher')
  with pytest.raises(errors.UserError, match=r"stages.rejection_sampling.init_from='@teacher' reads stage 'teacher'"):
    pipeline.check_order(_pipeline(('rejection_sampling', 'teacher'), teacher=_stage(), rejection_sampling=rs))
  with pytest.raises(errors.UserError, match=r"names \['dpo'\]"):
    pipeline.check_order(_pipeline(('teacher', 'dpo'), teacher=_stage()))
  pipeline.check_order(_pipeline(('teacher', 'rejection_sampling'), teacher=_stage(), rejection_sampling=rs))
  sft = _stage()
  sft.sft.rs_traces = '@rejection_sampling/rs_traces.jsonl'   # a nested key is named by its dotted path
  with pytest.raises(errors.UserError, match=r"stages.sft.sft.rs_traces='@rejection_sampling/rs_traces.jsonl'"):
    pipeline.check_order(_pipeline(('sft', 'rejection_sampling'), sft=sft, rejection_sampling=rs))


def test_every_shipped_pipeline_reads_only_earlier_stages():
  for variant in (None, 'smoke'):   # the cold start's own pipeline: experiments/tests/test_cold_start_data.py
    pipeline.check_order(config_lib.from_file('configs/pipeline.py', variant))


def test_a_finished_stage_is_skipped_and_one_with_a_changed_config_is_an_error(tmp_path, monkeypatch):
  calls = []
  fake = types.SimpleNamespace(run=lambda config, workdir: calls.append(workdir))
  monkeypatch.setattr(config_lib, 'stage_module', lambda stage: fake)
  config = _stage(total_steps=3)
  pipeline.run_stage('sft', config, tmp_path / 'sft')
  pipeline.run_stage('sft', config, tmp_path / 'sft')
  assert calls == [str(tmp_path / 'sft')]
  assert json.loads((tmp_path / 'sft' / 'config.json').read_text())['total_steps'] == 3
  with pytest.raises(errors.UserError, match=r'made under other settings \(total_steps: 3 there, 4 now\)'):
    pipeline.run_stage('sft', _stage(total_steps=4), tmp_path / 'sft')
  assert len(calls) == 1


def test_smoke_pipeline_runs_the_chain_and_a_rerun_skips_every_stage(tmp_path):
  workdir = tmp_path / 'paper'
  process = main_runs.start('configs/pipeline.py:smoke', workdir, cache_dir=tmp_path / 'cache')
  out, log = process.communicate(timeout=600)
  assert process.returncode == 0, log[-3000:]
  order = config_lib.from_file('configs/pipeline.py', 'smoke').pipeline.order
  assert all((workdir / name / pipeline.DONE_FILE).is_file() for name in order)
  assert json.loads((workdir / 'sft' / 'config.json').read_text())['sft']['rs_traces'] == str(
      workdir / 'rejection_sampling' / 'rs_traces.jsonl')
  assert (workdir / 'quantize' / 'hf_int4' / 'config.json').is_file()
  assert json.loads((workdir / 'eval_int4' / 'results.json').read_text())['init_from'] == str(
      workdir / 'quantize' / 'hf_int4')
  # The findings report is an experiment's (experiments/paper_report.py); the stage says how to build it.
  assert f'python experiments/paper_report.py --workdir={workdir}' in out
  assert not (workdir / 'report.md').exists()
  int4 = (workdir / 'quantize' / 'hf_int4' / 'model.safetensors').stat().st_mtime_ns
  code, log = main_runs.finish(main_runs.start('configs/pipeline.py:smoke', workdir, cache_dir=tmp_path / 'cache'))
  assert code == 0, log[-3000:]
  assert all(f'pipeline stage {name!r}: reusing' in log for name in order)
  assert (workdir / 'quantize' / 'hf_int4' / 'model.safetensors').stat().st_mtime_ns == int4
