"""Architecture settings of the Cohere2 (Command R7B / Command A) decoder and its named sizes."""

import dataclasses
from typing import Any

SLIDING = 'sliding_attention'
FULL = 'full_attention'
REMAT_POLICY_NAMES = ('none', 'full', 'dots', 'save_dots')
REMAT_SCOPES = ('group', 'layer')
ATTENTION_IMPLS = ('auto', 'xla', 'blockwise', 'cudnn', 'splash')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Everything that decides the shape and the math of the decoder.

  `layer_types[i]` says whether layer i uses a sliding window (with RoPE) or
  full attention (no positional encoding, "NoPE"), exactly as transformers'
  `Cohere2Config.layer_types`. Cohere v1 (`CohereForCausalLM`) is the special
  case `rope_on_full_layers=True`, all layers full, optional QK-norm.
  """
  vocab_size: int                     # the tokenizer's ids: what logits and exports hold
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  layer_types: tuple[str, ...]
  sliding_window: int | None = 4096
  rope_theta: float = 50_000.0
  layer_norm_eps: float = 1e-5
  logit_scale: float = 1.0
  max_position_embeddings: int = 8192
  use_qk_norm: bool = False
  rope_on_full_layers: bool = False   # True for Cohere v1.
  # Numerics and memory: params are stored in param_dtype, matmuls run in dtype.
  param_dtype: str = 'float32'
  dtype: str = 'float32'
  remat_policy: str = 'none'          # one of REMAT_POLICY_NAMES; see model.cohere2.REMAT_POLICIES
  remat_scope: str = 'group'          # rematerialise each scanned group of layers at once, or each 'layer'
  # Training attention backend (model.attention): 'auto' picks per platform and row length.
  attention_impl: str = 'auto'
  attention_block: int = 512          # query and key block of the blockwise and splash backends
  # Losses project onto the vocabulary this many scored columns at a time, recomputed in the backward pass, so
  # the logits never exist for the whole batch (engine.logprobs); 0: only when they would pass LOGITS_BUDGET.
  loss_chunk: int = 0
  # Weight-only int quantization of the dense layers through AQT: a luckystar.quant.QuantSettings
  # (mode train / convert / serve), or None for float kernels.
  quant: Any = None
  # Zero embedding rows after the vocabulary so that it splits over the mesh's 'tensor' axis
  # (`model.pad_vocab`); never in logits or exports.
  vocab_padding: int = 0

  def __post_init__(self):
    # Lists arrive from JSON and ml_collections; keep the dataclass hashable.
    object.__setattr__(self, 'layer_types', tuple(self.layer_types))
    if len(self.layer_types) != self.num_layers:
      raise ValueError(f'layer_types has {len(self.layer_types)} entries for {self.num_layers} layers')
    if unknown := set(self.layer_types) - {SLIDING, FULL}:
      raise ValueError(f'unknown layer types {sorted(unknown)}; expected {SLIDING!r} or {FULL!r}')
    if SLIDING in self.layer_types and not self.sliding_window:
      raise ValueError('sliding_attention layers need a positive sliding_window')
    if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
      raise ValueError(f'hidden_size {self.hidden_size} / num_heads {self.num_heads} / '
                       f'num_kv_heads {self.num_kv_heads} do not divide evenly')
    if self.remat_policy not in REMAT_POLICY_NAMES:
      raise ValueError(f'remat_policy {self.remat_policy!r} is not one of {REMAT_POLICY_NAMES}')
    if not isinstance(self.loss_chunk, int) or self.loss_chunk < 0:
      raise ValueError(f'loss_chunk must be an int ≥ 0 (0: automatic), got {self.loss_chunk!r}')
    if self.remat_scope not in REMAT_SCOPES:
      raise ValueError(f'remat_scope {self.remat_scope!r} is not one of {REMAT_SCOPES}')
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f'attention_impl {self.attention_impl!r} is not one of {ATTENTION_IMPLS}')
    if self.attention_block < 1:
      raise ValueError(f'attention_block {self.attention_block} must be positive')
    if self.head_dim % 2:
      raise ValueError(f'head_dim {self.head_dim} must be even for RoPE')

  @property
  def embedding_rows(self) -> int:
    return self.vocab_size + self.vocab_padding

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def layer_period(self) -> int:
    """Smallest p with layer_types[i] == layer_types[i % p]; layers are scanned in groups of p."""
    n = self.num_layers
    return next(p for p in range(1, n + 1)
                if n % p == 0 and all(t == self.layer_types[i % p] for i, t in enumerate(self.layer_types)))

  def replace(self, **changes: Any) -> 'ModelConfig':
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self), 'layer_types': list(self.layer_types)}


def pattern_layer_types(num_layers: int, sliding_window_pattern: int = 4) -> tuple[str, ...]:
  """Layer i slides iff (i + 1) % pattern != 0 (transformers' legacy `sliding_window_pattern`)."""
  return tuple(SLIDING if (i + 1) % sliding_window_pattern else FULL for i in range(num_layers))


def _size(num_layers, pattern=4, **kwargs) -> ModelConfig:
  return ModelConfig(num_layers=num_layers, layer_types=pattern_layer_types(num_layers, pattern), **kwargs)


# `tiny` is the size of the bundled models; `bench` is the peer-comparison shape of docs/benchmarks.md.
SIZES = {
    'tiny': lambda: _size(vocab_size=8000, hidden_size=256, intermediate_size=768, num_layers=4,
                          num_heads=4, num_kv_heads=2, sliding_window=64, max_position_embeddings=2048),
    'bench': lambda: _size(vocab_size=8000, hidden_size=256, intermediate_size=1024, num_layers=4,
                           num_heads=4, num_kv_heads=1, sliding_window=64, max_position_embeddings=2048),
    'small': lambda: _size(vocab_size=8000, hidden_size=512, intermediate_size=2048, num_layers=8,
                           num_heads=8, num_kv_heads=2, sliding_window=256, max_position_embeddings=4096),
    'command_r7b': lambda: _size(vocab_size=256000, hidden_size=4096, intermediate_size=14336, num_layers=32,
                                 num_heads=32, num_kv_heads=8, sliding_window=4096, logit_scale=0.25,
                                 max_position_embeddings=131072),
    'command_a_111b': lambda: _size(vocab_size=256000, hidden_size=12288, intermediate_size=36864,
                                    num_layers=64, num_heads=96, num_kv_heads=8, sliding_window=4096,
                                    logit_scale=0.25, max_position_embeddings=131072),
}


def get(name: str, **overrides: Any) -> ModelConfig:
  """A named size, optionally with fields replaced (e.g. dtype='bfloat16')."""
  if name not in SIZES:
    raise ValueError(f'unknown model size {name!r}; known sizes: {", ".join(SIZES)}')
  return SIZES[name]().replace(**overrides)
