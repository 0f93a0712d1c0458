"""Training: the shared train state, optimizer, update step, checkpoints, metrics and loop (DESIGN §2, §5).

Stage modules (`sft.py`, later `rloo.py`, `dpo.py`) hold the pure loss of their method plus a short
`run(config, workdir)`; everything else lives once here:

    state.py       TrainState, created sharded from `jax.eval_shape` (random or loaded params)
    optim.py       AdamW, linear warmup + cosine decay, global-norm clipping
    step.py        one jitted `update_fn(state, batch, rng)` from a pure `loss_fn(params, batch, rng)`
    checkpoint.py  orbax CheckpointManager: state + grain iterator, atomic, resumable
    metrics.py     metrics.jsonl, TensorBoard events, PNG curves
    loop.py        `run_training`: resume → steps → log / eval / checkpoint
    sft.py         hybrid SFT: the token loss and its `run` (stage 'sft')
"""
