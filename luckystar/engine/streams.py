"""Every named random stream a run draws from, in one table, so no two choices share draws by accident.

Two kinds of key, numbered apart:
  numpy  `np.random.default_rng([seed, STREAM])`: which examples a stage takes (host-side choices).
  jax    `jax.random.fold_in(key, STREAM + i)`: sampling draws; `i` counts inside the stream (a mode, a
         refill round), so a stream's block ends below the next stream's number.

A value is part of every result drawn from it, and no fingerprint records it (a cached pair file would be
reused after a change): add a stream, never renumber one.

Taken without a name here: numpy [seed, 0 .. 2], SFT's synthetic smoke data per split
(`stages.sft.synthetic_sources`); jax key(seed) itself, the first draw of a stage that samples once
(rejection sampling, RLVR prompt selection); fold_in(step key, i), micro-batch i of an update
(`step.accumulate_gradients`; every loss today is deterministic, so micro-batch 1 sharing PREPARE's key
draws nothing twice).
"""

# ---- numpy: np.random.default_rng([seed, STREAM]) -----------------------------------------------------

RLVR_SELECTION = 17     # the pool sample whose pass rates RLVR prompt selection measures
RLVR_EVAL = 29          # RLVR's held-out eval prompts, drawn per task and language
DPO_PAIR_PROMPTS = 31   # the train prompts DPO samples pairs and anchors on

# ---- jax: jax.random.fold_in(key, STREAM + i) -----------------------------------------------------------

PREPARE = 1             # a step's rollouts (`loop.run_training`'s prepare): fold_in(step key, PREPARE)
DPO_PAIRS = 0           # DPO pair sampling in mode i: fold_in(key(seed), DPO_PAIRS + i)
DPO_ANCHORS = 1000      # DPO anchor sampling in mode i: fold_in(key(seed), DPO_ANCHORS + i), apart from the pairs'
RLVR_DYNAMIC = 4000     # RLVR dynamic sampling's refill round r: fold_in(prepare's key, RLVR_DYNAMIC + r)
