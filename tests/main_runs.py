"""Runs of `python -m luckystar.main` in a subprocess for the end-to-end tests: uninterrupted, and
killed with SIGKILL after a step then re-run on the same workdir (docs/training.md resume)."""

import os
import pathlib
import signal
import socket
import subprocess
import sys

from luckystar.engine import checkpoint
from luckystar.engine import loop
from luckystar.engine import metrics

ROOT = pathlib.Path(__file__).resolve().parents[1]


def start(config: str, workdir, *, cache_dir, crash_after=None, overrides=(), env=None) -> subprocess.Popen:
  """`env`: extra environment variables (e.g. jax.distributed's JAX_COORDINATOR_ADDRESS)."""
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'} | dict(env or {})  # one CPU device, not 8
  env['JAX_COMPILATION_CACHE_DIR'] = str(cache_dir)                  # a re-run reuses the compiled step
  env['PYTHONHASHSEED'] = '0'   # the model iterates a set of layer types: same HLO, same cache key
  if crash_after is not None:
    env[loop.CRASH_AFTER_STEP_ENV] = str(crash_after)
  return subprocess.Popen([sys.executable, '-m', 'luckystar.main', f'--config={config}', f'--workdir={workdir}',
                           *overrides], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
  code, _, stderr = outputs(process, timeout)
  return code, stderr


def outputs(process: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
  """(return code, stdout, stderr) of a started run: stdout holds the run's printed summary."""
  stdout, stderr = process.communicate(timeout=timeout)
  return process.returncode, stdout, stderr


def params(workdir):
  return checkpoint.load_params(workdir)[1]


def steps(workdir):
  return [row['step'] for row in metrics.read(workdir)]


def whole_and_resumed(config: str, root: pathlib.Path, *, crash_after: int, overrides=()) -> dict:
  """An uninterrupted run, and one killed after step `crash_after` then re-run, of the same config; 'stdout' is
  the uninterrupted run's."""
  cache, whole, resumed = root / 'jax_cache', root / 'whole', root / 'resumed'
  code, stdout, log = outputs(start(config, whole, cache_dir=cache, overrides=overrides))
  assert code == 0, log[-3000:]
  code, log = finish(start(config, resumed, cache_dir=cache, crash_after=crash_after, overrides=overrides))
  assert code == -signal.SIGKILL, log[-3000:]
  after_crash = {'checkpoints': sorted(p.name for p in (resumed / 'checkpoints').iterdir()), 'steps': steps(resumed)}
  code, resume_log = finish(start(config, resumed, cache_dir=cache, overrides=overrides))
  assert code == 0, resume_log[-3000:]
  return {'whole': whole, 'resumed': resumed, 'after_crash': after_crash, 'resume_log': resume_log, 'stdout': stdout}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def launch_together(config: str, workdir, *, processes: int, cache_dir, crash_after=None, overrides=(),
                    timeout: float = 600) -> list[tuple[int, str]]:
  """`processes` copies of the same command on 127.0.0.1, one jax process each (`jax.distributed`, CPU
  collectives), each with one CPU device; (return code, stderr) per process."""
  env = {'JAX_COORDINATOR_ADDRESS': f'127.0.0.1:{free_port()}', 'JAX_PLATFORMS': 'cpu'}
  started = [start(config, workdir, cache_dir=cache_dir, crash_after=crash_after, env=env, overrides=(
      *overrides, f'--config.distributed.num_processes={processes}', f'--config.distributed.process_id={i}',
      '--config.distributed.initialization_timeout_s=60')) for i in range(processes)]
  try:
    return [finish(p, timeout=timeout) for p in started]
  finally:
    for p in started:   # a process still running after a failure: stop it
      if p.poll() is None:
        p.kill()
        p.communicate()
