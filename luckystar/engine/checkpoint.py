"""Checkpoints under `workdir/checkpoints/<step>/` (orbax), atomic and resumable.

Each step directory holds three items:
  state/         the TrainState (params, optimizer state, step, RNG key, skipped-update count)
  data/          the grain iterator position (grain's own orbax handler: one JSON per process)
  model_config/  the ModelConfig as JSON, so a checkpoint directory is loadable on its own

and beside them one `checksums.process_<i>.json` per process: the size and CRC-32 of every file that
process wrote (per-process files carry the process index in their names; process 0 takes the rest).
They are written once the step is complete on every process and checked before anything is read, so
bytes changed inside a file stop the run with the file's name instead of restoring garbage.

orbax writes a step into a temporary directory and renames it when complete, so a run killed
mid-save leaves the previous checkpoint as the latest. A save the disk refuses (full, or made read-only) is
an artifacts.WriteFailed naming the file (`save`, `wait_until_saved`): the partial step directory is removed
and the previous checkpoint stays the resume point.
"""

import concurrent.futures
import contextlib
import json
import logging as logging_std
import os
import pathlib
import re
import shutil
import sys
import traceback
from typing import Any, Sequence
import zlib

from absl import logging
import grain
import grain.checkpoint  # registers CheckpointSave / CheckpointRestore with orbax
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from luckystar import errors
from luckystar import files
from luckystar import model
from luckystar import tokenizer as tokenizer_lib
from luckystar.engine import artifacts

STATE, DATA, MODEL_CONFIG = 'state', 'data', 'model_config'
TOKENIZER_DIR = 'tokenizer'                  # in a workdir: the run's tokenizer files and TOKENIZER_RECORD
TOKENIZER_RECORD = 'luckystar_tokenizer.json'


class CheckpointError(errors.UserError):
  """A checkpoint that exists but cannot be restored into this run."""


def directory(workdir: str | pathlib.Path) -> pathlib.Path:
  return pathlib.Path(workdir).absolute() / 'checkpoints'


CHECKSUMS_PREFIX = 'checksums.'
_CHECKSUMS_FORMAT = 'luckystar checksums 1: file -> [bytes, crc32]'
# orbax's per-process files: state/ocdbt.process_<i>/..., state/array_metadatas/process_<i>, grain's
# data/process_<i>-of-<n>.json.
_PROCESS_IN_NAME = re.compile(r'(?:^|[/.])process_(\d+)(?=$|[/.-])')
_READ_CHUNK = 16 << 20
_PARTIAL = '.orbax-checkpoint-tmp'   # how orbax names a step directory until it is complete
MAX_MANIFEST_BYTES = 64 << 20   # ~100 bytes a file; orbax writes a few dozen files a step
MAX_RECORD_BYTES = 16 << 20     # a run's tokenizer record and config.json: a few kB


class _Manager(ocp.CheckpointManager):
  """orbax's manager, plus each process's checksums of a step once the step is complete.

  `_finalize_checkpoint` runs on every process in orbax's save-finalize thread, after every process's
  files are written and the step directory is renamed into place, and before `wait_until_finished`
  returns anywhere (a barrier follows it): the hashes are of the final files, off the training thread."""

  def _finalize_checkpoint(self, step: int):
    result = super()._finalize_checkpoint(step)
    step_dir = pathlib.Path(str(self.directory)) / str(step)
    if step_dir.is_dir():   # absent when the save failed; orbax reports that
      write_checksums(step_dir, jax.process_index())
    return result


def _owner(relative: str) -> int:
  """The process that hashes a file at save (the one that wrote it, as far as its name tells)."""
  found = _PROCESS_IN_NAME.search(relative)
  return int(found[1]) if found else 0


def _files(step_dir: pathlib.Path) -> list[str]:
  """Every file of a step directory but the checksum manifests, as sorted relative paths."""
  return sorted(str(p.relative_to(step_dir)) for p in step_dir.rglob('*')
                if p.is_file() and not p.name.startswith(CHECKSUMS_PREFIX))


