"""Offline DPO for conciseness and language on the bundled tiny policy (docs/dpo.md, paper §2.5).

    python -m luckystar.main --config=configs/dpo.py --workdir=/tmp/luckystar-dpo
    python -m luckystar.main --config=configs/dpo.py:smoke --workdir=/tmp/luckystar-dpo-smoke

Samples the starting policy 4 times on 512 short train prompts (Korean MC, chat) in concise mode at
its normal sampling settings (temperature 1.0, as RLVR samples it) and pairs a direct correct answer
(chosen: the answer alone, '를 정답: C' or 'Berlin.', verified; `dpo.chosen='reference'` takes the SFT
reference reply instead) against one of those samples that is ≥ 1.4× and ≥ 3 tokens longer, a correct
one first (kind 'concise'), or that answers in the wrong language (kind 'language'). It also samples 512
train prompts of Korean MC, chat and math in reasoning mode, with the calculator, and keeps each prompt's
first correct reply as an anchor row (kind 'anchor'), trained by its NLL so that reasoning mode stays
where it was while the pairs move concise mode. Pairs and anchors go to workdir/dpo_pairs.jsonl
(+ dpo_pairs.json, their counts and config fingerprint). Reference log-probs of the starting params are
computed once and cached in workdir/dpo_reference.npz. Then sigmoid DPO with β = 0.1, plus the chosen
reply's NLL (RPO, weight 2) and the anchors' NLL (weight 1), at 1e-4, a tenth of SFT's rate, for 600
steps. Held-out correctness and response length in both modes (`eval/*`, 128 prompts per task and
language of Korean MC, chat and math) are logged at step 0, every 120 steps and at the end. Re-running
the same command on the same workdir resumes (and reuses the pairs and the reference log-probs).

The Korean MC chosen reply keeps the option's text before the letter ('를 정답: C'): the policy picks the
particle far more reliably than it finds the letter, so the letter alone costs MC correctness, and
relearning the lookup in the new format takes the long schedule (experiments/sweeps/dpo_anchors.md).

Math is not among the pair tasks: the policy cannot do arithmetic without thinking, so a direct math
answer is a number it would have to guess, and pairs teaching that guess cost reasoning-mode math.

Starts from `tiny-rlvr`, the post-RL policy (docs/dpo.md; --config.init_from takes any policy, e.g. an RLVR
run directory).
`python experiments/dpo_conciseness.py` runs it and writes experiments/dpo_conciseness.md.
Expected on 2 CPU cores: ~32 min; concise Korean MC / chat replies ~31% shorter, reasoning mode within 2 points.

`:with_math` adds short math to the pair tasks (the ablation behind the math paragraph above).

`:smoke` (tests): an untrained `tiny` policy (it never stops, so every sample is verbose) on 4 math
prompts × 2 samples of ≤ 24 tokens, no anchors, 3 steps of 2 pairs, a checkpoint every step, a 1-prompt eval.
"""

import ml_collections

from luckystar import config as config_lib


def get_config(arg=None):
  config = config_lib.base('dpo')
  config.init_from = 'tiny-rlvr'         # the post-RL policy (docs/dpo.md)
  config.total_steps = 600               # ≈ 6 epochs of pairs and anchors at batch 8: the MC lookup needs them
  config.batch_size = 8                  # pairs per step (all processes)
  config.learning_rate = 1e-4            # low: a tenth of SFT's 1e-3; 1e-5 moves no greedy reply
  config.warmup_steps = 5
  config.log_every = 1
  config.eval_every = 120                # held-out eval at step 0, every 120 steps and at the end
  config.checkpoint_every = 40
  config.sampling = ml_collections.ConfigDict(dict(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=128))
  config.dpo = ml_collections.ConfigDict(dict(
      # The loss (luckystar.stages.dpo docstring).
      loss_type='sigmoid',               # or 'robust' (rDPO), 'ipo', 'hinge' (SLiC)
      beta=0.1,
      label_smoothing=0.0,               # ε: cDPO for 'sigmoid', rDPO's flip rate for 'robust'
      ld_alpha=1.0,                      # LD-DPO: weight of a reply's tokens past the shorter reply's length; 1 = DPO
      sft_weight=2.0,                    # + weight · the chosen reply's per-token NLL (RPO): lifts it
      # Pairs: the policy's own verbose / wrong-language replies vs. verified reference replies.
      # Preference data, FORMAT:PATH[@WEIGHT] items (docs/data.md): preference_jsonl (TRL's layout) or dpo_pairs
      # (a dpo_pairs.jsonl this stage wrote elsewhere); '' = build pairs from the policy in the workdir.
      sources='',
      chosen='direct',                   # the answer alone ('를 정답: C'); 'reference': the SFT reference reply
      tasks=('korean_mc', 'chat'),       # concise-style prompts; concise math's verbose reply is the reasoning reply
      math_max_difficulty=1,             # short math only
      modes=('concise',),                # 'reasoning' adds language pairs in reasoning mode
      anchor_modes=('reasoning',),       # + on pair_prompts prompts of anchor_tasks, the policy's own first
      anchor_tasks=('korean_mc', 'chat', 'math'),   # correct reply in these modes, trained by its per-token
      anchor_weight=1.0,                 # NLL at this weight: keeps that mode where it was (≈ KL to the start)
      max_tool_turns=2,                  # the tool loop while sampling (reasoning mode calls the calculator)
      max_tool_result_tokens=96,
      pair_prompts=512,                  # train prompts sampled
      samples_per_prompt=4,
      pairs_per_prompt=1,                # per prompt, mode and kind
      verbose_min_ratio=1.4,             # 'concise' pair: rejected ≥ 1.4 × chosen response tokens ...
      verbose_min_extra=3,               # ... and ≥ chosen + 3
      max_prompt_tokens=384,
      sampling_batch=128,                # rollouts per sampling call
      reference_batch_size=16,           # pairs per reference log-prob batch
      length_multiple=32,                # batches are padded to a multiple of this many tokens
      # Held-out eval (luckystar.engine.evals.Settings): greedy, both modes, correctness and response length.
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
    config.dpo.anchor_modes = ()          # an untrained policy has no correct reply to anchor; skip sampling for one
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
