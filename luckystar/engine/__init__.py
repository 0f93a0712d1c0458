"""The engine: what every stage shares, written once (README.md, docs/training.md). Stages
(`luckystar/stages/`) hold their method's pure loss and a short `run(config, workdir)` on top of it.

    loading.py     `load(name or path)` → Model: bundled names, run directories, transformers directories
    state.py       TrainState, created sharded from `jax.eval_shape`; `start`: model, mesh, optimizer, state
    optim.py       AdamW, linear warmup + cosine decay, global-norm clipping
    step.py        one jitted `update_fn(state, batch, rng)` from a pure `loss_fn(params, batch, rng)`
    logprobs.py    token log-probs and cross-entropy of a batch, scored columns
    checkpoint.py  orbax CheckpointManager: state + grain iterator, atomic, resumable
    metrics.py     metrics.jsonl, TensorBoard events, PNG curves
    loop.py        `run_training`: resume → steps → log / eval / checkpoint
    rollouts.py    render a prompt, sample with the tool loop, score (RL, rejection sampling, DPO)
    evals.py       held-out evaluation: task correctness by generation, token loss on conversations
    prompts.py     which examples a stage samples or evaluates: suites and `sources` items alike
    judging.py     the stage's LLM judge from `config.judge`, its verdicts cached in the workdir
    artifacts.py   files derived once per workdir under a fingerprint; the data report
"""
