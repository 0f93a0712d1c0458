"""luckystar: the LuckyStar recipe (hybrid SFT → RLVR → DPO → int4 export) in one small JAX codebase."""

from luckystar.api import Model, load

__all__ = ['Model', 'load']
