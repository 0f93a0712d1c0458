"""Multi-process runs (docs/scale_out.md): `jax.distributed.initialize()` when the config or the launcher asks.

Every process runs the same `python -m luckystar.main ...` command; after initialisation
`jax.devices()` spans all of them, the mesh (`config.mesh`) is laid over every device, each
process feeds its own rows of the global batch, all processes write and restore the checkpoints
(orbax, on a shared file system), and only process 0 writes metrics, plots and config.json.

`config.distributed` (`luckystar.config.base`):
  initialize           'auto': when the environment names a multi-process launch (JAX_COORDINATOR_ADDRESS
                       is set, an `srun` step of several tasks, or `mpirun` with several ranks);
                       'always' (e.g. every worker of a multi-host TPU slice); 'never'
  coordinator_address  'host:port' of process 0; '' = JAX_COORDINATOR_ADDRESS, or jax's own cluster
                       detection (Cloud TPU, Slurm, Open MPI, Kubernetes)
  num_processes        0 = from the environment
  process_id           -1 = from the environment
  initialization_timeout_s   how long to wait for every process to join before failing

Host work over processes (sampling, scoring): every process runs the same host loop over the global rows and
calls the same device programs; `run_owned` computes a per-row result (a tool call, a verdict) only on the
row's owner and shares it, and `to_host` fetches a device result spread over processes.
"""

import os
import pickle
from typing import Any, Callable, Mapping, Sequence

import jax
from jax.experimental import multihost_utils
import numpy as np

from luckystar import errors

INITIALIZE = ('auto', 'always', 'never')


def launched_multiprocess(environ: Mapping[str, str] = os.environ) -> bool:
  """True when the launcher started several processes of this command (or named a coordinator)."""
  count = lambda name: int(environ.get(name, '1') or 1)
  return (bool(environ.get('JAX_COORDINATOR_ADDRESS')) or count('SLURM_STEP_NUM_TASKS') > 1
          or count('OMPI_COMM_WORLD_SIZE') > 1)


def maybe_initialize(settings: Any) -> bool:
  """Calls `jax.distributed.initialize` as `config.distributed` says; True if it did. Must run before
  anything touches a device (the first `jax.devices()` fixes the process's view of the world)."""
  if settings.initialize not in INITIALIZE:
    raise errors.UserError(f'config.distributed.initialize={settings.initialize!r}; expected one of {INITIALIZE}')
  if settings.initialize == 'never' or (settings.initialize == 'auto' and not launched_multiprocess()):
    return False
  jax.distributed.initialize(
      coordinator_address=settings.coordinator_address or None,
      num_processes=settings.num_processes if settings.num_processes > 0 else None,
      process_id=settings.process_id if settings.process_id >= 0 else None,
      initialization_timeout=settings.initialization_timeout_s)
  return True


def owner(index: int, count: int) -> int:
  """The process that computes host work for item `index` of `count`: contiguous, near-equal blocks in process
  order (with the mesh's devices in process order, the rows each process feeds to a batch sharded over
  `data × fsdp`)."""
  return index * jax.process_count() // count


def allgather_objects(items: Sequence[Any]) -> list[Any]:
  """Every process's `items` (picklable), concatenated in process order, on every process. A collective: every
  process calls it, in the same order."""
  if jax.process_count() == 1:
    return list(items)
  payload = np.frombuffer(pickle.dumps(list(items)), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.array([payload.size], np.int64))).reshape(-1)
  padded = np.zeros(1 << int(sizes.max() - 1).bit_length(), np.uint8)   # a power of two: a few gather programs
  padded[:payload.size] = payload
  gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
  return [item for rows, size in zip(gathered, sizes) for item in pickle.loads(rows[:size].tobytes())]


def run_owned(fn: Callable[[int], Any], indices: Sequence[int], count: int) -> list[Any]:
  """[fn(i) for i in indices] (each i one of `count` rows), each computed only by `owner(i, count)` and shared
  with every process (a collective when there are several). Every process passes the same indices; fn's results
  must pickle. An exception in fn on its owner is raised on every process (as a RuntimeError naming it)."""
  if jax.process_count() == 1 or not indices:   # every process passes the same indices: none means no collective
    return [fn(i) for i in indices]
  me = jax.process_index()
  mine = []
  for k, i in enumerate(indices):
    if owner(i, count) == me:
      try:
        mine.append((k, fn(i), None))
      except Exception as e:  # pylint: disable=broad-except
        mine.append((k, None, f'{type(e).__name__}: {e}'))   # every process raises it, none waits forever
  results = [None] * len(indices)
  for k, value, error in allgather_objects(mine):
    if error is not None:
      raise RuntimeError(f'item {indices[k]} failed on process {owner(indices[k], count)}: {error}')
    results[k] = value
  return results


def to_host(tree: Any) -> Any:
  """`tree` with every array as numpy on this process; an array spread over processes is all-gathered first
  (a collective: every process calls it, in the same order)."""
  def fetch(value):
    if isinstance(value, jax.Array) and not value.is_fully_addressable and not value.is_fully_replicated:
      return np.asarray(multihost_utils.process_allgather(value, tiled=True))
    return np.asarray(value)
  return jax.tree.map(fetch, tree)


def barrier(name: str) -> None:
  """Waits until every process got here (nothing to wait for in one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)