def _crc32(path: pathlib.Path) -> str:
  crc, buffer = 0, bytearray(_READ_CHUNK)
  view = memoryview(buffer)
  with open(path, 'rb', buffering=0) as f:
    while size := f.readinto(buffer):
      crc = zlib.crc32(view[:size], crc)
  return f'{crc:08x}'


def _hash(step_dir: pathlib.Path, relatives: list[str]) -> dict[str, list]:
  """{relative path: [bytes, crc32]}; files in parallel (zlib releases the GIL while it hashes)."""
  def one(relative):
    path = step_dir / relative
    return relative, [path.stat().st_size, _crc32(path)]
  with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
    return dict(pool.map(one, relatives))


def _sealed(body: dict) -> str:
  """A manifest's own CRC: an edited or damaged manifest is told apart from damaged data."""
  return f'{zlib.crc32(json.dumps(body, sort_keys=True).encode()):08x}'


def manifest_path(step_dir: pathlib.Path, process: int) -> pathlib.Path:
  return step_dir / f'{CHECKSUMS_PREFIX}process_{process}.json'


def write_checksums(step_dir: pathlib.Path, process: int, process_count: int | None = None) -> pathlib.Path:
  """Hashes the files of a complete step directory that `process` wrote and writes its manifest atomically."""
  process_count = jax.process_count() if process_count is None else process_count
  mine = [f for f in _files(step_dir) if _owner(f) % process_count == process]
  body = {'format': _CHECKSUMS_FORMAT, 'process': process, 'processes': process_count,
          'files': _hash(step_dir, mine)}
  path = manifest_path(step_dir, process)
  artifacts.write_atomically(path, json.dumps(body | {'sealed': _sealed(body)}, indent=1, sort_keys=True) + '\n')
  return path


def _advice(step_dir: pathlib.Path, use: str) -> str:
  """What to do about a bad step directory (`use`: 'resume from' or 'load'): fall back to the step before it."""
  step = int(step_dir.name) if step_dir.name.isdigit() else None
  earlier = [s for s in ocp.step.checkpoint_steps(step_dir.parent) if step is not None and s < step]
  if earlier:
    return f'delete {step_dir} to {use} step {max(earlier)}'
  if use == 'load':
    return 'there is no earlier checkpoint beside it to load; point init_from at another checkpoint'
  return f'there is no earlier checkpoint; delete {step_dir} to start over, or use a new --workdir'


def _read_manifests(step_dir: pathlib.Path, manifests: Sequence[pathlib.Path], use: str) -> tuple[dict, int]:
  """(file name → (size, CRC-32), the saving run's process count) of intact manifests from one run, or a
  CheckpointError naming the damaged manifest or the mix of runs."""
  expected, process_counts = {}, set()
  for path in manifests:
    try:
      saved = files.read_json(path, MAX_MANIFEST_BYTES, 'checksum manifest')
    except errors.InvalidFile as e:   # not a regular file, too large, nested too deeply, not JSON
      raise CheckpointError(f'{path}: checksum manifest damaged or edited ({str(e).removeprefix(f"{path}: ")}), '
                            f'so {step_dir} cannot be verified; {_advice(step_dir, use)}') from None
    try:
      body = {k: v for k, v in saved.items() if k != 'sealed'}
      intact = (saved['sealed'] == _sealed(body) and saved['format'] == _CHECKSUMS_FORMAT
                and path == manifest_path(step_dir, saved['process']))
    except (ValueError, KeyError, TypeError, AttributeError):   # not JSON, or not our manifest's shape
      intact = False
    if not intact:
      raise CheckpointError(f'{path}: checksum manifest damaged or edited, so {step_dir} cannot be verified; '
                            f'{_advice(step_dir, use)}')
    process_counts.add(saved['processes'])
    expected.update(saved['files'])
  if len(process_counts) != 1:
    raise CheckpointError(f'{step_dir}: its checksum manifests come from different runs ({len(process_counts)} '
                          f'process counts); {_advice(step_dir, use)}')
  return expected, process_counts.pop()


