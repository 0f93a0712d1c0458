"""The Cohere2 decoder, its sizes and its sharding; pure init/apply over plain param trees."""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from luckystar.model import sharding
from luckystar.model.cohere2 import Decoder
from luckystar.model.config import FULL, SIZES, SLIDING, ModelConfig, get, pattern_layer_types

__all__ = ['Decoder', 'ModelConfig', 'SIZES', 'SLIDING', 'FULL', 'get', 'pattern_layer_types', 'sharding',
           'init', 'abstract_params', 'param_count', 'apply', 'init_sharded']


def _dummy_tokens() -> jax.Array:
  return jnp.zeros((1, 1), jnp.int32)


@functools.partial(jax.jit, static_argnums=0)
def init(config: ModelConfig, rng: jax.Array) -> dict[str, Any]:
  """Random params (unboxed) on the default device; for sharded creation use `init_sharded`."""
  return nn.unbox(Decoder(config).init(rng, _dummy_tokens())['params'])


def abstract_params(config: ModelConfig) -> dict[str, Any]:
  """Boxed ShapeDtypeStructs with logical axis metadata; nothing is allocated."""
  return jax.eval_shape(lambda rng: Decoder(config).init(rng, _dummy_tokens())['params'], jax.random.key(0))


def param_count(config: ModelConfig) -> int:
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(nn.unbox(abstract_params(config))))


def param_shardings(config: ModelConfig, mesh: jax.sharding.Mesh) -> dict[str, Any]:
  return sharding.param_shardings(abstract_params(config), mesh)


def init_sharded(config: ModelConfig, rng: jax.Array, mesh: jax.sharding.Mesh) -> dict[str, Any]:
  """Random params created directly in their sharded layout (nothing full-size on one device)."""
  return jax.jit(functools.partial(init, config), out_shardings=param_shardings(config, mesh))(rng)


def apply(config: ModelConfig, params: Any, tokens: jax.Array, positions: jax.Array | None = None,
          segment_ids: jax.Array | None = None) -> jax.Array:
  """Pure forward pass: tokens [B, T] → logits [B, T, V] float32."""
  return Decoder(config).apply({'params': params}, tokens, positions, segment_ids)
