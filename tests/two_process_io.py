"""One of two jax processes (tests/test_checkpoint_io.py): streams a transformers checkpoint onto a mesh whose
fsdp axis spans both processes, then saves it again into small shards. Usage: SOURCE OUT PROCESS_ID PORT."""

import sys

import jax

source, out, process_id, port = sys.argv[1:5]
jax.distributed.initialize(coordinator_address=f'127.0.0.1:{port}', num_processes=2, process_id=int(process_id),
                           initialization_timeout=60)

from luckystar import model  # noqa: E402  (after initialize: jax's view of the devices is fixed then)
from luckystar.interop import hf  # noqa: E402

config, headers = hf.read_config(source)
config, _ = model.pad_vocab(config, None, 2)
params = hf.load_sharded(config, headers, model.param_shardings(config, model.sharding.make_mesh(
    dict(data=1, fsdp=4, tensor=2))))
assert not params['embedding'].is_fully_addressable   # half of every leaf lives in the other process
hf.save_hf(out, config, params, dtype='bfloat16', max_shard_bytes=200_000)
print('saved', jax.process_index())
