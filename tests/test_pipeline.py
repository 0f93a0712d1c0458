"""grain pipelines: mixture proportions, packing that never crosses documents, exact resume."""

import collections

import numpy as np
import pytest

from luckystar.data import pipeline

pytestmark = pytest.mark.fast

SOURCES = {'reasoning': [f'r{i}' for i in range(97)], 'concise': [f'c{i}' for i in range(31)]}
WEIGHTS = {'reasoning': 0.8, 'concise': 0.2}


def test_mixture_proportions_within_two_percent():
  mixed = pipeline.mixture(SOURCES, WEIGHTS, seed=0)
  drawn = list(mixed[:10_000])
  counts = collections.Counter(name[0] for name in drawn)
  assert abs(counts['r'] / 10_000 - 0.8) <= 0.02 and abs(counts['c'] / 10_000 - 0.2) <= 0.02
  # Every source element appears (shuffled epochs, not a fixed prefix).
  assert set(drawn) == set(SOURCES['reasoning']) | set(SOURCES['concise'])


def test_processes_see_disjoint_shards():
  seen = [set(pipeline.mixture(SOURCES, WEIGHTS, seed=0, process_index=p, process_count=2)[:1000])
          for p in range(2)]
  assert seen[0] and seen[1] and not seen[0] & seen[1]
  assert seen[0] | seen[1] == set(SOURCES['reasoning']) | set(SOURCES['concise'])


def test_bad_mixture_specs_are_named():
  with pytest.raises(ValueError, match='different sets'):
    pipeline.mixture(SOURCES, {'reasoning': 1.0}, seed=0)
  with pytest.raises(ValueError, match='non-negative'):
    pipeline.mixture(SOURCES, {'reasoning': -1.0, 'concise': 0.5}, seed=0)


def _document(name: str) -> dict[str, np.ndarray]:
  """A document whose tokens identify it: [id, id, ...] with length 3 + id % 11."""
  doc_id = int(name[1:]) + (1000 if name[0] == 'c' else 0) + 1
  length = 3 + doc_id % 11
  return {'tokens': np.full(length, doc_id), 'loss_mask': np.arange(length) % 2}


def _batches(seq_len=32, batch_size=4):
  return pipeline.packed_batches(pipeline.mixture(SOURCES, WEIGHTS, seed=1), _document, seq_len=seq_len,
                                 batch_size=batch_size)


def test_packing_never_crosses_documents():
  iterator = iter(_batches())
  for _ in range(30):
    batch = next(iterator)
    assert {k: v.shape for k, v in batch.items()} == {k: (4, 32) for k in
                                                      ('tokens', 'loss_mask', 'segment_ids', 'positions')}
    for tokens, mask, segments, positions in zip(batch['tokens'], batch['loss_mask'], batch['segment_ids'],
                                                 batch['positions']):
      assert (tokens[segments == 0] == 0).all()  # padding
      for segment in set(segments[segments > 0].tolist()):
        where = np.flatnonzero(segments == segment)
        assert (np.diff(where) == 1).all()                          # contiguous
        assert (positions[where] == np.arange(len(where))).all()    # positions restart per document
        assert len(set(tokens[where].tolist())) == 1                # one document's tokens only
        assert len(where) == 3 + tokens[where[0]] % 11              # the whole document, untruncated
        assert (mask[where] == np.arange(len(where)) % 2).all()     # its own loss mask


def test_restored_iterator_yields_the_same_batches():
  iterator = iter(_batches())
  for _ in range(7):
    next(iterator)
  state = iterator.get_state()
  expected = [next(iterator) for _ in range(50)]
  restored = iter(_batches())
  restored.set_state(state)
  for want in expected:
    got = next(restored)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])
