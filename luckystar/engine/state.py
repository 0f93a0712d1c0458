"""The train state, created directly in its sharded layout (docs/models.md).

`create` traces the initialisation with `jax.eval_shape`, derives every leaf's sharding from the
one logical-axis table (`luckystar.model.sharding`; optimizer moments follow their params, scalars
are replicated) and runs it under `jax.jit(..., out_shardings=...)`, so nothing full-size ever sits
on one device.

`config.init_from` picks the initial params:
  'random:<size>'                 random init of a named size (`luckystar.model.SIZES`), e.g. 'random:tiny'
  'tiny-base', an HF directory    `loading.load(...)`
  'org/name[@revision]'           that repo's snapshot in the local Hugging Face cache (`loading.resolve`)
  a luckystar run directory       the params of its latest checkpoint (via `loading.load`)
"""

from typing import TYPE_CHECKING, Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax

from luckystar import errors
from luckystar import model
from luckystar import tokenizer as tokenizer_lib
from luckystar.model import sharding
from luckystar.engine import optim
from luckystar.tokenizer import formats

# checkpoint, loading and hf pull in grain and AQT; they are imported where `start` and the loaders use them,
# so that `step` (which takes a TrainState) runs where only jax, flax and optax are installed.
if TYPE_CHECKING:
  from luckystar.engine import loading
  from luckystar.interop import hf

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


def check_mesh(mesh_config: Any, *, count_devices: bool = True) -> None:
  """A UserError naming `config.mesh` and the devices there are, unless its sizes are integers ≥ 1 (one may be
  -1: the remaining devices) whose product is the device count (not checked with `count_devices=False`)."""
  shape = dict(mesh_config)
  given = ', '.join(f'config.mesh.{axis}={size}' for axis, size in shape.items())
  sizes_ok = all(isinstance(size, int) and (size >= 1 or size == -1) for size in shape.values())
  if not sizes_ok or list(shape.values()).count(-1) > 1:
    raise errors.UserError(f'{given}: each size must be an integer ≥ 1, or -1 (once) for the remaining devices')
  if not count_devices:
    return
  devices = jax.devices()
  try:
    sharding.make_mesh(shape, devices)
  except ValueError as e:
    raise errors.UserError(f'{given}: {e} ({len(devices)} {devices[0].platform} device(s) here); the sizes must '
                           f'multiply to {len(devices)}, e.g. set one of them to -1') from None


class Initial(NamedTuple):
  model_config: model.ModelConfig
  params: Any | None                         # None: random init, or streamed from `headers`
  tokenizer: tokenizer_lib.Tokenizer | None  # None: the checkpoint carries none
  headers: 'dict[str, hf.TensorHeader] | None' = None   # a float transformers checkpoint to stream onto the mesh


def initial_model(init_from: str, overrides: Any = None, chat_format: str = 'auto', *, stream: bool = False
                  ) -> Initial:
  """The model named by `config.init_from`, with `config.model_overrides` (ModelConfig fields) replaced, and
  its tokenizer in `config.chat_format`: a checkpoint's own, the bundled one for 'random:<size>'. With
  `stream`, a float transformers checkpoint is only opened (`headers`), for `start` to read onto its mesh."""
  from luckystar.engine import loading  # pylint: disable=g-import-not-at-top
  overrides = dict(overrides or {})
  if unknown := set(overrides) - set(model.ModelConfig.__dataclass_fields__):
    raise errors.UserError(f'config.model_overrides names {sorted(unknown)}, which are not ModelConfig fields')
  if init_from.startswith(RANDOM_INIT_PREFIX):
    if chat_format not in ('auto', formats.LUCKYSTAR.name):
      raise errors.UserError(f'config.chat_format={chat_format!r}: config.init_from={init_from!r} uses the bundled '
                             f'tokenizer, whose format is {formats.LUCKYSTAR.name!r}')
    try:
      return Initial(model.get(init_from[len(RANDOM_INIT_PREFIX):], **overrides), None, tokenizer_lib.default())
    except ValueError as e:
      raise errors.UserError(f'config.init_from={init_from!r}: {e}') from None
  if stream and (opened := loading.open_hf(init_from, chat_format, **overrides)):
    config, headers, tokenizer = opened
    check_vocab(init_from, config, tokenizer)
    return Initial(config, None, tokenizer, headers)
  # A bundled name, a run/checkpoint directory or a transformers directory.
  loaded = loading.load(init_from, chat_format=chat_format, **overrides)
  check_vocab(init_from, loaded.config, loaded.tokenizer)
  return Initial(loaded.config, loaded.params, loaded.tokenizer)


