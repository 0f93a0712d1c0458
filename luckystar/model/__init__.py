"""The Cohere2 decoder, its sizes and its sharding; pure init/apply over plain param trees."""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from luckystar.model import sharding
from luckystar.model.cohere2 import CACHE_AXES, Decoder, cache_slots, constrain
from luckystar.model.config import FULL, SIZES, SLIDING, ModelConfig, get, pattern_layer_types

__all__ = ['Decoder', 'ModelConfig', 'SIZES', 'SLIDING', 'FULL', 'get', 'pattern_layer_types', 'sharding',
           'init', 'abstract_params', 'param_count', 'apply', 'init_sharded', 'init_cache', 'cache_logical_axes',
           'cache_shardings', 'decode', 'prefill', 'pad_vocab']


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


def pad_vocab(config: ModelConfig, params: Any | None, multiple: int) -> tuple[ModelConfig, Any | None]:
  """(config, params) whose embedding has a multiple of `multiple` rows (the mesh's 'tensor' size, so that
  the vocabulary shards): zero rows after the vocabulary, replacing any earlier padding. Logits and exports
  hold only the vocabulary's rows."""
  padded = config.replace(vocab_padding=-config.vocab_size % multiple)
  if params is None or padded.vocab_padding == config.vocab_padding:
    return padded, params
  embedding = np.asarray(jax.device_get(params['embedding']))[:config.vocab_size]
  rows = np.zeros((padded.vocab_padding, embedding.shape[1]), embedding.dtype)
  return padded, {**params, 'embedding': np.concatenate([embedding, rows])}


def apply(config: ModelConfig, params: Any, tokens: jax.Array, positions: jax.Array | None = None,
          segment_ids: jax.Array | None = None, logit_columns: jax.Array | None = None,
          features_only: bool = False) -> jax.Array:
  """Pure forward pass: tokens [B, T] → logits [B, T, V] float32, or [B, M, V] at `logit_columns` [B, M];
  features_only: the final hidden states there instead ([..., E], for `head`)."""
  return Decoder(config).apply({'params': params}, tokens, positions, segment_ids, logit_columns=logit_columns,
                               features_only=features_only)


def head(config: ModelConfig, params: Any, hidden: jax.Array) -> jax.Array:
  """The final norm and vocabulary projection of `apply(..., features_only=True)`'s states: logits [..., V]."""
  return Decoder(config).apply({'params': params}, None, hidden=hidden)


# ---- KV-cache decoding (the layout is described in model/cohere2.py's docstring) ----


def init_cache(config: ModelConfig, batch: int, max_length: int) -> dict[str, Any]:
  """An empty cache of `batch` rows holding up to `max_length` columns each.

  {'index': int32 [B] the next column each row writes (0: empty),
   'layers': {'layer_i': {'k', 'v': [groups, B, kv_heads, slots, head_dim]}}} in the compute dtype;
  slots = max_length for full layers, min(sliding_window, max_length) for sliding ones.
  Writing past max_length silently overwrites full layers' oldest columns: size it for prompt + new tokens.
  A row starts a new sequence when its index is set back to 0 (what it held is then never attended to).
  """
  groups, period = config.num_layers // config.layer_period, config.layer_period
  layers = {}
  for i, layer_type in enumerate(config.layer_types[:period]):
    shape = (groups, batch, config.num_kv_heads, cache_slots(config, layer_type == SLIDING, max_length),
             config.head_dim)
    # Laid out by the logical table under `sharding.activate` (rows over data × fsdp, KV heads over tensor);
    # unconstrained, a jitted init would make every device hold the whole cache.
    empty = lambda: constrain(jnp.zeros(shape, config.dtype), CACHE_AXES)
    layers[f'layer_{i}'] = {'k': empty(), 'v': empty()}
  return {'index': constrain(jnp.zeros((batch,), jnp.int32), ('batch',)), 'layers': layers}


def cache_logical_axes(config: ModelConfig) -> dict[str, Any]:
  """Logical PartitionSpecs of the cache (same tree as `init_cache`), for `sharding.logical_shardings`."""
  spec = jax.sharding.PartitionSpec
  buffers = {'k': spec(*CACHE_AXES), 'v': spec(*CACHE_AXES)}
  return {'index': spec('batch'),
          'layers': {f'layer_{i}': buffers for i in range(config.layer_period)}}


def cache_shardings(config: ModelConfig, mesh: jax.sharding.Mesh) -> dict[str, Any]:
  return sharding.logical_shardings(cache_logical_axes(config), mesh)


def decode(config: ModelConfig, params: Any, tokens: jax.Array, cache: dict[str, Any], last_only: bool = False,
           lengths: jax.Array | None = None) -> tuple[jax.Array, dict[str, Any]]:
  """Appends row b's tokens[b, :lengths[b]] (tokens [B, T], right-padded; lengths default T) at its cursor:
  (logits [B, T, V], or [B, 1, V] of each row's last new token with last_only; cache)."""
  return Decoder(config).apply({'params': params}, tokens, cache=cache, last_only=last_only, lengths=lengths)


def prefill(config: ModelConfig, params: Any, tokens: jax.Array, lengths: jax.Array, max_length: int
            ) -> tuple[jax.Array, dict[str, Any]]:
  """Right-padded prompts tokens [B, T] (row b's in tokens[b, :lengths[b]]) → (logits [B, V] of each row's
  last token, a cache of max_length columns holding the prompts)."""
  logits, cache = decode(config, params, tokens, init_cache(config, tokens.shape[0], max_length), last_only=True,
                         lengths=lengths)
  return logits[:, 0], cache
