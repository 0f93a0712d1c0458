"""The `pipeline` stage (configs/pipeline.py, luckystar.stages.pipeline): wiring and resume by stage.

Its findings report, experiments/paper_report.py, is tested in experiments/tests/test_paper_report.py."""

import json
import pathlib
import types

import ml_collections
import numpy as np
import pytest

import luckystar
from luckystar import config as config_lib
from luckystar import errors
from luckystar import tokenizer as tokenizer_lib
from luckystar.engine import checkpoint
from luckystar.stages import pipeline
import cohere_checkpoint
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
  config.sft.sources = 'bundled:conversations@0.9,rs_traces:@rejection_sampling/rs_traces.jsonl@0.1'  # inside an item
  resolved = pipeline.resolve(config, pathlib.Path('/runs/paper'), seed=1)
  assert (resolved.init_from, resolved.sft.sources, resolved.seed) == (
      '/runs/paper/sft', 'bundled:conversations@0.9,rs_traces:/runs/paper/rejection_sampling/rs_traces.jsonl@0.1', 1)
  assert config.init_from == '@sft'   # the pipeline's own config is left as it was


def test_a_stage_must_run_after_the_stages_it_reads():
  rs = _stage('rejection_sampling', init_from='@teacher')
  with pytest.raises(errors.UserError, match=r"stages.rejection_sampling.init_from='@teacher' reads stage 'teacher'"):
    pipeline.check_order(_pipeline(('rejection_sampling', 'teacher'), teacher=_stage(), rejection_sampling=rs))
  with pytest.raises(errors.UserError, match=r"names \['dpo'\]"):
    pipeline.check_order(_pipeline(('teacher', 'dpo'), teacher=_stage()))
  pipeline.check_order(_pipeline(('teacher', 'rejection_sampling'), teacher=_stage(), rejection_sampling=rs))
  sft = _stage()
  sft.sft.sources = 'rs_traces:@rejection_sampling/rs_traces.jsonl'   # a nested key is named by its dotted path
  with pytest.raises(errors.UserError, match=r"stages.sft.sft.sources='rs_traces:@rejection_sampling/rs_traces.jsonl'"):
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


# The chain from the bundled models, and from a user's Cohere-format checkpoint (its own tokenizer and chat format;
# tests/cohere_checkpoint.py) in every stage that starts from a checkpoint rather than an earlier stage.
FROM_CHECKPOINT = ('teacher', 'sft', 'dpo')


@pytest.mark.parametrize('start', ['bundled', 'cohere'])
def test_smoke_pipeline_runs_the_chain_and_a_rerun_skips_every_stage(start, tmp_path, request):
  workdir = tmp_path / 'paper'
  overrides = ()
  if start == 'cohere':
    checkpoint_dir = request.getfixturevalue('cohere_dir')
    overrides = tuple(f'--config.pipeline.stages.{name}.init_from={checkpoint_dir}' for name in FROM_CHECKPOINT)
  process = main_runs.start('configs/pipeline.py:smoke', workdir, cache_dir=tmp_path / 'cache', overrides=overrides)
  out, log = process.communicate(timeout=600)
  assert process.returncode == 0, log[-3000:]
  order = config_lib.from_file('configs/pipeline.py', 'smoke').pipeline.order
  assert all((workdir / name / pipeline.DONE_FILE).is_file() for name in order)
  assert f'rs_traces:{workdir / "rejection_sampling" / "rs_traces.jsonl"}@' in json.loads(
      (workdir / 'sft' / 'config.json').read_text())['sft']['sources']
  assert (workdir / 'quantize' / 'hf_int4' / 'config.json').is_file()
  assert json.loads((workdir / 'eval_int4' / 'results.json').read_text())['init_from'] == str(
      workdir / 'quantize' / 'hf_int4')
  # The findings report is an experiment's (experiments/paper_report.py); the stage says how to build it.
  assert f'python experiments/paper_report.py --workdir={workdir}' in out
  assert not (workdir / 'report.md').exists()
  int4 = (workdir / 'quantize' / 'hf_int4' / 'model.safetensors').stat().st_mtime_ns
  if start == 'cohere':   # every stage's model and artifacts speak the checkpoint's tokenizer
    fingerprint = tokenizer_lib.from_dir(checkpoint_dir).fingerprint
    for name in ('teacher', 'sft', 'rlvr', 'dpo'):
      assert json.loads((workdir / name / 'tokenizer' / checkpoint.TOKENIZER_RECORD).read_text()) == {
          'backend': 'tokenizers', 'chat_format': 'cohere', 'vocab_size': cohere_checkpoint.VOCAB_SIZE,
          'fingerprint': fingerprint}
    traces = (workdir / 'rejection_sampling' / 'rs_traces.jsonl').read_text().splitlines()
    assert all(json.loads(line)['tokenizer'] == fingerprint for line in traces)
    assert luckystar.load(workdir / 'quantize' / 'hf_int4').tokenizer.fingerprint == fingerprint
    # The chain's final float policy exports, and transformers reads it with our logits and greedy tokens.
    transformers = pytest.importorskip('transformers')
    torch = pytest.importorskip('torch')
    policy = luckystar.load(workdir / 'dpo')
    policy.save_hf(tmp_path / 'dpo_hf', dtype='float32')
    ids = np.random.default_rng(0).integers(0, cohere_checkpoint.VOCAB_SIZE, (2, 48))
    with torch.no_grad():
      theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'dpo_hf')(torch.tensor(ids)).logits.numpy()
    ours = np.asarray(policy.logits(ids))
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
    assert cohere_checkpoint.greedy_agrees(ours, theirs)
  code, log = main_runs.finish(main_runs.start('configs/pipeline.py:smoke', workdir, cache_dir=tmp_path / 'cache',
                                               overrides=overrides))
  assert code == 0, log[-3000:]
  assert all(f'pipeline stage {name!r}: reusing' in log for name in order)
  assert (workdir / 'quantize' / 'hf_int4' / 'model.safetensors').stat().st_mtime_ns == int4
