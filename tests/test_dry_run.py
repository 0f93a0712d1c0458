"""`python -m luckystar.main ... --dry_run`: checks a command in seconds, prints what would run, writes nothing."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from luckystar import config as config_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tests'))
import data_files  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(*args: str) -> subprocess.CompletedProcess:
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=2', 'JAX_PLATFORMS': 'cpu'}
  return subprocess.run([sys.executable, '-m', 'luckystar.main', *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)


def test_dry_run_resolves_open_keys_and_writes_nothing(tmp_path):
  workdir = tmp_path / 'run'
  proc = main('--config=configs/rlvr.py:smoke', f'--workdir={workdir}', '--dry_run',
              '--config.rlvr.selection_prompts=8', '--config.model_overrides.param_dtype=bfloat16',
              '--config.model_overrides.sliding_window=32')
  assert proc.returncode == 0, proc.stderr
  config = json.loads(proc.stdout[:proc.stdout.rindex('}') + 1])
  assert config['rlvr']['selection_prompts'] == 8
  assert config['model_overrides'] == {'param_dtype': 'bfloat16', 'sliding_window': 32}
  assert proc.stdout.strip().splitlines()[-1] == f'would run: stage rlvr, 3 steps from tiny-sft, writing {workdir}'
  assert not workdir.exists()
  assert 'Unable to initialize backend' not in proc.stderr, proc.stderr


@pytest.mark.parametrize('flag, message', [
    ('--config.mesh.tensor=0', 'config.mesh.data=-1, config.mesh.fsdp=1, config.mesh.tensor=0: each size must be'),
    ('--config.mesh.data=3', '(2 cpu device(s) here); the sizes must multiply to 2'),
    ('--config.model_overrides.num_hedas=2', "'num_hedas' is not a ModelConfig field"),
    ('--config.rlvr.sources=math_jsonl:/no/such.jsonl', '/no/such.jsonl: no such file (config.rlvr.sources'),
    ('--config.init_from=/no/such/model', "config.init_from='/no/such/model': /no/such/model: no such bundled"),
])
def test_dry_run_bad_input_is_one_error_line(tmp_path, flag, message):
  proc = main('--config=configs/rlvr.py:smoke', f'--workdir={tmp_path}/run', '--dry_run', flag)
  assert proc.returncode == 1 and proc.stderr.strip().count('\n') == 0, proc.stderr
  assert proc.stderr.startswith('error: ') and message in proc.stderr, proc.stderr


def test_sft_without_held_out_data_says_so(tmp_path):
  chats = data_files.write_all(tmp_path / 'data')['chat_jsonl']
  proc = main('--config=configs/sft.py:smoke', f'--workdir={tmp_path}/run', '--dry_run',
              f'--config.sft.sources=chat_jsonl:{chats}')
  assert proc.returncode == 0, proc.stderr
  notes = [line for line in proc.stdout.splitlines() if line.startswith('note: ')]
  assert len(notes) == 1 and 'config.sft.eval_sources' in notes[0], proc.stdout


def test_help_lists_variants_and_keys():
  proc = main('--config=configs/sft.py', '--help')
  assert 'variants: configs/sft.py, configs/sft.py:base, configs/sft.py:teacher, configs/sft.py:smoke' in proc.stdout
  assert '  total_steps: 1200' in proc.stdout and '--[no]dry_run' in proc.stdout, proc.stdout


@pytest.mark.fast
def test_variants_are_read_from_each_config():
  assert config_lib.variants(ROOT / 'configs/rlvr.py') == ['smoke']
  for path in sorted((ROOT / 'configs').glob('*.py')):
    for variant in config_lib.variants(path):
      config_lib.from_file(path, variant)   # each listed variant loads
