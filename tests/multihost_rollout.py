"""One process of tests/test_multihost.py's scripted rollout: `python tests/multihost_rollout.py OUT_DIR PROCESS
PROCESSES` (JAX_COORDINATOR_ADDRESS set when PROCESSES > 1).

A random model nudged to call tools (`test_sampling.Nudged`) samples 8 rows in 4 slots with its params split
over every process's devices (fsdp). The scripted tool answers only the second half of the rows (those process 1
owns when there are two): they take up to 3 tool turns each while the first half ends at its first action,
so one process's rows keep decoding and calling tools long after the other's are done. Then row 5's host work
raises on its owner. Writes OUT_DIR/process_<i>.json: every row's tokens, log-probs, tool results and stop
reason, the rows whose tool this process ran, and the error it raised."""

import json
import pathlib
import sys

import jax
import numpy as np

from luckystar import distributed
from luckystar import model
from luckystar import sampling
from luckystar.model import sharding
import test_sampling

ROWS = 8


def main(out_dir: str, process: int, processes: int) -> None:
  if processes > 1:
    jax.distributed.initialize(num_processes=processes, process_id=process, initialization_timeout=60)
  mesh = sharding.make_mesh({'data': 1, 'fsdp': -1, 'tensor': 1})
  config = test_sampling.CONFIG.replace(vocab_size=test_sampling.TOKENIZER.vocab_size)
  params = jax.device_put(model.init(config, jax.random.key(7)), model.param_shardings(config, mesh))
  assert (processes == 1) == params['embedding'].is_fully_addressable   # no host holds the whole model
  rng = np.random.default_rng(7)
  prompts = [prompt for n in (5, 12, 3, 9) for prompt in [rng.integers(16, 8000, n).tolist()] * 2]
  called = []

  def tool_fn(row, action):
    del action
    called.append(row)
    return 'z ' * (row % 3 + 1) if row >= ROWS // 2 else None

  with sharding.activate(mesh):
    rollouts = sampling.rollout(test_sampling.Nudged(sampling.CachedDecoder(config)), params,
                                test_sampling.TOKENIZER, prompts, rng=jax.random.key(3), tool_fn=tool_fn,
                                settings=sampling.RolloutSettings(max_new_tokens=48, max_tool_turns=3, temperature=1.0,
                                                                  length_multiple=16, slots=4))
  try:   # a row's host work fails on its owner: every process raises, none waits for the others forever
    distributed.run_owned(lambda row: 1 // (row - 5), range(ROWS), ROWS)
    error = None
  except (RuntimeError, ZeroDivisionError) as e:
    error = str(e)
  record = {'called': sorted(set(called)), 'error': error, 'rows': [
      {'tokens': r.token_ids.tolist(), 'logprobs': r.untruncated_logprobs.tolist(), 'tool_results': r.tool_results,
       'stop_reason': r.stop_reason} for r in rollouts]}
  (pathlib.Path(out_dir) / f'process_{process}.json').write_text(json.dumps(record))


if __name__ == '__main__':
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
