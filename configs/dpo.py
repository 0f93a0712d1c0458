"""Offline DPO for conciseness and language on the bundled tiny policy (DESIGN §5, paper §2.5).

    python -m luckystar.main --config=configs/dpo.py --workdir=/tmp/luckystar-dpo
    python -m luckystar.main --config=configs/dpo.py:smoke --workdir=/tmp/luckystar-dpo-smoke

Samples the starting policy 4 times on 512 short train prompts (Korean MC, chat) in concise mode at
its normal sampling settings (temperature 1.0, as RLVR samples it) and pairs a direct correct answer
(chosen: the answer alone, '정답: C' or 'Berlin.', verified; `dpo.chosen='reference'` takes the SFT
reference reply instead) against one of those samples that is ≥ 1.5× and ≥ 3 tokens longer, a correct
one first (kind 'concise'), or that answers in the wrong language (kind 'language'); pairs go to
workdir/dpo_pairs.jsonl (+ dpo_pairs.json, their counts and config fingerprint). Reference log-probs of
the starting params are computed once and cached in workdir/dpo_reference.npz. Then sigmoid DPO with
β = 0.1 plus the chosen reply's NLL (RPO, weight 1) at 1e-4, a tenth of SFT's rate; held-out
correctness and response length in both modes (`eval/*`, 128 prompts per task and language of Korean
MC, chat and math) at step 0 and at the end. Re-running the same command on the same workdir resumes
(and reuses the pairs and the reference log-probs).

Math is not among the pair tasks: concise math's verbose reply ('The answer is 35.') is the reasoning
mode's final reply, and pairs against it took reasoning-mode math from 97.7% to 85.5% (`:with_math`;
experiments/sweeps/dpo_with_math.md).

Starts from `tiny-rlvr` (DESIGN §7; --config.init_from takes any policy, e.g. an RLVR run directory).
`python experiments/dpo_conciseness.py` runs it and writes experiments/dpo_conciseness.md. Measured on
2 CPU cores: ≈ 4.5 min, 434 pairs; concise Korean MC replies 36% shorter (11.8 → 7.5 tokens) but
11.7 points less often right: after 60 steps `tiny-rlvr` still finds the letter through its 'verbose'
MC reply (the filled-in sentence, then the letter). 240 steps recover MC correctness (19.5% at 6.0
tokens) but cost reasoning mode 13 points (README "Offline DPO"); the other concise replies were short
already (see the report).

`:with_math` adds short math to the pair tasks (the ablation behind the paragraph above).

`:smoke` (tests): an untrained `tiny` policy (it never stops, so every sample is verbose) on 4 math
prompts × 2 samples of ≤ 24 tokens, 3 steps of 2 pairs, a checkpoint every step, a 1-prompt eval.
"""

import ml_collections

from luckystar import config as config_lib


def get_config(arg=None):
  config = config_lib.base('dpo')
  config.init_from = 'tiny-rlvr'         # the post-RL policy (DESIGN §7)
  config.total_steps = 60                # ≈ 2 epochs of ~250 pairs at batch 8
  config.batch_size = 8                  # pairs per step (all processes)
  config.learning_rate = 1e-4            # low: a tenth of SFT's 1e-3; 1e-5 moves no greedy reply
  config.warmup_steps = 5
  config.log_every = 1
  config.eval_every = 0                  # held-out eval at step 0 and at the end only
  config.checkpoint_every = 10
  config.sampling = ml_collections.ConfigDict(dict(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=128))
  config.dpo = ml_collections.ConfigDict(dict(
      # The loss (luckystar.train.dpo docstring).
      loss_type='sigmoid',               # or 'robust' (rDPO), 'ipo'
      beta=0.1,
      label_smoothing=0.0,               # ε: cDPO for 'sigmoid', rDPO's flip rate for 'robust'
      sft_weight=1.0,                    # + weight · the chosen reply's per-token NLL (RPO): lifts it
      # Pairs: the policy's own verbose / wrong-language replies vs. verified reference replies.
      pairs_file='',                     # a dpo_pairs.jsonl made elsewhere; '' = build them in the workdir
      chosen='direct',                   # the answer alone ('정답: C'); 'reference': the SFT reference reply
      tasks=('korean_mc', 'chat'),       # concise-style prompts; concise math's verbose reply is the reasoning reply
      math_max_difficulty=1,             # short math only
      modes=('concise',),                # 'reasoning' adds language pairs in reasoning mode
      pair_prompts=512,                  # train prompts sampled
      samples_per_prompt=4,
      pairs_per_prompt=1,                # per prompt, mode and kind
      verbose_min_ratio=1.5,             # 'concise' pair: rejected ≥ 1.5 × chosen response tokens ...
      verbose_min_extra=3,               # ... and ≥ chosen + 3
      max_prompt_tokens=384,
      sampling_batch=128,                # rollouts per sampling call
      reference_batch_size=16,           # pairs per reference log-prob batch
      length_multiple=32,                # batches are padded to a multiple of this many tokens
      # Held-out eval (luckystar.evals.core.Settings): greedy, both modes, correctness and response length.
      task_eval=ml_collections.ConfigDict(dict(tasks=('korean_mc', 'chat', 'math'), modes=('concise', 'reasoning'),
                                               per_task_language=128, max_new_tokens=160, batch_size=128)),
  ))

  if arg == 'smoke':
    config.init_from = 'random:tiny'
    config.total_steps = 3
    config.batch_size = 2
    config.warmup_steps = 0
    config.learning_rate = 1e-3          # an untrained model: let the 3 steps move the margins visibly
    config.checkpoint_every = 1
    config.sampling.max_new_tokens = 24
    config.dpo.tasks = ('math',)
    config.dpo.sft_weight = 0.0           # step 1's loss is then log 2 exactly: the policy is its reference
    config.dpo.pair_prompts = 4
    config.dpo.samples_per_prompt = 2
    config.dpo.sampling_batch = 2           # 2 rows per sampling call, as the eval's: one sampler compile
    config.dpo.reference_batch_size = 4
    config.dpo.task_eval = ml_collections.ConfigDict(dict(tasks=('math',), modes=('concise', 'reasoning'),
                                                          per_task_language=1, max_new_tokens=8, batch_size=2))
  elif arg == 'with_math':
    config.dpo.tasks = ('korean_mc', 'chat', 'math')
  elif arg:
    raise ValueError(f'unknown variant configs/dpo.py:{arg}; expected configs/dpo.py, configs/dpo.py:with_math '
                     'or configs/dpo.py:smoke')
  return config
