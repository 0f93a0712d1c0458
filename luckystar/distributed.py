"""Multi-process runs (DESIGN §3): `jax.distributed.initialize()` when the config or the launcher asks.

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
"""

import os
from typing import Any, Mapping

import jax

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
