"""Checkpoint integrity (issue 38): every step directory carries each process's CRC-32 of the files it wrote;
a resume, or an `init_from`, that finds a file changed, cut short or missing stops before anything is read or
written, naming the step, the file and the step to fall back to. One SFT smoke run (checkpoints 2 and 4) is
copied and damaged per case."""

import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import signal

import jax
from jax.experimental import multihost_utils
import numpy as np
import pytest

import main_runs
from luckystar import errors
from luckystar.engine import checkpoint
from luckystar.engine import state as state_lib

CONFIG = 'configs/sft.py:smoke'
SIX_STEPS = ('--config.total_steps=6',)   # checkpoints at 2, 4 and 6
LOG_LINE = re.compile(r'^[IWEF]\d{4} ')   # absl's log lines on stderr


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """A six-step smoke run killed after step 5: checkpoints/2 and checkpoints/4, both with their checksums."""
  root = tmp_path_factory.mktemp('integrity')
  code, log = main_runs.finish(main_runs.start(CONFIG, root / 'run', cache_dir=root / 'jax_cache', crash_after=5,
                                               overrides=SIX_STEPS))
  assert code == -signal.SIGKILL, log[-3000:]
  assert sorted(p.name for p in (root / 'run' / 'checkpoints').iterdir()) == ['2', '4']
  return {'workdir': root / 'run', 'cache': root / 'jax_cache'}


def _copy(run, tmp_path) -> pathlib.Path:
  """A private copy of the run to damage (step 2 hard-linked: the in-process cases only read it)."""
  workdir = tmp_path / 'run'
  shutil.copytree(run['workdir'], workdir, ignore=lambda d, _: ['2'] if pathlib.Path(d).name == 'checkpoints' else [])
  shutil.copytree(run['workdir'] / 'checkpoints' / '2', workdir / 'checkpoints' / '2', copy_function=os.link)
  return workdir


def _largest_array_file(step_dir):
  return max((step_dir / 'state').glob('ocdbt.process_0/d/*'), key=lambda p: p.stat().st_size)


def _flip_byte(path, where=0.5):
  data = bytearray(path.read_bytes())
  data[int(len(data) * where)] ^= 0x01
  path.write_bytes(bytes(data))


