"""The training loop every stage reuses: resume → step to `total_steps` → log, eval, checkpoint.

Config keys: `total_steps`, `log_every`, `eval_every`, `checkpoint_every`, `keep_checkpoints`.

Resume: the latest complete checkpoint under `workdir/checkpoints/` restores the TrainState
(params, optimizer state, step, RNG key) and moves the grain iterator to where it was, so the
steps that follow are those of an uninterrupted run, bit for bit. A finished run re-run only
redraws its summary figure and prints its summary again. Step t's key is `fold_in(state.rng, t)`,
independent of where a run resumed.

What a run shows: the progress bar carries train/loss and the stage's `progress_keys`; at the end
`plots/summary.png` draws train/loss, `progress_keys` and `summary_keys`, and stdout gets the summary
(`summarize`: `summary_keys` before → after, and where the outputs are).

Fault injection for tests: with the environment variable LUCKYSTAR_CRASH_AFTER_STEP=k the process
SIGKILLs itself after step k, once earlier checkpoints are on disk (a crash, not a clean exit).
"""

import logging as logging_std
import os
import pathlib
import signal
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

from absl import logging
import jax
import tqdm

from luckystar import model
from luckystar.engine import artifacts
from luckystar.engine import checkpoint
from luckystar.engine import metrics as metrics_lib
from luckystar.engine import state as state_lib
from luckystar.engine import streams
from luckystar.engine.state import TrainState
from luckystar.engine.step import MeshFunction

EvalFn = Callable[[Any, int], dict[str, Any]]
PrepareFn = Callable[[TrainState, Any, jax.Array], tuple[dict[str, Any], dict[str, Any]]]
CRASH_AFTER_STEP_ENV = 'LUCKYSTAR_CRASH_AFTER_STEP'


class _HideOrbaxInfo(logging_std.Filter):
  """orbax logs dozens of INFO lines per checkpoint; keep its warnings and errors only, but for the traceback it
  logs of a write the disk refused, which the run reports itself in one line (`checkpoint.wait_until_saved`)."""

  def filter(self, record: logging_std.LogRecord) -> bool:
    if '/orbax/' not in record.pathname:
      return True
    refused = record.exc_info is not None and artifacts.write_failure(record.exc_info[1]) is not None
    return record.levelno >= logging_std.WARNING and not refused


logging.get_absl_handler().addFilter(_HideOrbaxInfo())


def _due(step: int, every: int, last: int) -> bool:
  return step == last or (every > 0 and step % every == 0)


def _log_memory(compiled) -> None:
  stats = compiled.memory_analysis()
  if stats is None:
    logging.info('update step memory analysis: not available on this backend')
    return
  mib = lambda n: f'{n / 2**20:.1f} MiB'
  logging.info('update step memory per device: arguments %s, outputs %s (aliased %s), temporaries %s, code %s',
               mib(stats.argument_size_in_bytes), mib(stats.output_size_in_bytes), mib(stats.alias_size_in_bytes),
               mib(stats.temp_size_in_bytes), mib(stats.generated_code_size_in_bytes))


def _evaluate(eval_fn: EvalFn | None, params: Any, step: int) -> dict[str, Any]:
  if eval_fn is None:
    return {}
  results = eval_fn(params, step)
  if bad := [k for k in results if not k.startswith('eval/')]:
    raise ValueError(f'eval_fn returned metrics {bad}; held-out metrics are named eval/<name> (docs/training.md)')
  return results


def is_finished(config, workdir: str | pathlib.Path) -> bool:
  """True when `workdir` holds a checkpoint at `config.total_steps` or later: a re-run has nothing to
  train, and a stage may return before loading its initial model and data."""
  step = checkpoint.latest_step(workdir)
  return step is not None and step >= config.total_steps


def plot_keys(progress_keys: Sequence[str], summary_keys: Sequence[str]) -> tuple[str, ...]:
  """What the summary figure draws: train/loss, then the stage's progress and summary keys."""
  return tuple(dict.fromkeys(('train/loss', *progress_keys, *summary_keys)))


