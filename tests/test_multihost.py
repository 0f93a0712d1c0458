"""The RL stages across processes (docs/models.md): two processes on 127.0.0.1 (jax.distributed, gloo CPU collectives),
one CPU device each, the mesh's fsdp spanning both, so neither holds the whole model and a gather to one host
would fail.

- A scripted rollout (tests/multihost_rollout.py): the rows process 1 owns take three tool turns each while
  process 0's end at their first action; both processes sample the 1-process run's tokens, and each ran only
  its own rows' tools; a row whose host work fails on its owner makes both processes raise.
- The RL chain of the smoke pipeline (tests/multihost_chain.py: rejection sampling → RLVR → DPO → eval), both
  processes killed after RLVR's step-1 checkpoint and re-run: every artifact and figure of the 1-process run.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

import main_runs
from luckystar.engine import checkpoint
from luckystar.engine import metrics

CHAIN = 'tests/multihost_chain.py'
PROCESSES = 2
TIMEOUT_S = 420
HERE = pathlib.Path(__file__).resolve().parent


def scripted_rollout(out_dir: pathlib.Path, processes: int) -> list[subprocess.Popen]:
  out_dir.mkdir(parents=True)
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'} | {
      'JAX_PLATFORMS': 'cpu', 'JAX_COORDINATOR_ADDRESS': f'127.0.0.1:{main_runs.free_port()}'}
  return [subprocess.Popen([sys.executable, str(HERE / 'multihost_rollout.py'), str(out_dir), str(i), str(processes)],
                           cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i in range(processes)]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp('multihost')
  cache, one, two = root / 'jax_cache', root / 'one_process', root / 'two_processes'

  def finish(processes):
    for p in processes:
      _, err = p.communicate(timeout=TIMEOUT_S)
      assert p.returncode == 0, err[-3000:]

  # The one-process runs together, then each two-process launch alone: processes in lockstep (every collective
  # waits for both) slow down many times over when more processes than cores compete.
  single = main_runs.start(CHAIN, one, cache_dir=cache, env={'JAX_PLATFORMS': 'cpu'})
  finish(scripted_rollout(root / 'rollout_1', 1))
  code, log = main_runs.finish(single, timeout=TIMEOUT_S)
  assert code == 0, log[-3000:]
  finish(scripted_rollout(root / f'rollout_{PROCESSES}', PROCESSES))
  crashed = main_runs.launch_together(CHAIN, two, processes=PROCESSES, cache_dir=cache, crash_after=1,
                                      timeout=TIMEOUT_S)
  after_crash = sorted(p.name for p in (two / 'rlvr' / 'checkpoints').iterdir())
  resumed = main_runs.launch_together(CHAIN, two, processes=PROCESSES, cache_dir=cache, timeout=TIMEOUT_S)
  return {'root': root, 'one': one, 'two': two, 'crashed': crashed, 'after_crash': after_crash, 'resumed': resumed}


def _rollout_records(root: pathlib.Path, processes: int) -> list[dict]:
  return [json.loads((root / f'rollout_{processes}' / f'process_{i}.json').read_text()) for i in range(processes)]


def test_uneven_tool_turns_over_processes_sample_the_one_process_tokens(runs):
  (alone,), both = _rollout_records(runs['root'], 1), _rollout_records(runs['root'], PROCESSES)
  half = len(alone['rows']) // 2
  turns = [len(row['tool_results']) for row in alone['rows']]
  assert sum(turns[:half]) == 0 and min(turns[half:]) >= 2, turns   # the uneven work happened
  assert alone['called'] == list(range(2 * half))
  assert [record['called'] for record in both] == [list(range(half)), list(range(half, 2 * half))]  # owners only
  for record in both:   # row 5 failed on process 1: both raise instead of waiting on each other
    assert record['error'].startswith('item 5 failed on process 1: ZeroDivisionError'), record['error']
  for record in both:   # every process ends with every row
    for a, b in zip(record['rows'], alone['rows']):
      assert (a['tokens'], a['tool_results'], a['stop_reason']) == (b['tokens'], b['tool_results'], b['stop_reason'])
      np.testing.assert_allclose(a['logprobs'], b['logprobs'], atol=1e-5)


def _figures(workdir: pathlib.Path) -> list[dict]:
  return [{k: v for k, v in row.items() if not k.startswith(('perf/', 'judge/'))} for row in metrics.read(workdir)]


def test_two_processes_run_the_rl_chain_to_the_one_process_figures(runs):
  for code, log in runs['resumed']:
    assert code == 0, log[-3000:]
  one, two = runs['one'], runs['two']
  # Sampled tokens: prompt selection's pass rates, the rejection-sampling stats and the DPO pairs' sampled replies.
  assert (json.loads((two / 'rlvr' / 'prompt_selection.json').read_text())['pass_rates'] ==
          json.loads((one / 'rlvr' / 'prompt_selection.json').read_text())['pass_rates'])
  stats = lambda run: json.loads((run / 'rejection_sampling' / 'rs_stats.json').read_text())['groups']
  assert stats(two) == stats(one)
  for name in ('rejection_sampling/rs_traces.jsonl', 'dpo/dpo_pairs.jsonl'):
    assert (two / name).read_text() == (one / name).read_text(), name
  assert len((one / 'dpo' / 'dpo_pairs.jsonl').read_text().splitlines()) >= 2
  # Losses, rewards and eval figures.
  for stage in ('rlvr', 'dpo', 'eval'):
    rows_one, rows_two = _figures(one / stage), _figures(two / stage)
    assert [row['step'] for row in rows_two] == [row['step'] for row in rows_one], stage
    for a, b in zip(rows_one, rows_two):
      assert a.keys() == b.keys(), stage
      np.testing.assert_allclose([b[k] for k in sorted(b)], [a[k] for k in sorted(a)], rtol=1e-5, atol=1e-6,
                                 err_msg=stage)
  losses = [row['train/loss'] for row in _figures(one / 'rlvr') if 'train/loss' in row]
  assert any(abs(loss) > 1e-4 for loss in losses), losses   # the figures can tell runs apart
  for a, b in zip(*(checkpoint.load_params(run / 'rlvr')[1]['layers']['layer_0']['mlp']['up_proj']['kernel']
                    for run in (one, two))):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def test_both_processes_killed_after_a_checkpoint_resume_there(runs):
  for code, log in runs['crashed']:   # each kills itself after step 1; jax.distributed aborts one whose peer died first
    assert code in (-signal.SIGKILL, -signal.SIGABRT), log[-3000:]
  assert runs['after_crash'] == ['1']
  for code, log in runs['resumed']:
    assert code == 0 and 'resumed from' in log and 'at step 1' in log, log[-3000:]
    assert "pipeline stage 'rejection_sampling': reusing" in log
