"""The notebook-facing surface (DESIGN §8): `luckystar.load(...)` → `Model`."""

from luckystar.engine.loading import Generation, Model, load

__all__ = ['Generation', 'Model', 'load']
