"""Bucketed sizes: a few distinct shapes, so that a run reuses a few compiled programs."""

import math
from typing import Sequence

import jax
import numpy as np


def power_of_two(value: int) -> int:
  """The smallest power of two >= value (1 for value <= 1)."""
  return 1 << (max(value, 1) - 1).bit_length()


def round_up(value: int, multiple: int) -> int:
  return -(-value // multiple) * multiple


def bucket(value: int, multiple: int) -> int:
  """value rounded up to a positive multiple: few distinct shapes, few compiled programs."""
  return max(multiple, round_up(value, multiple))


def chunk_width(width: int, length_multiple: int) -> int:
  """An appended chunk's bucketed width: a power of two up to length_multiple, then its multiples."""
  return bucket(width, length_multiple) if width > length_multiple else power_of_two(width)


def stop_array(stop_ids: Sequence[int]) -> np.ndarray:
  """stop_ids as the decode loop takes them: int32, padded with -1 (never matches) to a multiple of 4."""
  stops = np.full(bucket(len(stop_ids), 4), -1, np.int32)  # a few sizes, so stop sets share programs
  stops[:len(stop_ids)] = stop_ids
  return stops


def batch_devices() -> int:
  """How many ways the active mesh (`sharding.activate`) splits the batch axis; 1 without one."""
  mesh = jax.sharding.get_abstract_mesh()
  return 1 if mesh.empty else math.prod(mesh.shape.get(axis, 1) for axis in ('data', 'fsdp'))
