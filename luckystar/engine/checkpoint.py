"""Checkpoints under `workdir/checkpoints/<step>/` (orbax), atomic and resumable.

Each step directory holds three items:
  state/         the TrainState (params, optimizer state, step, RNG key, skipped-update count)
  data/          the grain iterator position (grain's own orbax handler: one JSON per process)
  model_config/  the ModelConfig as JSON, so a checkpoint directory is loadable on its own

orbax writes a step into a temporary directory and renames it when complete, so a run killed
mid-save leaves the previous checkpoint as the latest.
"""

import pathlib
from typing import Any

import grain
import grain.checkpoint  # registers CheckpointSave / CheckpointRestore with orbax
import jax
import orbax.checkpoint as ocp

from luckystar import errors
from luckystar import model

STATE, DATA, MODEL_CONFIG = 'state', 'data', 'model_config'


class CheckpointError(errors.UserError):
  """A checkpoint that exists but cannot be restored into this run."""


def directory(workdir: str | pathlib.Path) -> pathlib.Path:
  return pathlib.Path(workdir).absolute() / 'checkpoints'


def manager(workdir: str | pathlib.Path, *, keep: int) -> ocp.CheckpointManager:
  """Saves where asked (the loop decides when) and keeps the last `keep` steps. `keep` (config.keep_checkpoints)
  below 1 is a UserError, raised before anything is read, written or deleted: orbax would delete every
  checkpoint (0) or fail deep inside (negative), and a re-run would start over from step 0."""
  if keep < 1:
    raise errors.UserError(f'config.keep_checkpoints={keep} keeps no checkpoint to resume from; use 1 or more')
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
  handlers = {STATE: ocp.StandardCheckpointHandler(), DATA: grain.checkpoint.CheckpointHandler(),
              MODEL_CONFIG: ocp.JsonCheckpointHandler()}
  return ocp.CheckpointManager(directory(workdir), options=options, item_handlers=handlers)


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
  now (the loop moves the iterator on right after)."""
  items = {STATE: ocp.args.StandardSave(state), DATA: grain.checkpoint.CheckpointSave(iterator)}
  if model_config is not None:
    items[MODEL_CONFIG] = ocp.args.JsonSave(model_config.to_dict())
  checkpoints.save(int(state.step), args=ocp.args.Composite(**items))


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


def restore_latest(checkpoints: ocp.CheckpointManager, state: Any, iterator: grain.DatasetIterator) -> Any | None:
  """The latest checkpoint restored with `state`'s shapes and shardings (None if there is none);
  `iterator` is moved to the saved position in place."""
  step = checkpoints.latest_step()
  if step is None:
    return None
  path = pathlib.Path(str(checkpoints.directory)) / str(step)
  abstract_state = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  try:
    saved = checkpoints.item_metadata(step)[STATE]
    if saved is None:
      raise ValueError(f'no {STATE!r} item')
  except Exception as e:  # orbax raises many types for unreadable metadata
    raise CheckpointError(f'{path}: not a readable luckystar checkpoint ({type(e).__name__}: {e}); '
                          f'delete this step directory to resume from an earlier one, or use a new --workdir') from e
  _check_compatible(saved, abstract_state, path)
  try:
    restored = checkpoints.restore(step, args=ocp.args.Composite(**{
        STATE: ocp.args.StandardRestore(abstract_state),
        DATA: grain.checkpoint.CheckpointRestore(iterator)}))
  except Exception as e:
    raise CheckpointError(f'{path}: checkpoint is corrupt or incomplete ({type(e).__name__}: {e}); '
                          f'delete this step directory to resume from an earlier one, or use a new --workdir') from e
  return restored[STATE]


def is_run_dir(path: pathlib.Path) -> bool:
  """A luckystar run directory, its `checkpoints/`, or one step directory in it."""
  return ((path / 'checkpoints').is_dir() or (path.name == 'checkpoints' and path.is_dir())
          or (path / MODEL_CONFIG).is_dir())


def _step_dir(path: pathlib.Path) -> pathlib.Path:
  """The step directory itself, or the latest complete one under a run or checkpoints directory."""
  if (path / STATE).is_dir():
    return path
  workdir = path.parent if path.name == 'checkpoints' else path
  step = latest_step(workdir)
  if step is None:
    raise FileNotFoundError(f'{directory(workdir)}: no complete checkpoint to load')
  return directory(workdir) / str(step)


def load_params(path: str | pathlib.Path) -> tuple[model.ModelConfig, Any]:
  """(model config, params) of the latest checkpoint under a run directory (or of a step directory);
  only the params are read, not the optimizer state, onto the default device (the caller shards them)."""
  step_dir = _step_dir(pathlib.Path(path).absolute())
  try:
    model_config = model.ModelConfig(**ocp.JsonCheckpointHandler().restore(step_dir / MODEL_CONFIG))
    abstract = {'params': jax.eval_shape(model.init, model_config, jax.random.key(0))}
    restored = ocp.PyTreeCheckpointer().restore(step_dir / STATE, args=ocp.args.PyTreeRestore(
        item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract), partial_restore=True))
  except Exception as e:
    raise CheckpointError(f'{step_dir}: cannot load params from this checkpoint ({type(e).__name__}: {e})') from e
  return model_config, restored['params']
