"""The training core on a toy least-squares loss: gradient accumulation is exact, non-finite and all-zero
updates are skipped and counted, checkpoints restore exactly or fail naming the path, metrics files."""

import gc
import json
import re

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from luckystar import errors
from luckystar.engine import checkpoint
from luckystar.engine import metrics
from luckystar.engine import optim
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib
from luckystar.model import sharding

pytestmark = pytest.mark.fast

FEATURES = 4


def _config(**overrides):
  return ml_collections.ConfigDict(dict(learning_rate=0.1, warmup_steps=0, total_steps=10, weight_decay=0.0,
                                        b1=0.9, b2=0.95, max_grad_norm=10.0) | overrides)


def toy_loss(params, batch, rng):
  """Σ mask·(x·w − y)² / Σ mask; `tokens` is the denominator (rows with mask 1)."""
  del rng
  error = batch['x'] @ params['w'] - batch['y']
  tokens = batch['mask'].sum()
  loss = (batch['mask'] * error**2).sum() / jnp.maximum(tokens, 1.0)
  return loss, {'loss': loss, 'tokens': tokens}


def toy_batch(seed, rows=8):
  rng = np.random.default_rng(seed)
  mask = np.ones(rows, np.float32)
  mask[rows // 2 + 1:] = 0   # micro-batches get different denominators (rows i::2: 3 vs 2 ones)
  return {'x': rng.normal(size=(rows, FEATURES)).astype(np.float32),
          'y': rng.normal(size=rows).astype(np.float32), 'mask': mask}


def toy_state(optimizer, mesh, seed=0):
  params = {'w': jnp.asarray(np.random.default_rng(seed).normal(size=FEATURES), jnp.float32)}
  state = state_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                               rng=jax.random.key_data(jax.random.key(seed)), skipped_updates=jnp.zeros((), jnp.int32))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.device_put(state, replicated)


@pytest.fixture(scope='module')
def mesh():
  return sharding.make_mesh()   # data parallel over conftest's 8 CPU devices


