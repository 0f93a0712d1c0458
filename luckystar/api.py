"""The notebook-facing surface: `luckystar.load(...)` → `Model` (DESIGN §8)."""

import dataclasses
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from luckystar import model as model_lib
from luckystar import tokenizer as tokenizer_lib
from luckystar.interop import hf

BUNDLED_DIR = pathlib.Path(__file__).parent / 'assets' / 'models'
BUNDLED_MODELS = ('tiny-base', 'tiny-sft', 'tiny-rlvr', 'teacher')

_logits = jax.jit(model_lib.apply, static_argnums=0)


@dataclasses.dataclass
class Model:
  """A loaded model: architecture, params (a pytree of arrays) and tokenizer (None if unknown)."""
  config: model_lib.ModelConfig
  params: Any
  tokenizer: tokenizer_lib.Tokenizer | None = None

  def logits(self, token_ids: Any) -> jax.Array:
    """token_ids [B, T] int → logits [B, T, V] float32."""
    token_ids = jnp.asarray(token_ids)
    if token_ids.ndim != 2 or not jnp.issubdtype(token_ids.dtype, jnp.integer):
      raise ValueError(f'token_ids must be an int array [batch, length], got {token_ids.dtype}{token_ids.shape}')
    if token_ids.size and (int(token_ids.min()) < 0 or int(token_ids.max()) >= self.config.vocab_size):
      raise ValueError(f'token ids must lie in [0, {self.config.vocab_size}); got '
                       f'[{int(token_ids.min())}, {int(token_ids.max())}]')
    return _logits(self.config, self.params, token_ids)


def _dir_tokenizer(path: pathlib.Path) -> tokenizer_lib.Tokenizer | None:
  """Our sentencepiece tokenizer if the directory carries one with our special tokens, else None."""
  file = path / 'tokenizer.model'
  if not file.is_file():
    return None
  try:
    return tokenizer_lib.Tokenizer.from_file(file)
  except (ValueError, RuntimeError, OSError):
    return None  # some other model's sentencepiece file (e.g. without our chat tokens)


def load(name_or_path: str | pathlib.Path, **config_overrides: Any) -> Model:
  """A bundled model name (`tiny-sft`, ...), or a transformers Cohere2/Cohere directory.

  `config_overrides` replace ModelConfig fields, e.g. `param_dtype='bfloat16', dtype='bfloat16'`;
  params are cast to the resulting `param_dtype`.
  """
  path = pathlib.Path(name_or_path)
  if str(name_or_path) in BUNDLED_MODELS:
    path = BUNDLED_DIR / str(name_or_path)
    if not path.is_dir():
      raise FileNotFoundError(
          f'bundled model {str(name_or_path)!r} is not built yet in this version of luckystar '
          f'(expected at {path}); bundled models ship with the training stages that produce them')
  if not path.exists():
    raise FileNotFoundError(f'{path}: no such bundled model or directory; bundled models: {BUNDLED_MODELS}')
  if not hf.is_hf_dir(path):
    raise ValueError(f'{path}: not a model directory luckystar can read (expected a transformers '
                     f'Cohere2/Cohere directory with config.json and safetensors)')
  config, params = hf.load_hf(path, **config_overrides)
  params = jax.tree.map(lambda x: jnp.asarray(np.asarray(x), config.param_dtype), params)
  return Model(config, params, _dir_tokenizer(path))