def _tree(workdir):
  """Every file of a workdir with the SHA-256 of its bytes."""
  return {str(p.relative_to(workdir)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(workdir.rglob('*')) if p.is_file()}


def _resume(run, workdir):
  """Re-runs the same command (a resume from step 4); (return code, stderr)."""
  return main_runs.finish(main_runs.start(CONFIG, workdir, cache_dir=run['cache'], overrides=SIX_STEPS))


def _printed(stderr):
  """stderr without absl's log lines and the progress bar: what the user reads."""
  return [line for line in stderr.splitlines() if line.strip() and not LOG_LINE.match(line) and 'step/s' not in line]


def test_every_step_carries_checksums_of_all_its_files_and_verifies(run, caplog):
  for step in ('2', '4'):
    step_dir = run['workdir'] / 'checkpoints' / step
    manifest = json.loads((step_dir / 'checksums.process_0.json').read_text())
    assert manifest['processes'] == 1
    assert sorted(manifest['files']) == checkpoint._files(step_dir) and 'state/_METADATA' in manifest['files']
    checkpoint.verify_checksums(step_dir)
  assert 'checksums' not in caplog.text


def test_a_changed_byte_stops_the_resume_naming_step_and_file_and_changes_nothing(run, tmp_path):
  """The issue's case: bytes changed inside an array file, size unchanged, restored as NaN loss before."""
  workdir = _copy(run, tmp_path)
  damaged = _largest_array_file(workdir / 'checkpoints' / '4')
  _flip_byte(damaged)
  before = _tree(workdir)
  code, stderr = _resume(run, workdir)
  assert code == 1, stderr[-3000:]
  step_dir = (workdir / 'checkpoints' / '4').absolute()
  assert _printed(stderr) == [f'error: {damaged.absolute()}: contents changed since the save (CRC-32 differs); the '
                              f'checkpoint of step 4 is corrupt: delete {step_dir} to resume from step 2']
  assert 'Traceback' not in stderr
  assert _tree(workdir) == before   # metrics.jsonl, config.json and every checkpoint byte for byte


def test_a_checkpoint_without_checksums_that_orbax_cannot_read_fails_in_one_line(run, tmp_path):
  """Checkpoints saved before checksums existed: a warning, then orbax's failure as one line, without the
  'Event loop is closed' tracebacks its abandoned reads printed at exit."""
  workdir = _copy(run, tmp_path)
  step_dir = (workdir / 'checkpoints' / '4').absolute()
  (step_dir / 'checksums.process_0.json').unlink()
  damaged = _largest_array_file(step_dir)
  damaged.write_bytes(damaged.read_bytes()[:damaged.stat().st_size // 2])
  before = _tree(workdir)
  code, stderr = _resume(run, workdir)
  assert code == 1, stderr[-3000:]
  [error] = _printed(stderr)
  assert error.startswith(f'error: {step_dir}: orbax cannot read this checkpoint (')
  assert error.endswith(f'; delete {step_dir} to resume from step 2') and len(error) < 600
  assert f'{step_dir}: no checksums (saved before luckystar wrote them' in stderr
  assert 'Traceback' not in stderr and 'Event loop is closed' not in stderr
  assert _tree(workdir) == before


def _edit_manifest(step_dir):
  path = step_dir / 'checksums.process_0.json'
  manifest = json.loads(path.read_text())
  manifest['files']['state/_METADATA'][1] = '00000000'
  path.write_text(json.dumps(manifest))


DAMAGE = {   # what is done to step 4 → what the error says (after the file's path)
    'changed byte in the data iterator position': (
        lambda d: _flip_byte(d / 'data' / 'process_0-of-1.json', 0.9), 'data/process_0-of-1.json: contents changed'),
    "changed byte in orbax's array metadata": (
        lambda d: _flip_byte(d / 'state' / '_METADATA'), 'state/_METADATA: contents changed'),
    'changed last byte of an array file': (
        lambda d: _flip_byte(_largest_array_file(d), 0.99999999), 'state/ocdbt.process_0/d/.*: contents changed'),
    'truncated array file': (
        lambda d: os.truncate(_largest_array_file(d), 4096), 'state/ocdbt.process_0/d/.*: size differs'),
    'deleted file': (
        lambda d: (d / 'state' / 'manifest.ocdbt').unlink(), 'state/manifest.ocdbt: missing'),
    'edited manifest': (_edit_manifest, 'checksums.process_0.json: checksum manifest damaged or edited'),
    'manifest cut short': (
        lambda d: os.truncate(d / 'checksums.process_0.json', 100), 'checksums.process_0.json: checksum manifest damaged'),
}


@pytest.mark.parametrize('case', DAMAGE)
def test_damage_is_refused_naming_the_file_and_the_step_to_fall_back_to(run, tmp_path, case):
  workdir = _copy(run, tmp_path)
  step_dir = (workdir / 'checkpoints' / '4').absolute()
  damage, message = DAMAGE[case]
  damage(step_dir)
  where = re.escape(str(step_dir))
  with pytest.raises(checkpoint.CheckpointError, match=f'^{where}/{message}.*delete {where} to resume from step 2$'):
    checkpoint.verify_checksums(step_dir)
  with pytest.raises(checkpoint.CheckpointError, match=f'^{where}/{message}.*delete {where} to load step 2$'):
    checkpoint.load_params(workdir)   # init_from a damaged run
  assert not list(workdir.glob('checkpoints/*/*.tmp'))


def test_a_missing_manifest_or_an_added_file_warns_and_restores(run, tmp_path, caplog):
  """A step without checksums was saved before they existed (or the run was killed while writing them):
  restored with a warning, like an added file that no checksum lists; orbax reads neither."""
  workdir = _copy(run, tmp_path)
  step_dir = (workdir / 'checkpoints' / '4').absolute()
  want = jax.tree.leaves(checkpoint.load_params(workdir)[1])
  (step_dir / 'state' / 'notes.txt').write_text('added later')
  with caplog.at_level(logging.WARNING):
    checkpoint.verify_checksums(step_dir)
  assert f'{step_dir}: state/notes.txt not in its checksums (added after the save); ignored' in caplog.text
  (step_dir / 'checksums.process_0.json').unlink()
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    got = jax.tree.leaves(checkpoint.load_params(workdir)[1])
  assert f'{step_dir}: no checksums (saved before luckystar wrote them' in caplog.text
  assert all(np.array_equal(a, b) for a, b in zip(want, got))


def test_init_from_that_holds_no_checkpoint_is_one_error_naming_the_path(run, tmp_path):
  a_file, empty = tmp_path / 'params.npz', tmp_path / 'empty'
  a_file.write_bytes(b'not a checkpoint')
  empty.mkdir()
  no_checkpoints = tmp_path / 'started'   # a run that stopped before its first checkpoint
  (no_checkpoints / 'checkpoints').mkdir(parents=True)
  config_only = tmp_path / 'config_only'   # ... or before orbax made its checkpoints/
  config_only.mkdir()
  (config_only / 'config.json').write_text(json.dumps({'stage': 'sft'}))
  no_state = tmp_path / 'no_state'
  shutil.copytree(run['workdir'] / 'checkpoints' / '4' / 'model_config', no_state / 'model_config')
  cases = {a_file: 'not a directory', tmp_path / 'nowhere': 'no such directory', empty: 'no complete checkpoint',
           no_checkpoints: 'no complete checkpoint', no_checkpoints / 'checkpoints': 'no complete checkpoint',
           config_only: 'no complete checkpoint', no_state: r'an incomplete checkpoint \(no state/'}
  for path, message in cases.items():
    with pytest.raises(checkpoint.CheckpointError, match=f'^{re.escape(str(path))}: {message}') as error:
      checkpoint.load_params(path)
    assert '\n' not in str(error.value)
  # As config.init_from (what main prints as `error: <message>`): one line naming the path, for each.
  for path in (a_file, empty, no_checkpoints, config_only, no_state):
    with pytest.raises(errors.UserError, match=f'^{re.escape(str(path))}: ') as error:
      state_lib.initial_model(str(path))
    assert '\n' not in str(error.value)


def test_each_process_hashes_its_own_files_and_all_stop_on_any_share(run, tmp_path, monkeypatch):
  """Two processes (simulated): the manifests split the files by the process index in their names, and when
  one process's share is damaged the other, whose share is intact, stops with the same message."""
  workdir = _copy(run, tmp_path)
  step_dir = (workdir / 'checkpoints' / '4').absolute()
  (step_dir / 'checksums.process_0.json').unlink()
  other = step_dir / 'state' / 'ocdbt.process_1' / 'd' / 'data'   # what process 1 would have written
  other.parent.mkdir(parents=True)
  other.write_bytes(os.urandom(1000))
  shutil.copy(step_dir / 'data' / 'process_0-of-1.json', step_dir / 'data' / 'process_1-of-2.json')
  manifests = [json.loads(checkpoint.write_checksums(step_dir, i, 2).read_text())['files'] for i in range(2)]
  assert sorted(manifests[1]) == ['data/process_1-of-2.json', 'state/ocdbt.process_1/d/data']
  assert sorted(manifests[0] | manifests[1]) == checkpoint._files(step_dir) and not manifests[0].keys() & manifests[1]

  _flip_byte(_largest_array_file(step_dir))
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  codes, errors = {}, {}
  for index in range(2):   # each alone: only the one whose share holds the damaged file sees it
    monkeypatch.setattr(jax, 'process_index', lambda: index)
    monkeypatch.setattr(multihost_utils, 'process_allgather', lambda code: codes.setdefault(index, code))
    try:
      checkpoint.verify_checksums(step_dir, shared=True)
    except checkpoint.CheckpointError as e:
      errors[index] = str(e)
  [damaged_share] = errors
  clean_share = 1 - damaged_share
  monkeypatch.setattr(jax, 'process_index', lambda: clean_share)
  monkeypatch.setattr(multihost_utils, 'process_allgather', lambda code: np.array([codes[0], codes[1]]))
  with pytest.raises(checkpoint.CheckpointError) as error:
    checkpoint.verify_checksums(step_dir, shared=True)
  assert str(error.value) == errors[damaged_share] and 'contents changed' in str(error.value)
