"""Tests of the experiments' own code: `experiments/` on sys.path, so a test imports a script by its name."""

import pathlib
import sys

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1]
if str(EXPERIMENTS) not in sys.path:
  sys.path.insert(0, str(EXPERIMENTS))