def test_accumulated_gradient_is_the_global_batch_gradient():
  """sum / denominator over the whole batch, not a mean of micro-batch means."""
  params = {'w': jnp.arange(FEATURES, dtype=jnp.float32) / 4}
  batch = jax.tree.map(jnp.asarray, toy_batch(1))
  rng = jax.random.key(0)
  whole = jax.jit(lambda p, b: step_lib.accumulate_gradients(toy_loss, p, b, rng, grad_accum_steps=1,
                                                             denominator='tokens'))
  micro = jax.jit(lambda p, b: step_lib.accumulate_gradients(toy_loss, p, b, rng, grad_accum_steps=2,
                                                             denominator='tokens'))
  (grads_1, aux_1), (grads_2, aux_2) = whole(params, batch), micro(params, batch)
  np.testing.assert_allclose(grads_2['w'], grads_1['w'], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(aux_2['loss'], aux_1['loss'], rtol=1e-6)
  assert float(aux_2['tokens']) == float(aux_1['tokens']) == 5
  # The mean of the two micro-batch means (3 and 2 rows) is a different number: the test can fail.
  halves = [jax.tree.map(lambda x: x[i::2], batch) for i in range(2)]
  mean_of_means = np.mean([toy_loss(params, half, None)[0] for half in halves])
  assert abs(mean_of_means - float(aux_1['loss'])) > 1e-3


def test_non_finite_update_is_skipped_and_counted(mesh):
  optimizer = optim.make(_config())
  state = toy_state(optimizer, mesh)
  update = step_lib.make_update_fn(toy_loss, optimizer, step_lib.state_shardings_of(state), mesh=mesh,
                                   grad_accum_steps=2)
  rng = jax.random.key(0)
  poisoned = toy_batch(2)
  poisoned['x'][3, 0] = np.nan
  before = jax.device_get(state)
  state, out = update(state, update.put_batch(poisoned), rng)
  after = jax.device_get(state)
  assert int(out['train/skipped_updates']) == 1 and int(after.step) == 1
  np.testing.assert_array_equal(after.params['w'], before.params['w'])
  jax.tree.map(np.testing.assert_array_equal, after.opt_state, before.opt_state)
  state, out = update(state, update.put_batch(toy_batch(3)), rng)
  assert int(out['train/skipped_updates']) == 1 and np.isfinite(float(out['train/loss']))
  assert not np.array_equal(jax.device_get(state.params['w']), before.params['w'])


def test_an_all_zero_gradient_moves_nothing_and_is_counted(mesh):
  """An RLOO batch without signal: after a real step Adam's momentum alone would move the weights."""
  optimizer = optim.make(_config())
  state = toy_state(optimizer, mesh)
  update = step_lib.make_update_fn(toy_loss, optimizer, step_lib.state_shardings_of(state), mesh=mesh,
                                   grad_accum_steps=2)
  rng = jax.random.key(0)
  state, out = update(state, update.put_batch(toy_batch(1)), rng)
  assert int(out['train/skipped_updates']) == 0 and float(out['train/grad_norm']) > 0
  before = jax.device_get(state)
  silent = toy_batch(2)
  silent['mask'][:] = 0
  state, out = update(state, update.put_batch(silent), rng)
  after = jax.device_get(state)
  assert float(out['train/grad_norm']) == 0 and int(out['train/skipped_updates']) == 1 and int(after.step) == 2
  np.testing.assert_array_equal(after.params['w'], before.params['w'])
  jax.tree.map(np.testing.assert_array_equal, after.opt_state, before.opt_state)
  zeros = jax.tree.map(jnp.zeros_like, before.params)
  momentum_step, _ = optimizer.update(zeros, before.opt_state, before.params)   # what applying it would do
  assert np.abs(momentum_step['w']).max() > 1e-3


def test_learning_rate_warms_up_then_decays_to_zero():
  schedule = optim.learning_rate_schedule(_config(total_steps=10, warmup_steps=2))
  values = [float(schedule(i)) for i in range(11)]
  assert values[0] == 0.0 and values[2] == pytest.approx(0.1) and values[10] == pytest.approx(0.0, abs=1e-9)
  assert all(a >= b for a, b in zip(values[2:], values[3:]))


def test_weight_decay_skips_layer_norms():
  mask = optim.decay_mask({'layers': {'input_layernorm': {'weight': 0}, 'mlp': {'kernel': 0}}, 'norm': {'weight': 0}})
  assert mask == {'layers': {'input_layernorm': {'weight': False}, 'mlp': {'kernel': True}}, 'norm': {'weight': False}}


def _iterator():
  return iter(grain.MapDataset.range(100).to_iter_dataset().batch(2))


def _save(tmp_path, state, batches):
  with checkpoint.manager(tmp_path, keep=2) as manager:
    checkpoint.save(manager, state, batches)


def _restore(tmp_path, state, batches):
  with checkpoint.manager(tmp_path, keep=2) as manager:
    return checkpoint.restore_latest(manager, state, batches)


def test_checkpoint_restores_state_and_data_position(tmp_path, mesh):
  optimizer = optim.make(_config())
  state = toy_state(optimizer, mesh).replace(step=jnp.int32(3))
  batches = _iterator()
  next(batches)
  _save(tmp_path, state, batches)
  want_next = next(batches)

  fresh, fresh_batches = toy_state(optimizer, mesh, seed=1), _iterator()
  restored = _restore(tmp_path, fresh, fresh_batches)
  assert checkpoint.latest_step(tmp_path) == 3
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(state))
  np.testing.assert_array_equal(next(fresh_batches), want_next)
  assert restored.params['w'].sharding == fresh.params['w'].sharding
  assert _restore(tmp_path / 'elsewhere', fresh, _iterator()) is None


def test_incompatible_or_corrupt_checkpoint_names_its_path(tmp_path, mesh):
  optimizer = optim.make(_config())
  _save(tmp_path, toy_state(optimizer, mesh), _iterator())
  step_dir = tmp_path / 'checkpoints' / '0'
  assert (step_dir / 'checksums.process_0.json').is_file()

  wider = {'w': jnp.zeros(FEATURES + 1)}
  other = toy_state(optimizer, mesh).replace(params=wider, opt_state=optimizer.init(wider))
  with pytest.raises(checkpoint.CheckpointError, match=f'{step_dir}.*does not fit'):
    _restore(tmp_path, other, _iterator())

  for data_file in (step_dir / 'state').rglob('*'):
    if data_file.is_file() and data_file.name != '_METADATA':
      data_file.write_bytes(b'garbage')
  with pytest.raises(checkpoint.CheckpointError, match=f'^{re.escape(str(step_dir))}/state/.*size differs.*step 0 is corrupt'):
    _restore(tmp_path, toy_state(optimizer, mesh), _iterator())
  # A checkpoint saved before checksums existed: orbax's own failure, in one line naming the step.
  (step_dir / 'checksums.process_0.json').unlink()
  with pytest.raises(checkpoint.CheckpointError, match=f'^{re.escape(str(step_dir))}: orbax cannot read this checkpoint') as error:
    _restore(tmp_path, toy_state(optimizer, mesh), _iterator())
  assert '\n' not in str(error.value) and len(str(error.value)) < 600
  gc.collect()   # callbacks of the failed restore into its closed asyncio loop run here, if any, and are dropped


