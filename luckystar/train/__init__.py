"""Training: the shared train state, optimizer, update step, checkpoints, metrics and loop (DESIGN §2, §5).

Stage modules (`sft.py`, `rloo.py`, `rejection_sampling.py`, `dpo.py`) hold the pure loss of their method plus a short
`run(config, workdir)`; everything else lives once here:

    state.py       TrainState, created sharded from `jax.eval_shape` (random or loaded params);
                   `start`: model, mesh, optimizer and state, the start-up every training stage shares
    optim.py       AdamW, linear warmup + cosine decay, global-norm clipping
    step.py        one jitted `update_fn(state, batch, rng)` from a pure `loss_fn(params, batch, rng)`
    checkpoint.py  orbax CheckpointManager: state + grain iterator, atomic, resumable
    metrics.py     metrics.jsonl, TensorBoard events, PNG curves
    loop.py        `run_training`: resume → steps → log / eval / checkpoint
    sft.py         hybrid SFT: the token loss and its `run` (stage 'sft')
    rollouts.py    render a prompt, sample with the SQL tool loop, score (shared by RL, RS and DPO)
    rloo.py        RLVR: RLOO advantages, the policy-gradient loss, prompt selection, `run` (stage 'rlvr')
    rejection_sampling.py  best-of-N teacher traces for the cold start (stage 'rejection_sampling')
    dpo.py         offline DPO: pair builders, the DPO/IPO/robust losses, cached reference log-probs,
                   its `run` (stage 'dpo')
"""