def verify_checksums(step_dir: pathlib.Path, *, use: str = 'resume from', shared: bool = False) -> None:
  """Checks a step directory against its checksum manifests before orbax reads it.

  A changed, truncated or missing file, or a damaged manifest, is a CheckpointError naming the file and the
  step to fall back to; a step without manifests (saved before they existed, or killed between orbax's commit
  and their writing) or with files no manifest lists is restored with a one-line warning, as nothing that
  orbax wrote is known to be wrong. `shared`: every process calls this together and hashes only its share."""
  step_dir = pathlib.Path(step_dir)
  manifests = sorted(step_dir.glob(f'{CHECKSUMS_PREFIX}process_*.json'))
  if not manifests:
    logging.warning('%s: no checksums (saved before luckystar wrote them, or stopped while writing them); '
                    'restoring it unverified', step_dir)
    return
  expected, processes = _read_manifests(step_dir, manifests, use)
  absent = [i for i in range(processes) if not manifest_path(step_dir, i).is_file()]
  unlisted = [f for f in _files(step_dir) if f not in expected]
  if absent:
    logging.warning('%s: no checksums from process %s (stopped while writing them?); its files are restored '
                    'unverified', step_dir, ', '.join(map(str, absent)))
  elif unlisted:
    logging.warning('%s: %s not in its checksums (added after the save); ignored', step_dir,
                    ', '.join(unlisted[:3]) + (f' and {len(unlisted) - 3} more' if len(unlisted) > 3 else ''))

  names = sorted(expected)
  index = {n: i for i, n in enumerate(names)}
  mine = names
  if shared and jax.process_count() > 1:   # largest files first, dealt round-robin: even shares
    mine = sorted(names, key=lambda n: (-expected[n][0], n))[jax.process_index()::jax.process_count()]
  present = [n for n in mine if (step_dir / n).is_file() and (step_dir / n).stat().st_size == expected[n][0]]
  hashes = _hash(step_dir, present)
  kinds = ('missing', 'size', 'contents')
  problems = [index[n] * len(kinds) + (0 if not (step_dir / n).is_file() else 1 if n not in hashes else 2)
              for n in mine if hashes.get(n) != expected[n]]
  first = min(problems, default=len(names) * len(kinds))
  if shared and jax.process_count() > 1:   # every process stops, with the same message
    first = int(np.min(multihost_utils.process_allgather(np.int32(first))))
  if first == len(names) * len(kinds):
    return
  name, kind = names[first // len(kinds)], kinds[first % len(kinds)]
  what = {'missing': 'missing, though listed in its checksums',
          'size': f'size differs from the {expected[name][0]} bytes saved (truncated or overwritten)',
          'contents': 'contents changed since the save (CRC-32 differs)'}[kind]
  raise CheckpointError(f'{step_dir / name}: {what}; the checkpoint of step {step_dir.name} is corrupt: '
                        f'{_advice(step_dir, use)}')


def manager(workdir: str | pathlib.Path, *, keep: int) -> ocp.CheckpointManager:
  """Saves where asked (the loop decides when) and keeps the last `keep` steps. `keep` (config.keep_checkpoints)
  below 1 is a UserError, raised before anything is read, written or deleted: orbax would delete every
  checkpoint (0) or fail deep inside (negative), and a re-run would start over from step 0."""
  if keep < 1:
    raise errors.UserError(f'config.keep_checkpoints={keep} keeps no checkpoint to resume from; use 1 or more')
  # Step directories made on the calling thread: made in the background, a refused mkdir (a read-only
  # checkpoints/) leaves orbax's other threads waiting 5 minutes for it before the error surfaces. Partial
  # step directories a failed save left behind are removed when the next run opens the manager.
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=True, cleanup_tmp_directories=True,
      async_options=ocp.AsyncOptions(create_directories_asynchronously=False))
  _drop_abandoned_reads()   # and writes: a save that fails abandons its other arrays' writes the same way
  handlers = {STATE: ocp.StandardCheckpointHandler(), DATA: grain.checkpoint.CheckpointHandler(),
              MODEL_CONFIG: ocp.JsonCheckpointHandler()}
  return _Manager(directory(workdir), options=options, item_handlers=handlers)


