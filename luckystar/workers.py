"""Killable worker processes: the one way luckystar runs untrusted input in a child it can kill.

The math verifier (`rewards/math.py`) and the SQL sandbox (`tools/sql.py`) hand a policy's output to a library
that can hang inside C code, where no signal handler runs (sympy on `9**9**9**9`, SQLite on
`printf('%.*c', 2000000000, 'x')`), or eat all memory. So that work runs in a child:

- a fresh interpreter (`python FLAGS workers.py SPEC`, fork+exec by `subprocess`), never a `fork` of the trainer,
  whose JAX threads would not survive it, nor a `multiprocessing` spawn, which re-imports the trainer. This file
  imports only the standard library, so it is the child program too: it loads the caller's module by its path
  (that module must import only the standard library at its top as well) and gives it this file as
  `luckystar.workers`, since a child started `python -I -S` (the SQL sandbox) has no path to the package;
- capped before the caller's code loads: the `resource` limits the caller names (soft and hard, so the child
  cannot raise them; RLIMIT_FSIZE also ignores SIGXFSZ, so an oversized file is an I/O error, not a crash) and no
  core dumps; Ctrl-C ignored (the parent decides when it ends); optionally SIGKILLed by Linux when the parent
  thread that started it ends (`PR_SET_PDEATHSIG`); it also exits on stdin EOF;
- requests and replies are frames (8-byte length, then bytes the caller encodes: JSON, marshal) on its stdin and
  its real stdout; what a library prints goes to stderr. The parent reads and writes only with a deadline; when
  one passes, or the child dies mid-frame, the caller kills it (`Worker.kill`: SIGKILL) and starts another.

The caller's module names an entry function; in the child, `entry()` does the module's own setup (imports,
signal handlers) and returns the function that answers each request frame with a reply frame. If the setup
raises, the child sends the exception as its first frame and exits: `Worker.wait_until_ready` raises
SetupFailed with it.

Needs a POSIX system (poll on pipes, the resource module).
"""

import importlib.util
import json
import os
import select
import signal
import struct
import subprocess
import sys
import time
import types
import weakref
from typing import Callable, Mapping, Sequence

_HEADER = struct.Struct('>Q')   # payload length
_THIS_FILE = os.path.abspath(__file__)


class WorkerDied(RuntimeError):
  """The child exited, or closed its pipe, before a whole frame."""


class SetupFailed(WorkerDied):
  """The entry function raised in the child; the message is its exception."""


# ---- parent side ---------------------------------------------------------------------------------


def _kill(process: subprocess.Popen, owner_pid: int) -> None:
  """SIGKILL (nothing in a worker is worth a clean exit), reap, close the pipes; safe on a dead child."""
  if os.getpid() != owner_pid:
    return   # a forked copy of the owner exiting must not take the owner's worker with it
  try:
    process.kill()
  except ProcessLookupError:
    pass
  process.wait()   # after SIGKILL the kernel reaps promptly
  for pipe in (process.stdin, process.stdout):
    try:
      pipe.close()
    except OSError:
      pass   # a dead child's pipe may already be broken