def tokenizer_of(initial: Initial, init_from: str) -> tokenizer_lib.Tokenizer:
  """The tokenizer of `initial`, or a UserError naming `config.init_from` when its checkpoint has none."""
  if initial.tokenizer is None:
    raise errors.UserError(f'config.init_from={init_from!r} has no tokenizer (neither tokenizer.json nor a '
                           f'tokenizer.model with our chat tokens); copy its tokenizer files into it')
  return initial.tokenizer


def load_model(config, mesh: jax.sharding.Mesh | None = None) -> 'loading.Model':
  """`config.init_from` as a `loading.Model` with its tokenizer, for stages that sample or score without
  training; 'random:<size>' initialises from `config.seed` (an untrained model: for smoke tests only).
  With `mesh`, the params are sharded over it by the logical table: a float transformers checkpoint is streamed
  onto it block by block (as `start` does), so it need not fit one device; a luckystar checkpoint is read whole
  on each host first; int4 params stay on the host."""
  from luckystar.engine import loading  # pylint: disable=g-import-not-at-top
  from luckystar.quant import quantize  # pylint: disable=g-import-not-at-top
  initial = initial_model(config.init_from, config.get('model_overrides'), config.get('chat_format', 'auto'),
                          stream=mesh is not None)
  tokenizer, model_config, params = tokenizer_of(initial, config.init_from), initial.model_config, initial.params
  if mesh is None or quantize.is_served(model_config):
    if params is None:
      params = model.init(model_config, jax.random.key(config.seed))
    return loading.Model(model_config, params, tokenizer)
  model_config, params = on_mesh(initial, mesh)
  if params is None:
    params = model.init_sharded(model_config, jax.random.key(config.seed), mesh)
  return loading.Model(model_config, jax.device_put(params, model.param_shardings(model_config, mesh)), tokenizer)


def on_mesh(initial: Initial, mesh: jax.sharding.Mesh) -> tuple[model.ModelConfig, Any | None]:
  """(config, params) of `initial` for `mesh`: the vocabulary padded to split over 'tensor', a streamed checkpoint
  read onto the mesh block by block (host params are returned as they are; None stays None: random init)."""
  from luckystar.interop import hf  # pylint: disable=g-import-not-at-top
  model_config, params = model.pad_vocab(initial.model_config, initial.params, mesh.shape['tensor'])
  if initial.headers is not None:   # each device reads its own block of the checkpoint
    params = hf.load_sharded(model_config, initial.headers, model.param_shardings(model_config, mesh))
  return model_config, params


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
  tokenizer: tokenizer_lib.Tokenizer | None


def start(config, workdir: Any, *, updates_per_step: int = 1, needs_tokenizer: bool = True) -> Start:
  """What every training stage builds first: the model of `config.init_from` and its tokenizer (recorded in
  `workdir`, so the run's checkpoints load with it; a checkpoint without one is an error unless the stage's
  data are token ids, `needs_tokenizer=False`), the mesh of `config.mesh`, the optimizer (`optim.make`) and
  the sharded train state holding the initial params."""
  from luckystar.engine import checkpoint  # pylint: disable=g-import-not-at-top
  initial = initial_model(config.init_from, config.get('model_overrides'), config.get('chat_format', 'auto'),
                          stream=True)
  tokenizer = tokenizer_of(initial, config.init_from) if needs_tokenizer else initial.tokenizer
  if tokenizer is not None:
    checkpoint.save_tokenizer(workdir, tokenizer)
  check_mesh(config.mesh)
  mesh = sharding.make_mesh(dict(config.mesh))
  model_config, params = on_mesh(initial, mesh)
  optimizer = optim.make(config, updates_per_step)
  state = create(model_config, optimizer, mesh, seed=config.seed, params=params)
  return Start(model_config, mesh, optimizer, state, tokenizer)
