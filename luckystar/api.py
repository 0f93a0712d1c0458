"""The notebook-facing surface (docs/models.md): `luckystar.load(...)` → `Model`."""

from luckystar.engine.loading import BUNDLED_DIR, BUNDLED_MODELS, Generation, Model, load

__all__ = ['BUNDLED_DIR', 'BUNDLED_MODELS', 'Generation', 'Model', 'load']
