"""Two processes on loopback with `jax.distributed` (CPU collectives: gloo) train the SFT smoke config
to the same loss curve as one process, and write and restore the checkpoints together: both are
killed after step 3 and re-run, and resume from the step-2 checkpoint."""

import signal

import numpy as np
import pytest

import main_runs
from luckystar.engine import checkpoint
from luckystar.engine import metrics

CONFIG = 'configs/sft.py:smoke'
PROCESSES = 2
TIMEOUT_S = 300   # per launch; initialisation itself gives up after 60 s


def launch_together(workdir, cache_dir, *, crash_after=None) -> list[tuple[int, str]]:
  return main_runs.launch_together(CONFIG, workdir, processes=PROCESSES, cache_dir=cache_dir, crash_after=crash_after,
                                   timeout=TIMEOUT_S)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp('multiprocess')
  cache, one, two = root / 'jax_cache', root / 'one_process', root / 'two_processes'
  single = main_runs.start(CONFIG, one, cache_dir=cache, env={'JAX_PLATFORMS': 'cpu'})
  crashed = launch_together(two, cache, crash_after=3)
  code, log = main_runs.finish(single)
  assert code == 0, log[-3000:]
  after_crash = sorted(p.name for p in (two / 'checkpoints').iterdir())
  data_files = sorted(p.name for p in (two / 'checkpoints' / '2' / checkpoint.DATA).iterdir())
  resumed = launch_together(two, cache)
  return {'one': one, 'two': two, 'crashed': crashed, 'after_crash': after_crash, 'data_files': data_files,
          'resumed': resumed}


def test_two_processes_give_the_one_process_loss_curve(runs):
  for code, log in runs['resumed']:
    assert code == 0, log[-3000:]
  one, two = metrics.read(runs['one']), metrics.read(runs['two'])   # metrics.jsonl: process 0 writes it
  assert [row['step'] for row in two] == [row['step'] for row in one] == list(range(5))
  for name in ('train/loss', 'train/grad_norm', 'eval/loss'):
    curve = lambda rows: [row[name] for row in rows if name in row]
    assert len(curve(one)) >= 3, name
    np.testing.assert_allclose(curve(two), curve(one), rtol=1e-5, err_msg=name)
  assert one[-1]['train/loss'] < one[1]['train/loss']   # it trains: the curve can tell runs apart
  for a, b in zip(*(checkpoint.load_params(run)[1]['layers']['layer_0']['mlp']['up_proj']['kernel']
                    for run in (runs['one'], runs['two']))):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def test_every_process_writes_and_restores_the_checkpoint(runs):
  for code, log in runs['crashed']:   # each kills itself after step 3; jax.distributed aborts one whose peer died first
    assert code in (-signal.SIGKILL, -signal.SIGABRT), log[-3000:]
  assert -signal.SIGKILL in [code for code, _ in runs['crashed']]
  assert runs['after_crash'] == ['2']
  assert len([n for n in runs['data_files'] if n.startswith('process_')]) == PROCESSES, runs['data_files']
  for code, log in runs['resumed']:
    assert code == 0 and 'resumed from' in log and 'at step 2' in log, log[-3000:]