def latest_step(workdir: str | pathlib.Path) -> int | None:
  """The step of the latest complete checkpoint under `workdir`, None if there is none.

  A directory listing, not a CheckpointManager: a manager's constructor is a barrier of all
  processes, and processes of a multi-process run ask this at different moments."""
  if not directory(workdir).is_dir():
    return None
  return max(ocp.step.checkpoint_steps(directory(workdir)), default=None)


def save(checkpoints: ocp.CheckpointManager, state: Any, iterator: grain.DatasetIterator,
         model_config: model.ModelConfig | None = None) -> None:
  """Starts saving `state` at its step: arrays are written in the background, the iterator position
  now (the loop moves the iterator on right after). A refused write, of this save or of the one before it
  (orbax waits for that first), is an artifacts.WriteFailed naming the path (`wait_until_saved`)."""
  items = {STATE: ocp.args.StandardSave(state), DATA: grain.checkpoint.CheckpointSave(iterator)}
  if model_config is not None:
    items[MODEL_CONFIG] = ocp.args.JsonSave(model_config.to_dict())
  with _refused_writes(checkpoints):
    checkpoints.save(int(state.step), args=ocp.args.Composite(**items))


def wait_until_saved(checkpoints: ocp.CheckpointManager) -> None:
  """Waits for the save in the background. A write the disk refused there (no room, no permission) is an
  artifacts.WriteFailed naming the file, and the partial step directory is removed (it holds what room there
  was); the latest complete step stays the latest."""
  with _refused_writes(checkpoints):
    checkpoints.wait_until_finished()