def test_metrics_resume_drops_rows_after_the_restored_step_and_plots(tmp_path):
  writer = metrics.Writer(tmp_path)
  for step in range(5):
    writer.write(step, {'train/loss': 1.0 / (step + 1), 'eval/loss': np.float32(2.0)})
  writer.close()
  writer = metrics.Writer(tmp_path, resumed_step=2)   # a run restored from its step-2 checkpoint
  writer.write(3, {'train/loss': 0.1})
  writer.close()
  rows = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert [row['step'] for row in rows] == [0, 1, 2, 3] and rows[-1] == {'step': 3, 'train/loss': 0.1}
  assert metrics.Writer(tmp_path).close() is None and metrics.read(tmp_path) == []   # a fresh start
  assert list(tmp_path.glob('events.out.tfevents.*'))
  (tmp_path / 'metrics.jsonl').write_text(json.dumps({'step': 0, 'train/loss': 1.0}) + '\n')
  assert [p.name for p in metrics.plot(tmp_path)] == ['summary.png']


def _run_rows():
  """A 3-step run's rows: train loss and reward every step, eval correctness at steps 0 and 3."""
  rows = [{'step': 0, 'eval/correctness': 0.5, 'eval/language_mismatch': float('nan')}]
  rows += [{'step': s, 'train/loss': 1.0 / s, 'train/reward': 0.1 * s, 'train/grad_norm': 2.0} for s in (1, 2, 3)]
  rows[-1] |= {'eval/correctness': 0.625, 'eval/language_mismatch': 0.0}
  return rows


def test_plot_draws_one_summary_figure_of_the_headline_keys_with_integer_steps(tmp_path):
  for row in _run_rows():
    with (tmp_path / 'metrics.jsonl').open('a') as f:
      f.write(json.dumps(row) + '\n')
  keys = ('train/loss', 'train/reward', 'train/correctness', 'eval/correctness', 'eval/missing')
  assert metrics.plot(tmp_path, keys) == [tmp_path / 'plots' / 'summary.png']
  assert [p.name for p in (tmp_path / 'plots').iterdir()] == ['summary.png']   # one figure, not one per metric
  fig = metrics.figure(metrics.read(tmp_path), keys)
  # One subplot per name: train/correctness (never logged) and eval/correctness share 'correctness'.
  assert [ax.get_title() for ax in fig.axes] == ['loss', 'reward', 'correctness']
  correctness = fig.axes[2].get_lines()
  assert [line.get_label() for line in correctness] == ['eval/correctness']
  assert list(correctness[0].get_xdata()) == [0, 3] and correctness[0].get_marker() == 'o'
  for ax in fig.axes:
    ticks = ax.get_xticks()
    assert len(ticks) and all(float(t).is_integer() for t in ticks), ticks   # 3 steps: no 0.5 ticks
  metrics.pyplot().close(fig)
  assert metrics.figure(metrics.read(tmp_path), ('train/missing',)) is None


def test_summary_prints_headline_keys_before_and_after_and_the_outputs(tmp_path, capsys):
  rows = _run_rows()
  assert metrics.before_after(rows, ('eval/correctness', 'eval/language_mismatch', 'train/loss', 'eval/x')) == [
      ('eval/correctness', '50.0% → 62.5%  (step 0 → 3)'), ('eval/language_mismatch', 'n/a → 0.0%  (step 0 → 3)'),
      ('train/loss', '1 → 0.3333  (step 1 → 3)')]
  assert metrics.before_after(rows[:2], ('eval/correctness',), labels=('float', 'int4')) == [
      ('eval/correctness', '50.0%')]
  assert metrics.before_after(rows, ('train/reward',), labels=('float', 'int4')) == [
      ('train/reward', '0.1 → 0.3  (float → int4)')]
  (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(row) + '\n' for row in rows))
  text = metrics.summarize(tmp_path, ('eval/correctness',), title='rlvr: step 3 of 3',
                           outputs=[('checkpoints', tmp_path / 'checkpoints')])
  assert capsys.readouterr().out == text + '\n'
  assert text.splitlines() == ['rlvr: step 3 of 3', '  eval/correctness  50.0% → 62.5%  (step 0 → 3)',
                               f'  workdir           {tmp_path}', f'  metrics           {tmp_path}/metrics.jsonl',
                               f'  checkpoints       {tmp_path}/checkpoints']