def summarize(config, workdir: str | pathlib.Path, summary_keys: Sequence[str]) -> str:
  """Prints (process 0) and returns the run's summary: `summary_keys` before → after and where the outputs
  are (`metrics.summarize`), with the checkpoints and the TensorBoard command for every metric's curve."""
  workdir = pathlib.Path(workdir)
  return metrics_lib.summarize(
      workdir, summary_keys, title=f'{config.stage}: step {checkpoint.latest_step(workdir)} of {config.total_steps}',
      outputs=[('checkpoints', checkpoint.directory(workdir)),
               ('curves', f'tensorboard --logdir={workdir.absolute()}')])


def finish_without_training(config, workdir: str | pathlib.Path, *, progress_keys: Sequence[str] = (),
                            summary_keys: Sequence[str] = ('eval/loss',)) -> None:
  """What a re-run of a finished run does: says so, redraws the summary figure and prints the summary."""
  logging.info('%s: already at step %d of %d; nothing to train', workdir, checkpoint.latest_step(workdir),
               config.total_steps)
  metrics_lib.plot(workdir, plot_keys(progress_keys, summary_keys))
  summarize(config, workdir, summary_keys)


def progress_postfix(row: Mapping[str, Any], keys: Sequence[str]) -> dict[str, str]:
  """The progress bar's figures: train/loss and `keys` of a logged row, named without 'train/'; absent keys
  left out."""
  return {key.removeprefix('train/'): f'{float(row[key]):.4g}'
          for key in dict.fromkeys(('train/loss', *keys)) if key in row}


def run_training(config, workdir: str | pathlib.Path, *, state: TrainState, update_fn: MeshFunction,
                 batches: Iterator[Any], eval_fn: EvalFn | None = None,
                 model_config: model.ModelConfig | None = None, prepare: PrepareFn | None = None,
                 progress_keys: Sequence[str] = (), summary_keys: Sequence[str] = ('eval/loss',)) -> TrainState:
  """Trains `state` to `config.total_steps` with `update_fn` on `batches` (a checkpointable grain
  iterator of this process's rows); `eval_fn(params, step) -> {'eval/...': value}` runs at step 0,
  every `eval_every` steps and at the end. Checkpoints carry `model_config` when given, which makes
  them loadable as `config.init_from`. Returns the final state.

  `prepare(state, item, rng) -> (batch, metrics)` turns each item of `batches` into the update's
  batch with the current policy (RL: the items are prompts, the batch their scored rollouts); `rng`
  depends only on the seed and the step, so a resumed run draws the same rollouts. Its metrics are
  logged with the step's.

  `progress_keys` (row keys, e.g. 'train/reward') join train/loss on the progress bar and in the summary
  figure; `summary_keys` (e.g. 'eval/correctness') are printed before → after at the end, and drawn too."""
  workdir = pathlib.Path(workdir)
  if is_finished(config, workdir):
    finish_without_training(config, workdir, progress_keys=progress_keys, summary_keys=summary_keys)
    return state
  checkpoints = checkpoint.manager(workdir, keep=config.keep_checkpoints)
  writer = None
  try:
    restored = checkpoint.restore_latest(checkpoints, state, batches)
    if restored is not None:
      state = restored
      logging.info('resumed from %s at step %d', checkpoint.directory(workdir), int(state.step))
    start = int(state.step)
    writer = metrics_lib.Writer(workdir, resumed_step=start if restored is not None else None)
    state = _train(config, state, update_fn, batches, eval_fn, model_config, checkpoints, writer, start, prepare,
                   progress_keys)
    checkpoint.wait_until_saved(checkpoints)   # a refused write of the last save surfaces here
    writer.close()
    checkpoints.close()
    metrics_lib.plot(workdir, plot_keys(progress_keys, summary_keys))
  except BaseException as error:
    _close_after(error, writer, checkpoints)
    if (failure := artifacts.write_failure(error)) is not None:
      raise artifacts.WriteFailed(f'{failure}; then re-run the same command: {_resume_point(workdir)}') from None
    raise
  summarize(config, workdir, summary_keys)
  return state


