"""Files a stage derives once and keeps in its workdir (prompt selection, DPO pairs and reference
log-probs, rejection-sampled traces, a finished pipeline stage), keyed by a fingerprint of what they
depend on: a re-run reuses them, and one made under other settings is never reused silently."""

import contextlib
import errno
import json
import os
import pathlib
import re
from typing import Any, Callable, Mapping, Sequence

from absl import logging
import jax

from luckystar import distributed
from luckystar import errors
from luckystar import files as files_lib
from luckystar.data import sources

Files = Mapping[str, str | bytes]   # file name in the workdir → its content

# Writes the disk refuses: out of room (a full disk, a quota, a file-size limit), or not writable.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
_TENSORSTORE_ERRNO = re.compile(r"os_error_code='?(\d+)")   # how tensorstore (orbax's arrays) reports errno
_QUOTED_PATH = re.compile(r'"(/[^"]+)"')


class WriteFailed(errors.UserError, OSError):
  """A write into the workdir that the disk refused (no room, or no permission): main prints it as one line
  naming the path, and a re-run after the fix resumes from the last complete checkpoint. Also an OSError, which
  is what callers caught before it was a UserError (its message is its only argument: no errno, so that `str`
  stays the message)."""


def write_failure(error: BaseException | None, path: str | os.PathLike | None = None) -> WriteFailed | None:
  """`error` (or one it was raised from) as a WriteFailed naming `path` (else the path the error names), when
  it is a refused write: an OSError, or tensorstore's error from orbax's background save, whose errno is in
  NO_ROOM or NOT_WRITABLE. None for anything else."""
  for _ in range(8):   # the error and the ones it was raised from
    if error is None:
      return None
    if isinstance(error, WriteFailed):
      return error
    code, where = None, None
    if isinstance(error, OSError):
      code, where = error.errno, error.filename
    elif found := _TENSORSTORE_ERRNO.search(str(error)):
      code, paths = int(found[1]), _QUOTED_PATH.findall(str(error))
      where = paths[-1] if paths else None   # the innermost: the file being written
    if code in NO_ROOM + NOT_WRITABLE:
      where, reason = path or where or 'the workdir', os.strerror(code)
      if code == errno.EFBIG:
        advice = 'a file-size limit (ulimit -f) or a full disk: raise the limit or free space there'
      elif code in NO_ROOM:
        advice = 'free space there (or use a --workdir on a disk with room)'
      else:
        advice = 'make it writable again (read-only, immutable, or not this user\'s to write)'
      return WriteFailed(f'{os.fspath(where)}: {reason}; {advice}')
    error = error.__cause__ or error.__context__
  return None


@contextlib.contextmanager
def writing(path: str | os.PathLike | None = None):
  """A refused write inside the block (`write_failure`) becomes a WriteFailed naming `path` (else the file the
  error names): Python's errors from writing an open file name no file."""
  try:
    yield
  except OSError as e:
    if (failure := write_failure(e, path)) is None:
      raise
    raise failure from None


def write_atomically(path: pathlib.Path, content: str | bytes) -> None:
  """`content` to `path` through a temporary file beside it: a crash leaves the old file or the new one, whole,
  and a refused write (a WriteFailed naming `path`) leaves the old one and no temporary file."""
  tmp = path.with_name(path.name + '.tmp')
  try:
    with writing(path):
      if isinstance(content, bytes):
        tmp.write_bytes(content)
      else:
        tmp.write_text(content, encoding='utf-8')
      tmp.replace(path)
  except BaseException:
    with contextlib.suppress(OSError):   # a read-only directory keeps it; nothing else can be done there
      tmp.unlink(missing_ok=True)
    raise


def plain(value: Any) -> Any:
  """`value` as its JSON record holds it: tuples become lists, ConfigDicts dicts."""
  return json.loads(json.dumps(value, default=lambda v: v.to_dict() if hasattr(v, 'to_dict') else str(v)))


def load_or_build(workdir: str | pathlib.Path, record_name: str, fingerprint: Mapping[str, Any],
                  build: Callable[[], tuple[dict[str, Any], Files]], *, what: str, stale: str = 'error',
                  remove: str | None = None) -> dict[str, Any]:
  """The record of an artifact in `workdir`: `build()` → (record, files) the first time, reused after.

  The record, workdir/record_name holding {'fingerprint': ..., **record}, is written after `files`, each
  atomically and by process 0 only, so its presence means the artifact is whole. A record made under
  another fingerprint is a UserError naming the keys that differ and what to `remove` to make it again
  (stale='error'), or is built again (stale='rebuild': a cache keyed by the data itself, where another key is
  simply other data)."""
  workdir, fingerprint = pathlib.Path(workdir), plain(fingerprint)
  path = workdir / record_name
  exists = path.is_file()
  distributed.barrier(f'artifact {path} looked up')   # every process decides before process 0 may write it
  if exists:
    saved = files_lib.read_json_object(path, what=f'{what} record', finite=False)
    if saved.get('fingerprint') == fingerprint:
      logging.info('%s: reusing %s', what, path)
      return saved
    if stale == 'error':
      old = saved.get('fingerprint') or {}
      differ = sorted(key for key in old.keys() | fingerprint.keys() if old.get(key) != fingerprint.get(key))
      details = ', '.join(f'{key}: {old.get(key, "<absent>")!r} there, {fingerprint.get(key, "<absent>")!r} now'
                          for key in differ[:6])
      raise errors.UserError(f'{path}: {what} made under other settings ({details}); use a new --workdir, or '
                             f'delete {remove or path} to make it again')
    logging.info('%s: %s was made for other settings; making it again', what, path)
  record, files = build()
  if jax.process_index() == 0:
    for name, content in files.items():
      write_atomically(workdir / name, content)
    write_atomically(path, json.dumps({'fingerprint': fingerprint, **record}, indent=1, ensure_ascii=False) + '\n')
  distributed.barrier(f'artifact {path}')   # the other processes may read the files next (a pipeline's next stage)
  return {'fingerprint': fingerprint, **record}


DATA_REPORT = 'data_report.json'


def write_data_report(workdir: str | pathlib.Path, reports: Sequence['sources.Report'], *, train: Sequence[str] = (),
                      evaluated: Sequence[str] = ()) -> dict[str, Any]:
  """Logs what a stage read from each source (kept, dropped by reason) and the questions its training data
  shares with its eval sets (`sources.overlap`, exact and normalised), and writes both to workdir/data_report.json
  (process 0). A shared question is a warning, not an error: a researcher may mean it."""
  shared = sources.overlap(train, evaluated)
  for report in reports:
    logging.info('data: %s', report.line())
  if shared['normalised']:
    logging.warning('data: %d eval questions are also in the training data (%d exactly, %d after normalising '
                    'case, spacing and punctuation), e.g. %r; figures on them measure recall, not generalisation',
                    shared['normalised'], shared['exact'], shared['normalised'], shared['examples'][:2])
  record = {'sources': {report.label: report.as_dict() for report in reports}, 'overlap': shared}
  if jax.process_index() == 0:
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    write_atomically(pathlib.Path(workdir) / DATA_REPORT, json.dumps(record, indent=1, ensure_ascii=False) + '\n')
  return record
