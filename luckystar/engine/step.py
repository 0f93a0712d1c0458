"""One jitted `update_fn(state, batch, rng) -> (state, metrics)` from a pure loss (docs/training.md).

A stage's `loss_fn(params, batch, rng) -> (loss, aux)` returns `loss = sum / denominator` over the
batch it is given, and `aux[denominator]` (e.g. 'tokens'), the count it divided by.

Gradient accumulation is a `lax.scan` over `grad_accum_steps` micro-batches inside the one jitted
step (not `optax.MultiSteps`, which would average per-micro-batch means): each micro-batch's
gradient is weighted by its denominator, so the update is exactly the gradient of
sum / denominator over the whole global batch, and the optimizer sees one update per step.
Micro-batch i takes rows i, i + k, i + 2k, ... so every device keeps working on every micro-batch.

A non-finite loss or gradient norm skips the update: params and optimizer state stay bitwise
unchanged, `step` still advances, and `train/skipped_updates` counts such steps (cumulative). So does an
all-zero gradient (an RLOO batch whose groups all have zero variance, and no KL term): it carries no
signal, yet Adam would move the weights by its momentum, re-applying the last real step many times over,
and weight decay would shrink them.
"""

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from luckystar import errors
from luckystar.model import sharding
from luckystar.engine.state import TrainState

