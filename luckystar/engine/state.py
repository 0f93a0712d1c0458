"""The train state, created directly in its sharded layout (DESIGN §3).

`create` traces the initialisation with `jax.eval_shape`, derives every leaf's sharding from the
one logical-axis table (`luckystar.model.sharding`; optimizer moments follow their params, scalars
are replicated) and runs it under `jax.jit(..., out_shardings=...)`, so nothing full-size ever sits
on one device.

`config.init_from` picks the initial params:
  'random:<size>'                 random init of a named size (`luckystar.model.SIZES`), e.g. 'random:tiny'
  'tiny-base', an HF directory    `loading.load(...)`
  a luckystar run directory       the params of its latest checkpoint (via `loading.load`)
"""

from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax

from luckystar import errors
from luckystar import model
from luckystar.model import sharding
from luckystar.engine import loading
from luckystar.engine import optim

RANDOM_INIT_PREFIX = 'random:'


@flax.struct.dataclass
class TrainState:
  step: jax.Array             # int32 []: batches consumed (skipped updates included)
  params: Any
  opt_state: Any
  rng: jax.Array              # uint32 [2] raw key data; step t uses fold_in(rng, t)
  skipped_updates: jax.Array  # int32 []: non-finite updates not applied, cumulative


def check_vocab(init_from: str, model_config: model.ModelConfig, tokenizer: Any) -> None:
  """A UserError naming `config.init_from` when the tokenizer has ids the model cannot embed."""
  if tokenizer is not None and tokenizer.vocab_size > model_config.vocab_size:
    raise errors.UserError(f'config.init_from={init_from!r} has {model_config.vocab_size} token embeddings, '
                           f'fewer than the tokenizer\'s {tokenizer.vocab_size}')


def initial_model(init_from: str, overrides: Any = None) -> tuple[model.ModelConfig, Any | None]:
  """(model config, params) named by `config.init_from`, with `config.model_overrides` (ModelConfig
  fields) replaced; params None means random init."""
  overrides = dict(overrides or {})
  if unknown := set(overrides) - set(model.ModelConfig.__dataclass_fields__):
    raise errors.UserError(f'config.model_overrides names {sorted(unknown)}, which are not ModelConfig fields')
  if init_from.startswith(RANDOM_INIT_PREFIX):
    try:
      return model.get(init_from[len(RANDOM_INIT_PREFIX):], **overrides), None
    except ValueError as e:
      raise errors.UserError(f'config.init_from={init_from!r}: {e}') from None
  loaded = loading.load(init_from, **overrides)  # bundled name, run/checkpoint directory or transformers directory
  return loaded.config, loaded.params


def shardings(abstract_state: TrainState, optimizer: optax.GradientTransformation, param_shardings: Any,
              mesh: jax.sharding.Mesh) -> TrainState:
  """NamedShardings for every leaf: params by the logical table, optimizer moments like their params."""
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  opt_state = optax.tree_map_params(optimizer, lambda _, sharding: sharding, abstract_state.opt_state,
                                    param_shardings, transform_non_params=lambda _: replicated)
  return TrainState(step=replicated, params=param_shardings, opt_state=opt_state, rng=replicated,
                    skipped_updates=replicated)


def _init_fn(model_config: model.ModelConfig, optimizer: optax.GradientTransformation):
  """(rng, params or None) -> a fresh TrainState: random params from rng, or the given ones."""
  def init(rng, params):
    init_rng, run_rng = jax.random.split(rng)
    if params is None:
      params = model.init(model_config, init_rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                      rng=jax.random.key_data(run_rng), skipped_updates=jnp.zeros((), jnp.int32))
  return init


def abstract(model_config: model.ModelConfig, optimizer: optax.GradientTransformation, mesh: jax.sharding.Mesh
             ) -> TrainState:
  """The state `create` would make, as ShapeDtypeStructs carrying their shardings; nothing is allocated
  (what ahead-of-time lowering and compiling take, `luckystar.aot_plan`)."""
  shapes = jax.eval_shape(_init_fn(model_config, optimizer), jax.random.key(0), None)
  state_shardings = shardings(shapes, optimizer, model.param_shardings(model_config, mesh), mesh)
  return jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
                      shapes, state_shardings)


def create(model_config: model.ModelConfig, optimizer: optax.GradientTransformation, mesh: jax.sharding.Mesh,
           *, seed: int, params: Any | None = None) -> TrainState:
  """A fresh state on `mesh`: random params from `seed`, or the given (host or device) `params`."""
  param_shardings = model.param_shardings(model_config, mesh)
  init = _init_fn(model_config, optimizer)
  rng = jax.random.key(seed)
  state_shardings = shardings(jax.eval_shape(init, rng, params), optimizer, param_shardings, mesh)
  if params is not None:
    params = jax.device_put(params, param_shardings)
  return jax.jit(init, out_shardings=state_shardings, donate_argnums=1)(rng, params)


def step_rng(state: TrainState) -> jax.Array:
  """The key of the step `state` is about to take; depends only on the seed and the step number."""
  return jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)


class Start(NamedTuple):
  model_config: model.ModelConfig
  mesh: jax.sharding.Mesh
  optimizer: optax.GradientTransformation
  state: TrainState


def start(config, tokenizer: Any, *, updates_per_step: int = 1) -> Start:
  """What every training stage builds first: the model of `config.init_from` (its vocabulary checked
  against `tokenizer`; None for token-only data), the mesh of `config.mesh`, the optimizer
  (`optim.make`) and the sharded train state holding the initial params."""
  model_config, params = initial_model(config.init_from, config.get('model_overrides'))
  check_vocab(config.init_from, model_config, tokenizer)
  mesh = sharding.make_mesh(dict(config.mesh))
  optimizer = optim.make(config, updates_per_step)
  return Start(model_config, mesh, optimizer, create(model_config, optimizer, mesh, seed=config.seed, params=params))
