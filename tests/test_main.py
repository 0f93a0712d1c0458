"""The command line: locked configs, clear errors, honest "not built yet" stages."""

import json
import pathlib
import subprocess
import sys

import pytest

from luckystar import config as config_lib
from luckystar import errors
from luckystar import main as main_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(*args):
  return subprocess.run([sys.executable, '-m', 'luckystar.main', *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)


def test_unknown_config_key_is_named(tmp_path):
  result = _run('--config=configs/rlvr.py', '--config.no_such_key=1', f'--workdir={tmp_path}')
  assert result.returncode != 0
  assert 'no_such_key' in result.stderr
  assert 'Traceback' not in result.stderr
  assert not (tmp_path / 'config.json').exists()


def test_unknown_nested_config_key_is_named(tmp_path):
  result = _run('--config=configs/rlvr.py', '--config.rlvr.samples_per_promt=4', f'--workdir={tmp_path}')
  assert result.returncode != 0 and 'samples_per_promt' in result.stderr


@pytest.mark.fast
def test_every_stage_has_its_module_and_an_unknown_stage_is_named():
  """config.STAGES is the registry: each name is luckystar/stages/<name>.py with a run()."""
  for stage in config_lib.STAGES:
    assert hasattr(config_lib.stage_module(stage), 'run'), stage
  with pytest.raises(errors.UserError, match="config.stage='export' is not a stage"):
    config_lib.stage_module('export')


def test_config_json_and_overrides_reach_the_stage(tmp_path):
  """A built stage gets the overridden config, and config.json is written before it runs."""
  script = f"""
import sys, types
from absl import app
stage = types.ModuleType('luckystar.stages.rlvr')
stage.run = lambda config, workdir: print('RUN', config.seed, config.rlvr.language_penalty, workdir)
sys.modules['luckystar.stages.rlvr'] = stage
from luckystar import main
sys.argv = ['main', '--config=configs/rlvr.py', '--config.seed=7', '--config.rlvr.language_penalty=0.0',
            '--workdir={tmp_path}']  # ml_collections reads overrides from sys.argv
app.run(main.main, flags_parser=main.parse_flags)
"""
  result = subprocess.run([sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  assert f'RUN 7 0.0 {tmp_path}' in result.stdout
  saved = json.loads((tmp_path / 'config.json').read_text())
  assert saved['stage'] == 'rlvr' and saved['seed'] == 7 and saved['rlvr']['language_penalty'] == 0.0


def test_keep_checkpoints_below_one_stops_with_the_key_named(tmp_path):
  """0 used to delete every checkpoint (a re-run started over from step 0); now nothing is trained or saved."""
  result = _run('--config=configs/sft.py', '--config.keep_checkpoints=0', '--config.total_steps=1',
                f'--workdir={tmp_path}')
  assert result.returncode != 0 and 'error: config.keep_checkpoints=0' in result.stderr, result.stderr[-2000:]
  assert 'Traceback' not in result.stderr and not (tmp_path / 'checkpoints').exists()


@pytest.mark.fast
def test_every_stage_config_has_the_shared_keys():
  for stage in config_lib.STAGES:
    config = config_lib.base(stage)
    for key in ('stage', 'seed', 'init_from', 'model_overrides', 'total_steps', 'batch_size', 'learning_rate', 'log_every',
                'eval_every', 'checkpoint_every', 'mesh', 'sampling', stage):
      assert key in config, (stage, key)
  with pytest.raises(ValueError, match='unknown stage'):
    config_lib.base('pretrain')


@pytest.mark.fast
def test_unknown_key_with_a_close_match_names_both():
  result = _run('--config=configs/sft.py:smoke', '--config.totl_steps=3', '--workdir=/nonexistent')
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  assert "unknown config key 'totl_steps' (from --config.totl_steps); did you mean 'total_steps'?" in result.stderr


@pytest.mark.fast
def test_a_workdir_with_checkpoints_resumes_only_under_its_own_config(tmp_path):
  """Over checkpoints, a re-run may change how long and how often (RESUME_MAY_CHANGE), nothing that would
  continue the run with other settings; the saved config.json then stays as it was."""
  config = config_lib.from_file(ROOT / 'configs' / 'sft.py', 'smoke')
  config_lib.save(config, tmp_path)                 # a fresh workdir: written
  config.learning_rate *= 2
  config_lib.save(config, tmp_path)                 # no checkpoint yet: a new start may change anything
  saved = (tmp_path / 'config.json').read_text()
  (tmp_path / 'checkpoints' / '2').mkdir(parents=True)
  config.total_steps, config.log_every, config.mesh.data = 50, 5, 2
  config_lib.save(config, tmp_path)                 # allowed over checkpoints
  assert json.loads((tmp_path / 'config.json').read_text())['total_steps'] == 50
  saved = (tmp_path / 'config.json').read_text()
  config.learning_rate, config.seed = 5.0, 7
  with pytest.raises(errors.UserError, match=r'another config \(learning_rate, seed differ'):
    config_lib.save(config, tmp_path)
  assert (tmp_path / 'config.json').read_text() == saved
