"""Advantage estimators for RLVR, chosen by `config.rlvr.advantage` (docs/rl.md#advantage-estimators).

Each is a pure function `(rewards, survived) -> (advantages, used)`, all [prompts, k]: rewards float,
survived bool (False: a dropped rollout, e.g. overlong). Every estimator keeps one rule for dropped rows: a
dropped row is out of every statistic and out of the loss, and a group with fewer than two survivors has no
baseline, so none of its rows is used. Unused rows get advantage 0. A new estimator is one function here and
one line in ESTIMATORS.
"""

import jax
import jax.numpy as jnp

# Added to a std before dividing by it (TRL's GRPO value): a group or batch whose rewards are all equal, up to
# rounding, gets advantages ≈ 0 rather than rounding noise scaled up to ±1.
STD_EPSILON = 1e-4


def _survivors(rewards: jax.Array, survived: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(rewards with dropped rows 0, survived as bool, survivors per group [prompts, 1], used)."""
  survived = jnp.asarray(survived, bool)
  rewards = jnp.where(survived, jnp.asarray(rewards, jnp.float32), 0.0)
  survivors = survived.sum(-1, keepdims=True)
  return rewards, survived, survivors, survived & (survivors >= 2)


def _group_mean(rewards: jax.Array, survivors: jax.Array) -> jax.Array:
  """[prompts, 1]: the mean reward of a group's survivors (dropped rows already 0)."""
  return rewards.sum(-1, keepdims=True) / jnp.maximum(survivors, 1)


def rloo_advantages(rewards: jax.Array, survived: jax.Array) -> tuple[jax.Array, jax.Array]:
  """RLOO (Ahmadian et al. 2024): A_i = r_i − mean(r_j : j ≠ i, j survived), the leave-one-out baseline.

  Unbiased (the baseline does not depend on r_i); equal to K/(K−1) · (r_i − group mean) for K survivors.
  """
  rewards, _, survivors, used = _survivors(rewards, survived)
  baseline = (rewards.sum(-1, keepdims=True) - rewards) / jnp.maximum(survivors - 1, 1)
  return jnp.where(used, rewards - baseline, 0.0), used


def grpo_advantages(rewards: jax.Array, survived: jax.Array) -> tuple[jax.Array, jax.Array]:
  """GRPO (Shao et al. 2024, DeepSeekMath): A_i = (r_i − mean) / (std + STD_EPSILON) over the group's
  survivors; std is the sample std (ddof 1), as TRL and verl compute it."""
  rewards, survived, survivors, used = _survivors(rewards, survived)
  centred = rewards - _group_mean(rewards, survivors)
  variance = jnp.where(survived, centred ** 2, 0.0).sum(-1, keepdims=True) / jnp.maximum(survivors - 1, 1)
  return jnp.where(used, centred / (jnp.sqrt(variance) + STD_EPSILON), 0.0), used


def dr_grpo_advantages(rewards: jax.Array, survived: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i − mean over the group's
  survivors; no std division, which would weight groups by how little their rewards vary."""
  rewards, _, survivors, used = _survivors(rewards, survived)
  return jnp.where(used, rewards - _group_mean(rewards, survivors), 0.0), used


def reinforce_pp_advantages(rewards: jax.Array, survived: jax.Array) -> tuple[jax.Array, jax.Array]:
  """REINFORCE++ with a group baseline (Hu 2025, REINFORCE++-baseline): a_i = r_i − group mean, then
  normalised over the batch, A_i = (a_i − mean(a)) / (std(a) + STD_EPSILON), mean and std (ddof 0) over every
  used row of every group: one scale for the whole batch instead of one per group."""
  rewards, _, survivors, used = _survivors(rewards, survived)
  centred = jnp.where(used, rewards - _group_mean(rewards, survivors), 0.0)
  count = jnp.maximum(used.sum(), 1)
  mean = centred.sum() / count                  # 0 up to rounding: each group's deviations sum to 0
  std = jnp.sqrt(jnp.where(used, (centred - mean) ** 2, 0.0).sum() / count)
  return jnp.where(used, (centred - mean) / (std + STD_EPSILON), 0.0), used


ESTIMATORS = {
    'rloo': rloo_advantages,                  # leave-one-out mean (Ahmadian et al. 2024); the paper's
    'grpo': grpo_advantages,                  # group mean and std (Shao et al. 2024)
    'dr_grpo': dr_grpo_advantages,            # group mean only (Liu et al. 2025)
    'reinforce_pp': reinforce_pp_advantages,  # group mean, then batch std (Hu 2025)
}