@contextlib.contextmanager
def _refused_writes(checkpoints: ocp.CheckpointManager):
  try:
    yield
  except Exception as e:   # OSError from orbax's own code, ValueError carrying tensorstore's errno
    if (failure := artifacts.write_failure(e)) is None:
      raise
    if jax.process_index() == 0:
      for partial in pathlib.Path(str(checkpoints.directory)).glob(f'*{_PARTIAL}*'):
        shutil.rmtree(partial, ignore_errors=True)
    raise failure from None


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """'opt_state/1/0/mu/embedding' → shape; the same names for a live state and orbax's metadata."""
  def name(key):
    return str(getattr(key, 'name', getattr(key, 'key', getattr(key, 'idx', key))))
  return {'/'.join(map(name, path)): tuple(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _check_compatible(saved: Any, abstract_state: Any, path: pathlib.Path) -> None:
  """Same arrays and shapes, or an error that names the checkpoint (orbax's own is a deep traceback)."""
  saved_shapes, wanted_shapes = _shapes(saved), _shapes(abstract_state)
  if saved_shapes != wanted_shapes:
    differ = sorted(k for k in saved_shapes.keys() | wanted_shapes.keys()
                    if saved_shapes.get(k) != wanted_shapes.get(k))
    details = ', '.join(f'{k}: saved {saved_shapes.get(k)} vs run {wanted_shapes.get(k)}' for k in differ[:3])
    raise CheckpointError(
        f'{path}: checkpoint does not fit this run ({len(differ)} arrays differ, e.g. {details}); '
        f'the config changed since it was written. Use a new --workdir, or delete {path.parent} to start over')


def _drop_abandoned_reads() -> None:
  """Called before orbax reads or writes a checkpoint. When a read (or a write: a full disk) fails, orbax gives up
  on the others: they end later (at exit, or during some later test) failing in coroutines and futures nobody
  awaits, or calling back into the closed asyncio loop, and each would print a traceback after the one-line
  error."""
  if not isinstance(sys.unraisablehook, _AbandonedReadsDropped):
    sys.unraisablehook = _AbandonedReadsDropped(sys.unraisablehook)
  asyncio_logger = logging_std.getLogger('asyncio')   # "exception was never retrieved"
  if not any(isinstance(f, _AbandonedReadsDropped) for f in asyncio_logger.filters):
    asyncio_logger.addFilter(_AbandonedReadsDropped(None))


def _a_failed_read(error: BaseException | None) -> bool:
  """An error of orbax's reading: raised in orbax's code, or tensorstore's own (set on a future from C++)."""
  for _ in range(8):   # the error and the ones it was raised from
    if error is None:
      return False
    if (any(f'{os.sep}orbax{os.sep}' in frame.filename for frame in traceback.extract_tb(error.__traceback__))
        or 'OCDBT' in str(error) or 'TensorStore' in str(error)):
      return True
    error = error.__cause__ or error.__context__
  return False


class _AbandonedReadsDropped(logging_std.Filter):
  """An unraisable-exception hook (wrapping `hook`) and a log filter that drop the errors of orbax's abandoned
  reads, and asyncio's 'Event loop is closed' from their callbacks, and pass on the rest."""

  def __init__(self, hook):
    super().__init__()
    self.hook = hook

  def __call__(self, unraisable):
    closed_loop = isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == 'Event loop is closed'
    if not (closed_loop or _a_failed_read(unraisable.exc_value)):
      self.hook(unraisable)

  def filter(self, record: logging_std.LogRecord) -> bool:
    return not (record.exc_info and _a_failed_read(record.exc_info[1]))


def _orbax_failure(step_dir: pathlib.Path, error: Exception, use: str) -> CheckpointError:
  """One line for orbax's failure to read a step: its own message can run to a 60-line TensorStore spec."""
  reason = (str(error).split('See full TensorStore details')[0].strip().splitlines() or [''])[0][:240].rstrip('. ')
  array = re.findall(r"'path': '([^'/]+)/'", str(error))   # the array's key in the spec, when there is one
  return CheckpointError(f'{step_dir}: orbax cannot read this checkpoint ({type(error).__name__}: {reason}'
                         f'{f" in array {array[-1]}" if array else ""}); {_advice(step_dir, use)}')


def restore_latest(checkpoints: ocp.CheckpointManager, state: Any, iterator: grain.DatasetIterator) -> Any | None:
  """The latest checkpoint restored with `state`'s shapes and shardings (None if there is none);
  `iterator` is moved to the saved position in place. Every process calls it: its files are verified
  against their checksums first, each process hashing a share."""
  step = checkpoints.latest_step()
  if step is None:
    return None
  path = pathlib.Path(str(checkpoints.directory)) / str(step)
  verify_checksums(path, shared=True)
  _drop_abandoned_reads()
  abstract_state = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  try:
    saved = checkpoints.item_metadata(step)[STATE]
    if saved is None:
      raise ValueError(f'no {STATE!r} item')
  except Exception as e:  # orbax raises many types for unreadable metadata
    raise _orbax_failure(path, e, 'resume from') from e
  _check_compatible(saved, abstract_state, path)
  try:
    restored = checkpoints.restore(step, args=ocp.args.Composite(**{
        STATE: ocp.args.StandardRestore(abstract_state),
        DATA: grain.checkpoint.CheckpointRestore(iterator)}))
  except Exception as e:
    raise _orbax_failure(path, e, 'resume from') from e
  return restored[STATE]


def is_run_dir(path: pathlib.Path) -> bool:
  """A luckystar run directory, its `checkpoints/`, or one step directory in it; also a run directory that
  has no checkpoint yet (its config.json names a stage), so that loading it says so."""
  return ((path / 'checkpoints').is_dir() or (path.name == 'checkpoints' and path.is_dir())
          or (path / MODEL_CONFIG).is_dir() or _names_a_stage(path / 'config.json'))


def _workdir_of(path: pathlib.Path) -> pathlib.Path:
  """The run directory of a run directory, its checkpoints/ or one step directory in it."""
  if (path / STATE).is_dir() or (path / MODEL_CONFIG).is_dir():
    return path.parent.parent
  return path.parent if path.name == 'checkpoints' else path


def save_tokenizer(workdir: str | pathlib.Path, tokenizer: tokenizer_lib.Tokenizer) -> None:
  """workdir/tokenizer/: the run's tokenizer files and what it is (backend, chat format, fingerprint), so the
  run's checkpoints load with the tokenizer they were trained with. Process 0 writes, each file atomically."""
  if jax.process_index() != 0:
    return
  directory_ = pathlib.Path(workdir) / TOKENIZER_DIR
  directory_.mkdir(parents=True, exist_ok=True)
  files = {**tokenizer.files(), TOKENIZER_RECORD: json.dumps(tokenizer.describe(), indent=1) + '\n'}
  for name, content in files.items():
    artifacts.write_atomically(directory_ / name, content)


def tokenizer_dir(path: str | pathlib.Path) -> pathlib.Path:
  """Where a run directory (or its checkpoints/, or a step in it) records its tokenizer."""
  return _workdir_of(pathlib.Path(path).absolute()) / TOKENIZER_DIR


def load_tokenizer(path: str | pathlib.Path, chat_format: str = 'auto') -> tokenizer_lib.Tokenizer:
  """The tokenizer a run directory (or its checkpoints/, or a step in it) recorded; the bundled one for a run
  that recorded none (runs of the bundled models made before runs recorded their tokenizer)."""
  directory_ = tokenizer_dir(path)
  record = directory_ / TOKENIZER_RECORD
  if not os.path.lexists(record):
    return tokenizer_lib.default()
  try:
    recorded = files.read_json(record, MAX_RECORD_BYTES, 'tokenizer record')['chat_format']
    tokenizer = tokenizer_lib.from_dir(directory_, recorded if chat_format == 'auto' else chat_format)
  except errors.InvalidFile:
    raise   # names the file already
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise errors.InvalidFile(f'{directory_}: cannot read the run\'s tokenizer ({e})') from None
  if tokenizer is None:
    raise errors.InvalidFile(f'{directory_}: no tokenizer files beside {TOKENIZER_RECORD}')
  return tokenizer


def _names_a_stage(config_file: pathlib.Path) -> bool:
  """Whether a run's config.json is there; one that is a FIFO or a device is an InvalidFile naming it (reading
  it would block or never end), one that is not JSON is not a run's (hf.read_config reports it)."""
  if not os.path.lexists(config_file):
    return False
  files.regular_file(config_file, 'config.json')
  try:
    return 'stage' in files.read_json(config_file, MAX_RECORD_BYTES, 'config.json')
  except (errors.InvalidFile, TypeError):   # unreadable, or not a JSON object
    return False


_LOADABLE = 'expected a luckystar run directory, its checkpoints/ or one step directory in it'


def _step_dir(path: pathlib.Path) -> pathlib.Path:
  """The step directory itself, or the latest complete one under a run or checkpoints directory."""
  if not path.is_dir():
    raise CheckpointError(f'{path}: {"not a directory" if path.exists() else "no such directory"}; {_LOADABLE}')
  if not ((path / STATE).is_dir() or (path / MODEL_CONFIG).is_dir()):
    workdir = path.parent if path.name == 'checkpoints' else path
    step = latest_step(workdir)
    if step is None:
      raise CheckpointError(f'{path}: no complete checkpoint in it (a run that stopped before its first checkpoint, '
                            f'or not a run directory); {_LOADABLE}')
    path = directory(workdir) / str(step)
  if not (path / STATE).is_dir():
    raise CheckpointError(f'{path}: an incomplete checkpoint (no {STATE}/ in it); load an earlier step directory '
                          f'beside it instead')
  if not (path / MODEL_CONFIG).is_dir():
    raise CheckpointError(f'{path}: a checkpoint without {MODEL_CONFIG}/ (its stage saved no model config), so '
                          f'its params cannot be loaded as a model')
  return path


def load_params(path: str | pathlib.Path) -> tuple[model.ModelConfig, Any]:
  """(model config, params) of the latest checkpoint under a run directory (or of a step directory);
  only the params are read, not the optimizer state, onto the default device (the caller shards them).
  The step's files are verified against their checksums first (all of them, by this process alone)."""
  step_dir = _step_dir(pathlib.Path(path).absolute())
  verify_checksums(step_dir, use='load')
  _drop_abandoned_reads()
  try:
    model_config = model.ModelConfig(**ocp.JsonCheckpointHandler().restore(step_dir / MODEL_CONFIG))
    abstract = {'params': jax.eval_shape(model.init, model_config, jax.random.key(0))}
    restored = ocp.PyTreeCheckpointer().restore(step_dir / STATE, args=ocp.args.PyTreeRestore(
        item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract), partial_restore=True))
  except Exception as e:
    raise _orbax_failure(step_dir, e, 'load') from e
  return model_config, restored['params']