Batch = dict[str, jax.Array]
LossFn = Callable[[Any, Batch, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True)
class MeshFunction:
  """A jitted function traced under `sharding.activate(mesh)`, so the model's logical activation
  constraints bind to `mesh` (`jax.set_mesh` cannot be entered inside `jit`)."""
  jitted: Any
  mesh: jax.sharding.Mesh
  batch_sharding: jax.sharding.NamedSharding  # for [batch, ...] arrays

  def __call__(self, *args):
    with sharding.activate(self.mesh):
      return self.jitted(*args)

  def lower(self, *args):
    with sharding.activate(self.mesh):
      return self.jitted.lower(*args)

  def local_rows(self, global_batch: dict[str, Any]) -> dict[str, Any]:
    """This process's rows of a global batch that every process built whole: what `put_batch` takes."""
    rows = process_rows(self.batch_sharding, len(next(iter(global_batch.values()))))
    return {k: v[rows] for k, v in global_batch.items()}

  def put_batch(self, local_batch: dict[str, Any]) -> Batch:
    """This process's rows → global arrays sharded over the batch axis (the global batch is
    `process_count` times the local one)."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding, v) for k, v in local_batch.items()}


def check_rows(rows: int, mesh: jax.sharding.Mesh, what: str) -> None:
  """A UserError when a batch of `rows` global rows (`what` says which config keys make it) does not split over
  the mesh's data × fsdp devices, and so over the processes."""
  devices = mesh.shape['data'] * mesh.shape['fsdp']
  if rows % devices:
    raise errors.UserError(f'{what} = {rows} rows per step, which do not split over the mesh\'s data×fsdp = '
                           f'{devices} devices')


def batch_sharding(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
  """Rows over ('data', 'fsdp') by the logical table; the remaining axes replicated."""
  return sharding.logical_shardings(jax.sharding.PartitionSpec('batch'), mesh)


def process_rows(rows_sharding: jax.sharding.Sharding, global_rows: int) -> np.ndarray:
  """Indices of the rows of a [global_rows, ...] array that this process's devices hold, in the order
  `jax.make_array_from_process_local_data` reads its local data."""
  spans = {index[0].indices(global_rows)[:2]
           for index in rows_sharding.addressable_devices_indices_map((global_rows,)).values()}
  return np.concatenate([np.arange(start, stop) for start, stop in sorted(spans)])


def accumulate_gradients(loss_fn: LossFn, params: Any, batch: Batch, rng: jax.Array, *, grad_accum_steps: int,
                         denominator: str, aux_weights: Mapping[str, str | None] | None = None
                         ) -> tuple[Any, dict[str, jax.Array]]:
  """(grads, aux) of sum / denominator over the whole `batch`, in `grad_accum_steps` micro-batches.

  aux entries come out as they would from the whole batch at once: a mean over the batch weighted by
  aux[denominator], unless `aux_weights` (the stage's AUX_WEIGHTS) maps the entry to the aux entry counting
  what it is a mean over (a metric of some rows only: DPO's rewards over preference rows), or to None for
  a count, which is summed, as aux[denominator] is.
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if grad_accum_steps == 1:
    (_, aux), grads = grad_fn(params, batch, rng)
    return grads, aux
  rules = {**(aux_weights or {}), denominator: None}
  summed = {k for k, rule in rules.items() if rule is None}   # counts; the rest are weighted means

  def split(x):  # [B, ...] → [k, B / k, ...], micro-batch i = rows i::k
    if x.shape[0] % grad_accum_steps:
      raise ValueError(f'batch of {x.shape[0]} rows does not split into grad_accum_steps={grad_accum_steps}')
    return jnp.swapaxes(x.reshape(x.shape[0] // grad_accum_steps, grad_accum_steps, *x.shape[1:]), 0, 1)

  def body(totals, inputs):
    micro_batch, index = inputs
    (_, aux), grads = grad_fn(params, micro_batch, jax.random.fold_in(rng, index))
    count = aux[denominator]
    weights = {k: jnp.ones(()) if k in summed else aux[rules.get(k, denominator)] for k in aux}
    weighted = {k: aux[k] * w for k, w in weights.items()}
    return jax.tree.map(jnp.add, totals, (jax.tree.map(lambda g: g * count, grads), weighted, weights, count)), None

  micro_batches = jax.tree.map(split, batch)
  (_, first_aux), _ = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro_batches), rng)
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), (params, first_aux, first_aux))  # fp32 sums
  totals = (*zeros, jnp.zeros((), jnp.float32))
  (grads, sums, weights, count), _ = jax.lax.scan(body, totals, (micro_batches, jnp.arange(grad_accum_steps)))
  grads = jax.tree.map(lambda g, p: (g / jnp.maximum(count, 1.0)).astype(p.dtype), grads, params)
  aux = {k: (v if k in summed else v / jnp.maximum(weights[k], 1e-30)).astype(first_aux[k].dtype)
         for k, v in sums.items()}
  return grads, aux


def make_update_fn(loss_fn: LossFn, optimizer: optax.GradientTransformation, state_shardings: TrainState, *,
                   mesh: jax.sharding.Mesh, learning_rate: optax.Schedule | None = None, grad_accum_steps: int = 1,
                   denominator: str = 'tokens', updates_per_batch: int = 1,
                   aux_weights: Mapping[str, str | None] | None = None) -> MeshFunction:
  """The jitted step: gradients (accumulated), optimizer update unless non-finite or all zero, metrics.

  `updates_per_batch` > 1 takes that many optimizer updates on the same batch within the step (PPO-style
  epochs; the loss should clip its ratio to the sampling policy); metrics are those of the first update,
  plus `train/last_update_loss`. Metrics: `train/<aux key>` for every aux entry (combined over micro-batches
  by `aux_weights`, see `accumulate_gradients`), `train/grad_norm`
  (before clipping), `train/skipped_updates`, and `train/learning_rate` if the schedule is given.
  The state argument is donated.
  """
  def one_update(params, opt_state, skipped, batch, rng):
    grads, aux = accumulate_gradients(loss_fn, params, batch, rng, grad_accum_steps=grad_accum_steps,
                                      denominator=denominator, aux_weights=aux_weights)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    grad_norm = optax.global_norm(grads)
    applied = jnp.isfinite(aux['loss']) & jnp.isfinite(grad_norm) & (grad_norm > 0)

    def if_applied(new, old):
      return jax.tree.map(lambda n, o: jnp.where(applied, n, o), new, old)

    skipped = skipped + jnp.logical_not(applied).astype(jnp.int32)
    return if_applied(new_params, params), if_applied(new_opt_state, opt_state), skipped, aux, grad_norm

  def update(state: TrainState, batch: Batch, rng: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
    params, opt_state, skipped, aux, grad_norm = one_update(state.params, state.opt_state, state.skipped_updates,
                                                            batch, rng)
    metrics = {f'train/{k}': v for k, v in aux.items()}
    if updates_per_batch > 1:
      def again(carry, index):
        *carry, last_aux, _ = one_update(*carry, batch, jax.random.fold_in(rng, index))
        return tuple(carry), last_aux['loss']
      (params, opt_state, skipped), losses = jax.lax.scan(again, (params, opt_state, skipped),
                                                          jnp.arange(1, updates_per_batch))
      metrics['train/last_update_loss'] = losses[-1]
    metrics |= {'train/grad_norm': grad_norm, 'train/skipped_updates': skipped}
    if learning_rate is not None:  # the optimizer counts applied updates only
      metrics['train/learning_rate'] = learning_rate(state.step * updates_per_batch - state.skipped_updates)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, skipped_updates=skipped)
    return new_state, metrics

  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  data = batch_sharding(mesh)
  jitted = jax.jit(update, in_shardings=(state_shardings, data, replicated),
                   out_shardings=(state_shardings, replicated), donate_argnums=0)
  return MeshFunction(jitted, mesh, data)


def state_shardings_of(state: TrainState) -> TrainState:
  """The shardings a live state already has (what `make_update_fn` wants)."""
  return jax.tree.map(lambda x: x.sharding, state)
