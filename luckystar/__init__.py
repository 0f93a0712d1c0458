"""luckystar: the LuckyStar recipe (hybrid SFT → RLVR → DPO → int4 export) in one small JAX codebase."""

__all__ = ['Model', 'load']


def __getattr__(name):
  # `import luckystar` stays cheap; the model stack loads on first use of luckystar.load / Model.
  if name in __all__:
    from luckystar import api
    return getattr(api, name)
  raise AttributeError(f'module luckystar has no attribute {name!r}')
