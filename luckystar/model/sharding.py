"""The one table that maps logical axis names to the ('data', 'fsdp', 'tensor') device mesh.

Params carry `embed, vocab, heads, kv_heads, head_dim, mlp, layers`; activations
carry `batch, length` plus the `act_*` names (an activation's hidden axis is not
sharded like the weights' `embed` axis, which FSDP splits). `act_seq` is the sequence axis of the
training residual stream between blocks, split over 'tensor' (Megatron-style sequence parallelism):
each block gathers its normalised input and sums its branches whole (the all-reduces a tensor-parallel
block needs anyway), then keeps only its slice of the sequence, so the per-layer inputs kept for the
backward pass shrink by the tensor size (`cohere2.Block`).
"""

import contextlib
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np

MESH_AXES = ('data', 'fsdp', 'tensor')

RULES = (
    # params
    ('embed', 'fsdp'),
    ('vocab', 'tensor'),
    ('heads', 'tensor'),
    ('kv_heads', 'tensor'),
    ('mlp', 'tensor'),
    ('head_dim', None),
    ('layers', None),
    # activations
    ('batch', ('data', 'fsdp')),
    ('length', None),
    ('act_seq', 'tensor'),
    ('act_embed', None),
    ('act_heads', 'tensor'),
    ('act_kv_heads', 'tensor'),
    ('act_mlp', 'tensor'),
    ('act_vocab', 'tensor'),
)


def make_mesh(shape: Sequence[int] | dict[str, int] | None = None, devices=None) -> jax.sharding.Mesh:
  """A ('data', 'fsdp', 'tensor') mesh. `shape` may use -1 once for "all remaining devices".

  None means pure data parallelism over every device.
  """
  devices = np.asarray(jax.devices() if devices is None else devices)
  if shape is None:
    shape = (-1, 1, 1)
  if isinstance(shape, dict):
    if unknown := set(shape) - set(MESH_AXES):
      raise ValueError(f'mesh has unknown axes {sorted(unknown)}; expected {MESH_AXES}')
    shape = tuple(shape.get(axis, 1) for axis in MESH_AXES)
  shape = list(shape)
  if len(shape) != len(MESH_AXES) or shape.count(-1) > 1:
    raise ValueError(f'mesh shape {shape} must give {len(MESH_AXES)} sizes {MESH_AXES}, at most one -1')
  if -1 in shape:
    known = int(np.prod([s for s in shape if s != -1]))
    shape[shape.index(-1)] = devices.size // known
  if int(np.prod(shape)) != devices.size:
    raise ValueError(f'mesh shape {tuple(shape)} needs {int(np.prod(shape))} devices, have {devices.size}')
  return jax.sharding.Mesh(devices.reshape(shape), MESH_AXES)


def logical_shardings(logical_specs: Any, mesh: jax.sharding.Mesh) -> Any:
  """NamedShardings for a pytree of logical PartitionSpecs (e.g. nn.get_partition_spec(abstract_params))."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, RULES)


def param_shardings(abstract_variables: Any, mesh: jax.sharding.Mesh) -> Any:
  """NamedShardings for boxed (nn.Partitioned) variables as returned by `jax.eval_shape(model.init, ...)`."""
  return logical_shardings(nn.get_partition_spec(abstract_variables), mesh)


@contextlib.contextmanager
def activate(mesh: jax.sharding.Mesh):
  """Within this context, activation constraints inside the model bind to `mesh`."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
    yield
