"""Files a stage derives once and keeps in its workdir (prompt selection, DPO pairs and reference
log-probs, rejection-sampled traces, a finished pipeline stage), keyed by a fingerprint of what they
depend on: a re-run reuses them, and one made under other settings is never reused silently."""

import json
import pathlib
from typing import Any, Callable, Mapping, Sequence

from absl import logging
import jax

from luckystar import distributed
from luckystar import errors
from luckystar.data import sources

Files = Mapping[str, str | bytes]   # file name in the workdir → its content


def write_atomically(path: pathlib.Path, content: str | bytes) -> None:
  """`content` to `path` through a temporary file beside it: a crash leaves the old file or the new one, whole."""
  tmp = path.with_name(path.name + '.tmp')
  if isinstance(content, bytes):
    tmp.write_bytes(content)
  else:
    tmp.write_text(content, encoding='utf-8')
  tmp.replace(path)


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
    saved = json.loads(path.read_text(encoding='utf-8'))
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
