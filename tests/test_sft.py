"""Hybrid SFT: the loss on a hand-made packed batch, and the command line end to end —
a run killed with SIGKILL and re-run ends bitwise equal to an uninterrupted one."""

import importlib.util

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import main_runs
from luckystar import errors
from luckystar import model
from luckystar.engine import logprobs
from luckystar.engine import metrics
from luckystar.stages import sft

# Small enough to compile in a few seconds; 4 heads / 2 KV heads so tensor=2 shards it.
MICRO = model.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                          num_kv_heads=2, layer_types=model.pattern_layer_types(2, 2), sliding_window=4)


def host_params(config, seed):
  """Random params made on the host (compiling the model's random init takes seconds on a CPU)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda leaf: (0.3 * rng.standard_normal(leaf.shape)).astype(leaf.dtype),
                      nn.unbox(model.abstract_params(config)))


def _row(*documents, length):
  """documents: (tokens, loss_mask) pairs packed into one row of `length`, padding after them."""
  tokens, mask, segments, positions = (np.zeros(length, np.int32) for _ in range(4))
  start = 0
  for segment, (doc_tokens, doc_mask) in enumerate(documents, start=1):
    end = start + len(doc_tokens)
    tokens[start:end], mask[start:end], segments[start:end] = doc_tokens, doc_mask, segment
    positions[start:end] = np.arange(len(doc_tokens))
    start = end
  return {'tokens': tokens, 'loss_mask': mask, 'segment_ids': segments, 'positions': positions}


def _stack(*rows):
  return {k: jnp.asarray(np.stack([row[k] for row in rows])) for k in rows[0]}


DOC_A = ([5, 6, 7, 8, 9], [0, 0, 1, 1, 1])
DOC_B = ([10, 11, 12, 13], [0, 1, 1, 1])   # its first token is trained on … but never as a target of doc A


@pytest.mark.fast
def test_targets_are_shifted_masked_and_stay_in_their_document():
  batch = _stack(_row(DOC_A, DOC_B, length=12))
  targets, weights = logprobs.next_token_targets(batch)
  # Position t predicts token t+1: weights at t where token t+1 has loss_mask 1 in the same document.
  # Doc A occupies 0..4 and predicts 7, 8, 9 from positions 1, 2, 3; position 4 (→ doc B's first token)
  # crosses a boundary; doc B (5..8) predicts 11, 12, 13 from 5, 6, 7; padding never counts.
  np.testing.assert_array_equal(np.flatnonzero(weights[0]), [1, 2, 3, 5, 6, 7])
  np.testing.assert_array_equal(targets[0, [1, 2, 3, 5, 6, 7]], [7, 8, 9, 11, 12, 13])


@pytest.fixture(scope='module')
def micro_loss():
  """(params, jitted aux of loss_fn) for the micro model; every batch here is [2, 12], one compile."""
  params = host_params(MICRO, 0)
  return params, jax.jit(lambda batch: logprobs.token_cross_entropy(params, batch, None, model_config=MICRO))


@pytest.mark.fast
def test_loss_is_token_mean_cross_entropy_over_trained_tokens_only(micro_loss):
  params, loss = micro_loss
  batch = _stack(_row(DOC_A, DOC_B, length=12), _row(DOC_B, length=12))
  value, aux = loss(batch)
  logits = np.asarray(jax.jit(model.apply, static_argnums=0)(MICRO, params, batch['tokens'], batch['positions'],
                                                             batch['segment_ids']))
  log_probs = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
  scored = [(0, 1, 7), (0, 2, 8), (0, 3, 9), (0, 5, 11), (0, 6, 12), (0, 7, 13), (1, 0, 11), (1, 1, 12), (1, 2, 13)]
  want = -np.mean([log_probs[b, t, target] for b, t, target in scored])
  assert float(aux['tokens']) == len(scored)
  np.testing.assert_allclose(float(value), want, rtol=1e-6)
  assert 0.0 <= float(aux['accuracy']) <= 1.0


@pytest.mark.fast
def test_packed_loss_equals_documents_alone(micro_loss):
  """Packing changes nothing: no attention, position or target crosses a document boundary."""
  _, loss = micro_loss
  _, packed = loss(_stack(_row(DOC_A, DOC_B, length=12), _row(length=12)))
  _, alone = loss(_stack(_row(DOC_A, length=12), _row(DOC_B, length=12)))
  assert float(packed['tokens']) == float(alone['tokens']) == 6
  np.testing.assert_allclose(float(packed['loss']), float(alone['loss']), rtol=1e-5)


@pytest.mark.fast
def test_score_columns_give_the_same_loss_and_gradient():
  """`with_score_columns` projects onto the vocabulary only at trained columns; loss, accuracy, count
  and gradient are those of the full projection (padding columns -1 never count)."""
  params = host_params(MICRO, 0)
  batch = _random_batch(4, 16, seed=5)
  scored = logprobs.with_score_columns(batch, multiple=4)
  assert scored['score_columns'].shape[1] % 4 == 0 and (scored['score_columns'] == -1).any()
  grad = jax.jit(jax.value_and_grad(lambda p, b: logprobs.token_cross_entropy(p, b, None, model_config=MICRO), has_aux=True))
  (full, full_aux), full_grads = grad(params, batch)
  (fast, fast_aux), fast_grads = grad(params, scored)
  np.testing.assert_allclose(float(fast), float(full), rtol=1e-6)
  assert float(fast_aux['tokens']) == float(full_aux['tokens'])
  np.testing.assert_allclose(float(fast_aux['accuracy']), float(full_aux['accuracy']), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(fast_grads), jax.tree.leaves(full_grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def _random_batch(rows, length, seed):
  """Rows of two random documents each, with random loss masks."""
  rng = np.random.default_rng(seed)
  def document(size):
    return rng.integers(1, MICRO.vocab_size, size), rng.integers(0, 2, size)
  return {k: np.asarray(v) for k, v in _stack(*(_row(document(length // 2), document(length // 2 - 2), length=length)
                                                 for _ in range(rows))).items()}


# ---- the command line, end to end -----------------------------------------------------------------


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """An uninterrupted smoke run, and one killed after step 3 (checkpoint at 2) then re-run (about a minute: its
  tests are in the full suite, not the fast tier)."""
  return main_runs.whole_and_resumed('configs/sft.py:smoke', tmp_path_factory.mktemp('sft'), crash_after=3)


def test_killed_and_resumed_run_is_bitwise_equal_to_uninterrupted(runs):
  assert runs['after_crash'] == {'checkpoints': ['2'], 'steps': [0, 1, 2, 3]}
  assert 'resumed from' in runs['resume_log'] and 'at step 2' in runs['resume_log']
  whole, resumed = main_runs.params(runs['whole']), main_runs.params(runs['resumed'])
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(whole), jax.tree.leaves(resumed)):
    assert np.array_equal(np.asarray(a), np.asarray(b)), jax.tree_util.keystr(path)
  # Steps after the restored checkpoint were logged again, not twice; the logged values agree.
  assert main_runs.steps(runs['resumed']) == main_runs.steps(runs['whole']) == list(range(5))
  for a, b in zip(metrics.read(runs['whole']), metrics.read(runs['resumed'])):
    assert {k: v for k, v in a.items() if not k.startswith('perf/')} == \
        {k: v for k, v in b.items() if not k.startswith('perf/')}


def test_run_writes_metrics_tensorboard_and_plots(runs):
  whole = runs['whole']
  rows = metrics.read(whole)
  assert set(rows[0]) == {'step', 'eval/loss', 'eval/accuracy'}          # before/after evals
  assert {'train/loss', 'train/skipped_updates', 'train/learning_rate', 'eval/loss'} <= set(rows[-1])
  assert rows[-1]['train/skipped_updates'] == 0
  assert rows[-1]['eval/loss'] < rows[0]['eval/loss']
  assert list(whole.glob('events.out.tfevents.*'))   # every metric's curve; the figure has the headline ones
  assert [p.name for p in (whole / 'plots').iterdir()] == ['summary.png']
  assert (whole / 'plots' / 'summary.png').stat().st_size > 0
  assert (whole / 'config.json').exists()
  assert sorted(p.name for p in (whole / 'checkpoints').iterdir()) == ['2', '4']


def _smoke_config():
  spec = importlib.util.spec_from_file_location('sft_config', main_runs.ROOT / 'configs' / 'sft.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config('smoke')


def _summary(stdout):
  """The summary a run printed last: from its title line to the end."""
  lines = stdout.splitlines()
  return lines[max(i for i, line in enumerate(lines) if line.startswith('sft: step ')):]


def test_run_ends_with_its_summary(runs):
  whole = runs['whole'].absolute()
  rows = metrics.read(whole)
  loss = f'{rows[0]["eval/loss"]:.4g} → {rows[-1]["eval/loss"]:.4g}  (step 0 → 4)'
  accuracy = f'{100 * rows[0]["eval/accuracy"]:.1f}% → {100 * rows[-1]["eval/accuracy"]:.1f}%  (step 0 → 4)'
  assert _summary(runs['stdout']) == [
      'sft: step 4 of 4', f'  eval/loss      {loss}', f'  eval/accuracy  {accuracy}',
      f'  workdir        {whole}', f'  metrics        {whole}/metrics.jsonl', f'  checkpoints    {whole}/checkpoints',
      f'  curves         tensorboard --logdir={whole}', f'  figure         {whole}/plots/summary.png']


def test_finished_run_rerun_changes_nothing(runs, capsys):
  """Re-running a finished run (in-process here: it must not need a device) only redraws the figure and
  prints the same summary."""
  whole = runs['whole']
  before_params, before_metrics = main_runs.params(whole), (whole / 'metrics.jsonl').read_text()
  for png in (whole / 'plots').glob('*.png'):
    png.unlink()
  capsys.readouterr()
  sft.run(_smoke_config(), str(whole))
  assert _summary(capsys.readouterr().out) == _summary(runs['stdout'])
  assert (whole / 'metrics.jsonl').read_text() == before_metrics
  assert jax.tree.all(jax.tree.map(np.array_equal, before_params, main_runs.params(whole)))
  assert (whole / 'plots' / 'summary.png').exists()
  assert sorted(p.name for p in (whole / 'checkpoints').iterdir()) == ['2', '4']


@pytest.mark.fast
def test_a_seq_len_that_cuts_every_trained_token_of_a_source_is_named():
  """Packing cuts at seq_len: a source trained only past it would skip every step, so it is an error."""
  long_prompt = {'tokens': np.arange(100), 'loss_mask': np.r_[np.zeros(90), np.ones(10)]}
  sft.check_seq_len({'ok': [long_prompt], 'short': [(np.arange(8), np.r_[np.zeros(4), np.ones(4)])]}, 128)
  with pytest.raises(errors.UserError, match=r"config.sft.seq_len=64 cuts the 'ok' source's conversations "
                                                 r"\(up to 100 tokens\)"):
    sft.check_seq_len({'ok': [long_prompt]}, 64)
