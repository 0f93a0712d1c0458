"""RLVR with RLOO on the bundled tiny policy — the main job (DESIGN §5, paper §2.4).

    python -m luckystar.main --config=configs/rlvr.py --workdir=/tmp/luckystar-rlvr

Status: the RLOO stage is not built yet; the command stops with a clear
"stage not built yet" message instead of pretending to train.
"""

from luckystar import config as config_lib


def get_config(arg=None):
  del arg
  config = config_lib.base('rlvr')
  config.init_from = 'tiny-sft'
  config.rlvr.samples_per_prompt = 8
  config.rlvr.language_penalty = 0.5    # r = correctness − 0.5·[response language ≠ prompt language]
  config.rlvr.drop_overlong = True      # overlong rollouts leave the baseline and the loss
  config.rlvr.kl_beta = 0.0             # 0 ⇒ no reference params held in memory
  return config