class Worker:
  """One child process running `entry` of `module_file`, and its pipes; every read and write has a deadline.

  `flags` go to the interpreter (`-I -S`: no site-packages, no environment); `limits` maps `resource` names to
  values (`{'RLIMIT_AS': 3 << 30}`); `die_with_parent` asks Linux to SIGKILL the child when the thread that made
  it ends. `kill()` ends it for good (also at exit, or when the Worker is collected); calling it again is a no-op.
  """

  def __init__(self, module_file: str, entry: str, *, flags: Sequence[str] = (),
               limits: Mapping[str, int] | None = None, die_with_parent: bool = False, stderr=None):
    spec = {'module': os.path.abspath(module_file), 'entry': entry, 'limits': dict(limits or {}),
            'parent_pid': os.getpid() if die_with_parent else None}
    self.command = [sys.executable, *flags, _THIS_FILE, json.dumps(spec)]
    self.process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                    bufsize=0)
    os.set_blocking(self.process.stdin.fileno(), False)
    self.kill = weakref.finalize(self, _kill, self.process, os.getpid())
    self._ready = False

  @property
  def pid(self) -> int:
    return self.process.pid

  def alive(self) -> bool:
    return self.kill.alive and self.process.poll() is None

  def wait_until_ready(self, deadline: float) -> bool:
    """Whether the child finished its setup before `deadline` (if not, it may yet: ask again). Raises
    SetupFailed with the setup's exception, WorkerDied if the child exited."""
    if not self._ready:
      try:
        hello = self.receive(deadline)   # one small write of the child's: it arrives whole or not at all
      except TimeoutError:
        return False
      if hello:
        raise SetupFailed(hello.decode('utf-8', 'replace'))
      self._ready = True
    return True

  def ask(self, request: bytes, deadline: float) -> bytes:
    """The reply to one request frame. Raises TimeoutError past `deadline`, WorkerDied if the child exited;
    after either the child is out of step: kill it."""
    self.send(request, deadline)
    return self.receive(deadline)

  def send(self, payload: bytes, deadline: float) -> None:
    view, fd = memoryview(_HEADER.pack(len(payload)) + payload), self.process.stdin.fileno()
    try:
      while view:   # a pipe write may be partial
        _wait_for(fd, select.POLLOUT, deadline)
        view = view[os.write(fd, view):]
    except (BrokenPipeError, ConnectionError) as e:
      raise WorkerDied('the worker closed its stdin') from e

  def receive(self, deadline: float) -> bytes:
    fd = self.process.stdout.fileno()
    (length,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
    return _read_exactly(fd, length, deadline)


def _wait_for(fd: int, event: int, deadline: float) -> None:
  """Returns once fd is ready for event (select.POLLIN / POLLOUT); TimeoutError past the deadline."""
  poller = select.poll()   # poll, not select: it takes any fd number
  poller.register(fd, event)
  while (left := deadline - time.monotonic()) > 0:
    if poller.poll(min(left, 3600) * 1000):   # in slices: poll's millisecond count overflows past ~24 days
      return
  raise TimeoutError()


def _read_exactly(fd: int, size: int, deadline: float) -> bytes:
  chunks, received = [], 0
  while received < size:
    _wait_for(fd, select.POLLIN, deadline)
    chunk = os.read(fd, size - received)
    if not chunk:
      raise WorkerDied('the worker exited unexpectedly')
    chunks.append(chunk)
    received += len(chunk)
  return b''.join(chunks)


# ---- child side (runs as `python FLAGS workers.py SPEC`) -------------------------------------------


def _confine(limits: Mapping[str, int], parent_pid: int | None) -> None:
  """The caps, signal dispositions and parent-death signal of the module docstring, before any of the caller's
  code loads."""
  import resource  # pylint: disable=import-outside-toplevel  # POSIX only; the parent side works without it
  for name, value in {**limits, 'RLIMIT_CORE': 0}.items():
    limit = getattr(resource, name)
    hard = resource.getrlimit(limit)[1]
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(limit, (value, value))
  if 'RLIMIT_FSIZE' in limits:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if parent_pid is not None:
    _die_with_parent(parent_pid)


def _die_with_parent(parent_pid: int) -> None:
  """Asks Linux to SIGKILL us when the parent dies, so a hung child cannot outlive it.

  Linux means the parent *thread*: a child started from a thread that later ends dies with it (the caller starts
  another on its next call)."""
  try:
    import ctypes  # pylint: disable=import-outside-toplevel
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # 1 = PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass   # not Linux: an idle child still exits on stdin EOF
  if os.getppid() != parent_pid:
    os._exit(0)   # the parent died before prctl took effect


def _load(path: str) -> types.ModuleType:
  """The caller's module, loaded from its file alone; its `from luckystar import workers` gets this module."""
  this = sys.modules[__name__]
  package = types.ModuleType('luckystar')
  package.workers = this
  sys.modules.update({'luckystar': package, 'luckystar.workers': this})
  spec = importlib.util.spec_from_file_location('worker_module', path)
  module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _read_frame(stream) -> bytes | None:
  header = stream.read(_HEADER.size)
  if len(header) < _HEADER.size:
    return None   # the parent closed our stdin: time to go
  (length,) = _HEADER.unpack(header)
  payload = stream.read(length)
  return payload if len(payload) == length else None


def _write_frame(stream, payload: bytes) -> None:
  stream.write(_HEADER.pack(len(payload)) + payload)
  stream.flush()


def _serve(spec: dict) -> None:
  """Confines this process, runs the entry's setup, then answers request frames until stdin closes."""
  _confine(spec['limits'], spec['parent_pid'])
  # The protocol owns the real stdout; anything a library prints goes to stderr instead.
  protocol_out = os.fdopen(os.dup(1), 'wb')
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  protocol_in = sys.stdin.buffer
  try:
    answer: Callable[[bytes], bytes] = getattr(_load(spec['module']), spec['entry'])()
  except BaseException as e:  # pylint: disable=broad-except  # e.g. a library not installed: the parent says so
    _write_frame(protocol_out, f'{type(e).__name__}: {e}'.encode('utf-8', 'replace'))
    return
  _write_frame(protocol_out, b'')
  while (request := _read_frame(protocol_in)) is not None:
    _write_frame(protocol_out, answer(request))


if __name__ == '__main__':
  _serve(json.loads(sys.argv[1]))
