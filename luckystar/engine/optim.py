"""AdamW with linear warmup and cosine decay, and global-norm clipping (docs/training.md).

Config keys: `learning_rate` (peak), `warmup_steps`, `total_steps` (the cosine reaches 0 there),
`weight_decay`, `b1`, `b2`, `max_grad_norm`.
"""

from typing import Any

import jax
import optax


def learning_rate_schedule(config, updates_per_step: int = 1) -> optax.Schedule:
  """0 → `learning_rate` linearly over `warmup_steps`, then cosine to 0 at `total_steps`; a function of
  the optimizer's update count, which is `updates_per_step` per training step (PPO-style epochs)."""
  warmup, total = config.warmup_steps * updates_per_step, config.total_steps * updates_per_step
  return optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=config.learning_rate, warmup_steps=warmup,
                                            decay_steps=max(total, warmup + 1), end_value=0.0)


def decay_mask(params: Any) -> Any:
  """Weight decay on matrices and embeddings only, not on LayerNorm weights (scanned norms are 2-D)."""
  def decays(path, _):
    return not any('norm' in str(getattr(key, 'key', key)) for key in path)
  return jax.tree_util.tree_map_with_path(decays, params)


def make(config, updates_per_step: int = 1) -> optax.GradientTransformation:
  """The optimizer every training stage uses; its step count advances only on applied updates."""
  return optax.chain(
      optax.clip_by_global_norm(config.max_grad_norm),
      optax.adamw(learning_rate_schedule(config, updates_per_step), b1=config.b1, b2=config.b2,
                  weight_decay=config.weight_decay, mask=decay_mask))
