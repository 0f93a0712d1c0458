"""Streaming checkpoint I/O: a transformers checkpoint read straight onto a device mesh, each device reading only
its block of each tensor, equals the whole-file read."""

import collections
import math

import jax
import numpy as np
import pytest

from luckystar import model
from luckystar.engine import loading
from luckystar.interop import hf


def _mesh():
  return model.sharding.make_mesh(dict(data=1, fsdp=4, tensor=2))


@pytest.mark.parametrize('source', ['tiny-sft', 'cohere'])
def test_sharded_load_equals_the_whole_read_and_each_device_reads_only_its_block(source, request, monkeypatch):
  path = loading.BUNDLED_DIR / source if source == 'tiny-sft' else request.getfixturevalue('cohere_dir')
  config, headers = hf.read_config(path)
  config, _ = model.pad_vocab(config, None, 2)
  reads = collections.defaultdict(list)
  real_read = hf.read_block

  def recorded(tensor, index):
    block = real_read(tensor, index)
    reads[next(name for name, h in headers.items() if h == tensor)].append(block.size)
    return block
  monkeypatch.setattr(hf, 'read_block', recorded)
  shardings = model.param_shardings(config, _mesh())
  params = hf.load_sharded(config, headers, shardings)

  whole = model.pad_vocab(*hf.load_hf(path), 2)[1]
  for (key, got), want, sharding in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(whole),
                                        jax.tree.leaves(shardings)):
    assert got.sharding == sharding, jax.tree_util.keystr(key)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want).astype(got.dtype), err_msg=jax.tree_util.keystr(key))
  # Every tensor was read, each read at most one device's block of its leaf (one layer of a scanned leaf).
  block = {hf.EMBEDDING: math.prod(shardings['embedding'].shard_shape(params['embedding'].shape)),
           'model.norm.weight': math.prod(shardings['norm']['weight'].shard_shape((config.hidden_size,)))}
  for i in range(config.layer_period):
    for hf_name, ours, _, _ in hf._layer_tensors(config):
      node = params['layers'][f'layer_{i}']
      for key in ours:
        node = node[key]
      for g in range(config.num_layers // config.layer_period):
        block[f'model.layers.{g * config.layer_period + i}.{hf_name}'] = math.prod(
            node.sharding.shard_shape(node.shape)[1:])
  assert set(reads) == set(headers) == set(block)
  for name, sizes in reads.items():
    assert max(sizes) <= block[name] < math.prod(headers[name].shape), (name, max(sizes), block[name])


def test_a_sharded_save_streams_into_bounded_shards_that_load_back_exactly(cohere_dir, tmp_path):
  """Params on an fsdp × tensor mesh, written a module at a time into shards of at most ~100 kB (an index names
  them): luckystar and transformers read the same weights back."""
  config, headers = hf.read_config(cohere_dir)
  config, _ = model.pad_vocab(config, None, 2)
  params = hf.load_sharded(config, headers, model.param_shardings(config, _mesh()))
  hf.save_hf(tmp_path / 'out', config, params, dtype='bfloat16', max_shard_bytes=100_000)
  files = sorted(p.name for p in (tmp_path / 'out').glob('*.safetensors'))
  assert len(files) > 5 and (tmp_path / 'out' / hf.INDEX_FILE).is_file()
  for file in files:   # within the bound, or one tensor larger than it alone
    tensors = hf._read_header(tmp_path / 'out' / file)
    data = sum(math.prod(t.shape) * 2 for t in tensors.values())
    assert data <= 100_000 or len(tensors) == 1, (file, data, len(tensors))
  again = hf.read_safetensors(tmp_path / 'out')
  original = hf.read_safetensors(cohere_dir)
  assert set(again) == set(original) - {'lm_head.weight'}
  for name, tensor in again.items():
    np.testing.assert_array_equal(tensor, original[name], err_msg=name)
  transformers = pytest.importorskip('transformers')
  pytest.importorskip('torch')
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'out')
  embedding = hf_model.model.embed_tokens.weight.detach().float().numpy()
  np.testing.assert_array_equal(embedding, original[hf.EMBEDDING].astype(np.float32))
