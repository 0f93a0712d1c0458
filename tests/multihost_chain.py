"""The config of tests/test_multihost.py: the RL part of the smoke pipeline (configs/pipeline.py:smoke) from the
bundled models: rejection sampling from tiny-teacher (NL2SQL rows call the SQL tool), RLVR as configs/rlvr.py:smoke
for 2 steps (a checkpoint every step, so a run killed after step 1 resumes there), DPO (from a random policy, as in
the smoke chain) and the eval stage on the RLVR policy. Every stage lays its mesh as fsdp over all devices, so under several processes each holds a part of
every parameter (a gather to one host would fail)."""

import pathlib

import ml_collections

from luckystar import config as config_lib

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / 'configs'
ORDER = ('rejection_sampling', 'rlvr', 'dpo', 'eval')


def get_config(arg=None):
  del arg
  config = config_lib.from_file(CONFIGS / 'pipeline.py', 'smoke')
  smoke = config.pipeline.stages
  rlvr = config_lib.from_file(CONFIGS / 'rlvr.py', 'smoke')   # chat prompts whose rewards vary: the loss is not 0
  rlvr.update(dict(total_steps=2, checkpoint_every=1))
  rlvr.rlvr.update(dict(selection_prompts=ml_collections.ConfigDict(dict(chat=2)), select_pass_rate=(0.0, 1.0),
                        eval_prompts=8, eval_samples=0))   # 8 rows, as a step's rollouts: the same programs
  stages = {'rejection_sampling': smoke.rejection_sampling, 'rlvr': rlvr, 'dpo': smoke.dpo, 'eval': smoke.eval_int4}
  stages['rejection_sampling'].init_from = 'tiny-teacher'
  stages['rejection_sampling'].sampling.max_new_tokens = 64   # room for an SQL call and its result
  stages['rejection_sampling'].rejection_sampling.sources = 'bundled:nl2sql'
  # The eval's rollouts in the shape of the pair sampling's (2 slots, 24 tokens): the same compiled programs.
  stages['dpo'].dpo.task_eval.update(dict(modes=('concise',), max_new_tokens=24))
  stages['eval'].init_from = '@rlvr'
  stages['eval'].eval.update(dict(suites=('math',), max_new_tokens=32))
  for stage in stages.values():
    stage.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))
  config.pipeline = ml_collections.ConfigDict(dict(order=ORDER, stages=ml_collections.ConfigDict(stages)))
  return config
