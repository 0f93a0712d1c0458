"""grain pipelines: weighted mixtures, per-process sharding, packing with segment ids, batching.

    sources ─► shard by process ─► shuffle ─► repeat ─► mix(weights) ─► encode ─► pack ─► batch

The iterator is checkpointable: `it.get_state()` / `it.set_state(state)` restore the exact
position, so batches after a restore equal those of an uninterrupted run.
"""

from typing import Any, Callable, Mapping, Sequence

import grain
import jax
import numpy as np

Features = dict[str, np.ndarray]



def encode(item: Any) -> dict[str, np.ndarray]:
  """A rendered conversation, {'tokens', 'loss_mask'} or an (ids, loss_mask) pair → int32 features."""
  ids, mask = (item['tokens'], item['loss_mask']) if isinstance(item, Mapping) else item
  return {'tokens': np.asarray(ids, np.int32), 'loss_mask': np.asarray(mask, np.int32)}

# For iterators whose items are built from data already in memory (RL prompt indices, DPO pair batches): each
# item made when the loop asks for it. grain's default reads 500 items ahead on 16 threads, CPU that the steps
# (and, across processes, every collective waiting on the slowest process) need.
ON_DEMAND = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def shard(dataset: grain.MapDataset, process_index: int | None = None, process_count: int | None = None
          ) -> grain.MapDataset:
  """This process's slice of a finite dataset (every process sees a disjoint part)."""
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  return dataset[index::count]


def mixture(sources: Mapping[str, Sequence[Any]], weights: Mapping[str, float], *, seed: int,
            process_index: int | None = None, process_count: int | None = None) -> grain.MapDataset:
  """An infinite mixture drawing from each source in proportion to its weight.

  Each source is sharded by process, shuffled (a new order every epoch) and repeated before mixing.
  """
  if set(sources) != set(weights):
    raise ValueError(f'mixture sources {sorted(sources)} and weights {sorted(weights)} name different sets')
  if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
    raise ValueError(f'mixture weights must be non-negative with a positive sum, got {dict(weights)}')
  names = sorted(n for n in sources if weights[n] > 0)
  datasets = []
  for i, name in enumerate(names):
    local = shard(grain.MapDataset.source(list(sources[name])), process_index, process_count)
    if len(local) == 0:
      raise ValueError(f'mixture source {name!r} has no examples for this process')
    datasets.append(local.shuffle(seed=seed + 1000 * i).repeat())
  return grain.MapDataset.mix(datasets, [weights[n] for n in names])


def truncate(features: Features, max_length: int) -> Features:
  return {k: v[:max_length] for k, v in features.items()}


def packed_batches(dataset: grain.MapDataset, encode: Callable[[Any], Features], *, seq_len: int,
                   batch_size: int, num_packing_bins: int | None = None) -> grain.IterDataset:
  """Encode each element to {'tokens', 'loss_mask'} (1-D int arrays), pack several documents per row
  and batch. Rows carry `segment_ids` (0 = padding) and `positions` restarting at 0 per document,
  so attention and RoPE never cross documents."""
  def encode_truncated(element):
    features = encode(element)
    return {k: np.asarray(v, np.int32) for k, v in truncate(features, seq_len).items()}

  packed = grain.experimental.FirstFitPackIterDataset(
      dataset.map(encode_truncated).to_iter_dataset(),
      length_struct={'tokens': seq_len, 'loss_mask': seq_len},
      num_packing_bins=num_packing_bins or batch_size, shuffle_bins=False)

  def rename(row: Features) -> Features:
    return {'tokens': row['tokens'], 'loss_mask': row['loss_mask'], 'segment_ids': row['tokens_segment_ids'],
            'positions': row['tokens_positions']}

  return packed.map(rename).batch(batch_size, drop_remainder=True)