def test_progress_bar_shows_train_loss_and_the_stages_keys():
  from luckystar.engine import loop
  row = {'train/loss': 0.69314, 'train/reward': 0.25, 'train/grad_norm': 3.0, 'eval/correctness': 0.5}
  assert loop.progress_postfix(row, ('train/reward', 'train/correctness')) == {'loss': '0.6931', 'reward': '0.25'}
  assert loop.progress_postfix(row, ()) == {'loss': '0.6931'}
  assert loop.plot_keys(('train/reward',), ('eval/correctness', 'train/reward')) == (
      'train/loss', 'train/reward', 'eval/correctness')


def test_keep_checkpoints_below_one_is_a_config_error_before_any_checkpoint_is_touched(tmp_path):
  """keep=0 made orbax delete every checkpoint (a re-run started over from step 0); -1 failed deep in orbax."""
  for keep in (0, -1):
    with pytest.raises(errors.UserError, match=f'config.keep_checkpoints={keep} keeps no checkpoint'):
      checkpoint.manager(tmp_path, keep=keep)
  assert not (tmp_path / 'checkpoints').exists()


def _metrics_file(tmp_path, last_line):
  """metrics.jsonl with rows for steps 0-4 and then `last_line`, unterminated (a write cut short)."""
  rows = ''.join(json.dumps({'step': step, 'train/loss': 1.0}) + '\n' for step in range(5))
  (tmp_path / 'metrics.jsonl').write_text(rows + last_line)
  return tmp_path / 'metrics.jsonl'


def test_metrics_resume_drops_a_cut_short_last_row_and_names_other_bad_lines(tmp_path, caplog):
  path = _metrics_file(tmp_path, '{"step": 5, "train/lo')
  with pytest.raises(errors.UserError, match=f'^{path}:6: not a metrics row'):
    metrics.read(tmp_path)
  metrics.Writer(tmp_path, resumed_step=3).close()
  assert [row['step'] for row in metrics.read(tmp_path)] == [0, 1, 2, 3] and path.read_text().endswith('}\n')
  assert f'{path}:6: dropping the cut-short last row' in caplog.text

  path = _metrics_file(tmp_path, json.dumps({'step': 5}) + '\n')
  path.write_text(path.read_text().replace('{"step": 2,', '{"step": 2', 1))
  before = path.read_text()
  for call in (lambda: metrics.Writer(tmp_path, resumed_step=3), lambda: metrics.read(tmp_path)):
    with pytest.raises(errors.UserError, match=f'^{path}:3: not a metrics row'):
      call()
  assert path.read_text() == before


def test_metrics_resume_rewrite_is_atomic(tmp_path, monkeypatch):
  """A crash (here a full disk) while the kept rows are rewritten leaves the old file whole."""
  path = _metrics_file(tmp_path, '')
  before = path.read_text()

  def full_disk(self, data, *args, **kwargs):
    with open(self, 'w') as f:
      f.write(data[:10])
    raise OSError(28, 'No space left on device')
  monkeypatch.setattr(type(path), 'write_text', full_disk)
  with pytest.raises(OSError, match='No space left'):
    metrics.Writer(tmp_path, resumed_step=2)
  assert path.read_text() == before


def test_model_overrides_replace_model_config_fields_at_init():
  """config.model_overrides (e.g. a longer sliding window for the NL2SQL teacher) reaches random and loaded inits;
  a name that is not a ModelConfig field is a config error naming the key."""
  config, params, *_ = state_lib.initial_model('random:tiny', ml_collections.ConfigDict(dict(sliding_window=512)))
  assert config.sliding_window == 512 and params is None
  config, params, *_ = state_lib.initial_model('tiny-base', {'sliding_window': 512})
  assert config.sliding_window == 512 and config.hidden_size == 256 and params is not None
  assert state_lib.initial_model('tiny-base')[0].sliding_window == 64
  with pytest.raises(errors.UserError, match=r"config.model_overrides names \['window'\]"):
    state_lib.initial_model('random:tiny', {'window': 512})
