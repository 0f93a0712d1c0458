"""`python -m luckystar.serve` in a subprocess for tests: started on a free port, its address read from the line
it prints when ready (no sleeps, no polling), stopped on demand.

    with running_server('tiny-sft') as base_url:       # 'http://127.0.0.1:PORT'
      ...
    server = start_server('tiny-sft', '--tools')      # a handle, to stop at a chosen moment
    try:
      ...server.base_url...server.rss_bytes()...
      server.stop()
    finally:
      server.stop()                                  # stopping twice is fine
"""

import contextlib
import os
import pathlib
import queue
import re
import subprocess
import sys
import threading
import time
from typing import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
READY = re.compile(r'^luckystar\.serve: (?P<name>.+) on (?P<url>http://\S+)$')


class ServerProcess:
  """A running server: base_url, the served model name, and what it printed (stdout lines after the
  ready line, stderr lines; a reader thread keeps both pipes drained)."""

  def __init__(self, process: subprocess.Popen, base_url: str, model_name: str, stdout: list[str],
               stderr: list[str]):
    self.process, self.base_url, self.model_name = process, base_url, model_name
    self.stdout, self.stderr = stdout, stderr

  def stop(self, timeout_s: float = 30) -> int:
    """SIGTERM (uvicorn shuts down gracefully), SIGKILL if it has not exited within timeout_s; the exit code.
    Safe to call again."""
    if self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(timeout_s)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()
    return self.process.returncode

  def rss_bytes(self) -> int:
    """The server process's resident memory now (VmRSS of /proc/PID/status; Linux)."""
    with open(f'/proc/{self.process.pid}/status') as status:
      kb = next(line.split()[1] for line in status if line.startswith('VmRSS:'))
    return int(kb) * 1024

  def __enter__(self) -> 'ServerProcess':
    return self

  def __exit__(self, *exc_info) -> None:
    self.stop()


def _drain(stream, lines: list[str], first: 'queue.Queue[str | None] | None') -> None:
  """Reads stream to its end into lines; with `first`, hands over the lines up to the ready line (None: ended)."""
  for line in stream:
    line = line.rstrip('\n')
    if first is not None:
      first.put(line)
      if READY.match(line):
        first = None
      continue
    lines.append(line)
  if first is not None:
    first.put(None)


def start_server(init_from: str, *extra_args: str, timeout_s: float = 180) -> ServerProcess:
  """Starts the server on 127.0.0.1 and a free port; returns once it prints its ready line (the model is loaded
  and compiled). A RuntimeError with its stderr if it exits or stays silent for timeout_s first."""
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}   # one CPU device, not conftest's 8
  env['PYTHONUNBUFFERED'] = '1'
  process = subprocess.Popen(
      [sys.executable, '-m', 'luckystar.serve', f'--init_from={init_from}', '--host=127.0.0.1', '--port=0',
       *extra_args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)
  stdout, stderr, first = [], [], queue.Queue()
  readers = [threading.Thread(target=_drain, args=(process.stdout, stdout, first), daemon=True),
             threading.Thread(target=_drain, args=(process.stderr, stderr, None), daemon=True)]
  for reader in readers:
    reader.start()
  before, deadline = [], time.monotonic() + timeout_s

  def failed(why: str) -> RuntimeError:
    process.kill()
    process.wait()
    for reader in readers:
      reader.join(5)
    return RuntimeError(f'luckystar.serve {why}:\n' + '\n'.join(before + stderr)[-3000:])

  try:
    while True:
      line = first.get(timeout=max(deadline - time.monotonic(), 0))
      if line is None:
        raise failed(f'exited with code {process.wait()} before it was ready')
      if match := READY.match(line):
        return ServerProcess(process, match['url'], match['name'], stdout, stderr)
      before.append(line)
  except queue.Empty:
    raise failed(f'printed no ready line within {timeout_s} s') from None
  except BaseException:
    process.kill()
    process.wait()
    raise


@contextlib.contextmanager
def running_server(init_from: str, *extra_args: str, timeout_s: float = 180) -> Iterator[str]:
  """The base URL of a server started for the with-block (`start_server`), stopped when it ends."""
  with start_server(init_from, *extra_args, timeout_s=timeout_s) as server:
    yield server.base_url