def _close_after(error: BaseException, writer: metrics_lib.Writer | None, checkpoints) -> None:
  """After `error`: the save in flight finished and everything closed, so that no orbax thread outlives the
  interpreter (a full disk used to end in `sys.meta_path is None` at exit); their own errors are logged, not
  raised, as `error` is the one to report."""
  for name, close in (('metrics', writer.close if writer is not None else None),
                      ('checkpoint save', lambda: checkpoint.wait_until_saved(checkpoints)),
                      ('checkpoints', checkpoints.close)):
    try:
      if close is not None:
        close()
    except Exception as e:  # pylint: disable=broad-except  # the first error is reported; these are its echoes
      if artifacts.write_failure(e) is None or artifacts.write_failure(error) is None:
        logging.warning('after %s: closing %s failed too: %s', type(error).__name__, name, e)


def _resume_point(workdir: pathlib.Path) -> str:
  step = checkpoint.latest_step(workdir)
  if step is None:
    return 'no checkpoint was complete, so it starts over'
  return f'it resumes from step {step} ({checkpoint.directory(workdir) / str(step)})'


def _train(config, state, update_fn, batches, eval_fn, model_config, checkpoints, writer, start, prepare,
           progress_keys):
  total = config.total_steps
  replicated = jax.sharding.NamedSharding(update_fn.mesh, jax.sharding.PartitionSpec())
  step_rng = lambda s: jax.device_put(state_lib.step_rng(s), replicated)
  crash_after = int(os.environ.get(CRASH_AFTER_STEP_ENV, -1))

  def next_batch(state):
    item = next(batches)
    if prepare is None:
      return update_fn.put_batch(item), {}
    batch, metrics = prepare(state, item, jax.random.fold_in(state_lib.step_rng(state), streams.PREPARE))
    return update_fn.put_batch(batch), metrics

  executables = {}  # one compiled step per batch shape (RL batches come in a few length buckets)

  def compiled_for(batch):
    shapes = tuple(sorted((k, v.shape) for k, v in batch.items()))
    if shapes not in executables:
      executables[shapes] = update_fn.lower(state, batch, step_rng(state)).compile()
      if len(executables) == 1:
        _log_memory(executables[shapes])
    return executables[shapes]

  if start == 0:
    writer.write(0, _evaluate(eval_fn, state.params, 0))
  batch, prepared = next_batch(state)
  compiled_for(batch)

  # `with`: the bar is closed, its line ended, before an error is printed after it
  with tqdm.tqdm(initial=start, total=total, unit='step', dynamic_ncols=True,
                 disable=jax.process_index() != 0) as progress:
    last_log_time, last_log_step = time.perf_counter(), start
    for step in range(start + 1, total + 1):
      if step > start + 1:
        batch, prepared = next_batch(state)
      tokens_per_step = batch['tokens'].size if 'tokens' in batch else 0
      state, step_metrics = compiled_for(batch)(state, batch, step_rng(state))
      row = {}
      if _due(step, config.log_every, total):
        row = dict(jax.device_get(step_metrics)) | prepared
        now = time.perf_counter()
        steps_per_sec = (step - last_log_step) / (now - last_log_time)
        row |= {'perf/steps_per_sec': steps_per_sec, 'perf/update_tokens_per_sec': steps_per_sec * tokens_per_step}
        last_log_time, last_log_step = now, step
        progress.set_postfix(progress_postfix(row, progress_keys), refresh=False)
      if eval_fn is not None and _due(step, config.eval_every, total):
        row |= _evaluate(eval_fn, state.params, step)
      writer.write(step, row)
      if _due(step, config.checkpoint_every, total):
        checkpoint.save(checkpoints, state, batches, model_config)
      progress.update(1)
      if step == crash_after:
        checkpoints.wait_until_finished()
        os.kill(os.getpid(), signal.SIGKILL)
  return state
