"""Run logs: `metrics.jsonl`, TensorBoard events and one summary figure in the workdir (docs/training.md), and the
summary a run prints at its end (`summarize`: headline figures before → after, and where the outputs are).

Only process 0 writes. On resume from step s, lines of `metrics.jsonl` with a step beyond s are
dropped (the resumed run logs those steps again, with the same values), and TensorBoard events
from step s + 1 on are purged (tensorboardX `purge_step`), so every step appears once. A run that
starts from scratch (no checkpoint) drops every earlier line. On resume a last line cut short by a
crash is dropped with a warning; any other malformed line is an error naming file:line.
"""

import contextlib
import json
import math
import pathlib
import time
from typing import Any, Mapping, Sequence

from absl import logging
import jax
import numpy as np

from luckystar import errors
from luckystar import files
from luckystar.engine import artifacts

METRICS_FILE = 'metrics.jsonl'
PLOTS_DIR = 'plots'


def _is_writer() -> bool:
  return jax.process_index() == 0


def _rows(path: pathlib.Path, *, drop_torn_last: bool = False) -> list[tuple[str, dict[str, Any]]]:
  """(line, row) of each non-blank line of a metrics file. A line that is not a JSON object with an integer
  `step` is a UserError naming file:line; with `drop_torn_last`, a last such line (a write cut short by a
  crash or a full disk) is dropped with a warning instead."""
  lines = list(files.json_lines(files.read_text(path, what='metrics file')))
  rows = []
  for number, line in lines:
    try:
      row = json.loads(line)   # not files.loads: Writer writes NaN for an undefined metric
      if not isinstance(row, dict) or not isinstance(row.get('step'), int):
        raise ValueError('not a JSON object with an integer "step"')
    except ValueError as e:  # json.JSONDecodeError is one
      if drop_torn_last and number == lines[-1][0]:
        logging.warning('%s:%d: dropping the cut-short last row (%s): %.60r', path, number, e, line)
        break
      raise errors.UserError(f'{path}:{number}: not a metrics row ({e}); repair or delete that line, or '
                             f'delete {path} to drop the run\'s logged rows') from None
    rows.append((line, row))
  return rows


def read(workdir: str | pathlib.Path) -> list[dict[str, Any]]:
  """The rows of `workdir/metrics.jsonl` (empty if there is none); a malformed line is a UserError naming
  file:line."""
  path = pathlib.Path(workdir) / METRICS_FILE
  if not path.exists():
    return []
  return [row for _, row in _rows(path)]


def _truncate_after(path: pathlib.Path, step: int) -> None:
  """Keeps the rows up to `step` (none for a negative step), rewritten through a temporary file so a crash
  here leaves the old file whole. A cut-short last row is dropped: a row is written before its step's
  checkpoint is saved, so the row a crash cut short belongs to a step after every checkpoint."""
  if path.exists():
    kept = [line for line, row in _rows(path, drop_torn_last=True) if row['step'] <= step] if step >= 0 else []
    artifacts.write_atomically(path, ''.join(line + '\n' for line in kept))


def _scalar(value: Any) -> float | int:
  value = np.asarray(value).item()
  return value if isinstance(value, int) else float(value)


class _Events:
  """A TensorBoard event file written on the caller's thread, flushed after each row. tensorboardX's
  SummaryWriter writes from a thread of its own: a full disk kills that thread with a traceback, and each later
  row then blocks on its full queue. Events from `purge_step` on in earlier files are hidden, as
  SummaryWriter(purge_step=...) hides them."""

  def __init__(self, workdir: pathlib.Path, purge_step: int):
    # here: tensorboardX imports torch when installed (~2 s)
    from tensorboardX import event_file_writer, summary  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    self._event, self._scalar = event_pb2.Event, summary.scalar
    with artifacts.writing():   # names the file it could not create
      self._file = event_file_writer.EventsWriter(str(workdir / 'events'))
    self.path = pathlib.Path(self._file._file_name)  # pylint: disable=protected-access
    with artifacts.writing(self.path):
      self._file.write_event(self._event(step=purge_step, file_version='brain.Event:2'))
      self._file.write_event(self._event(step=purge_step, session_log=event_pb2.SessionLog(
          status=event_pb2.SessionLog.START)))
      self._file.flush()

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    with artifacts.writing(self.path):
      for name, value in scalars.items():
        self._file.write_event(self._event(summary=self._scalar(name, value), step=step, wall_time=time.time()))
      self._file.flush()

  def close(self) -> None:
    with artifacts.writing(self.path):
      self._file.close()


class Writer:
  """Appends one row per logged step to metrics.jsonl and TensorBoard (`plot()` draws the summary figure). A
  write the disk refuses is an artifacts.WriteFailed naming the file."""

  def __init__(self, workdir: str | pathlib.Path, *, resumed_step: int | None = None):
    self.workdir = pathlib.Path(workdir)
    self._events = None
    if _is_writer():
      last_kept = -1 if resumed_step is None else resumed_step
      _truncate_after(self.workdir / METRICS_FILE, last_kept)
      self._events = _Events(self.workdir, purge_step=last_kept + 1)

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    if not _is_writer() or not metrics:
      return
    row = {'step': int(step), **{k: _scalar(v) for k, v in sorted(metrics.items())}}
    path = self.workdir / METRICS_FILE
    with artifacts.writing(path), path.open('a') as f:
      f.write(json.dumps(row, allow_nan=True) + '\n')
    # NaN = undefined (e.g. no Korean prompt in the batch): not drawn
    self._events.write(row['step'], {k: v for k, v in row.items() if k != 'step' and math.isfinite(v)})

  def close(self) -> None:
    if self._events is not None:
      events, self._events = self._events, None
      events.close()


def pyplot():
  """matplotlib's pyplot on the file-only Agg backend (no display on a CPU box or a pod host), imported
  on first use so runs that never plot never load matplotlib."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def save_figure(fig, path: pathlib.Path) -> pathlib.Path:
  """Lays out, writes (creating the folder) and closes one figure; through a temporary file, so that a refused
  write (an artifacts.WriteFailed naming `path`) keeps the figure there before."""
  tmp = path.with_name(f'{path.name}.tmp')
  try:
    with artifacts.writing(path):
      path.parent.mkdir(parents=True, exist_ok=True)
      fig.tight_layout()
      fig.savefig(tmp, format=path.suffix.lstrip('.') or 'png')
      tmp.replace(path)
  except BaseException:
    with contextlib.suppress(OSError):
      tmp.unlink(missing_ok=True)
    raise
  finally:
    pyplot().close(fig)
  return path


# A metric name with one of these parts is a share, shown in % by the printed summary.
SHARES = frozenset({'correctness', 'accuracy', 'accuracies', 'language_mismatch', 'pass_rate', 'format_ok',
                    'hybrid_format', 'thinking_rate', 'overlong_fraction', 'zero_variance_groups'})
SUMMARY_FIGURE = 'summary.png'
DEFAULT_PLOT_KEYS = ('train/loss', 'eval/loss')


def _panels(keys: Sequence[str]) -> dict[str, list[str]]:
  """`keys` grouped by name without its train/ or eval/ prefix, in order: a train curve and its eval points
  share one subplot."""
  panels: dict[str, list[str]] = {}
  for key in dict.fromkeys(keys):
    panels.setdefault(key.removeprefix('train/').removeprefix('eval/'), []).append(key)
  return panels


def figure(rows: Sequence[Mapping[str, Any]], keys: Sequence[str] = DEFAULT_PLOT_KEYS):
  """A grid of subplots of `keys` over the steps of `rows` (`_panels`; train/ keys as lines, eval/ keys as
  markers), integer step ticks; None when no key has a finite value."""
  plt = pyplot()
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top  # with pyplot: only runs that plot load it
  series = {key: [(row['step'], row[key]) for row in rows
                  if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])] for key in dict.fromkeys(keys)}
  panels = {name: [k for k in members if series[k]] for name, members in _panels(keys).items()}
  panels = {name: members for name, members in panels.items() if members}
  if not panels:
    return None
  columns = min(3, len(panels))
  rows_count = -(-len(panels) // columns)
  fig, axes = plt.subplots(rows_count, columns, figsize=(4 * columns, 3 * rows_count), dpi=100, squeeze=False)
  for ax in axes.flat[len(panels):]:
    ax.remove()
  for ax, (name, members) in zip(axes.flat, panels.items()):
    for key in members:
      steps, values = zip(*series[key])
      if key.startswith('eval/'):  # a few evaluations (step 0, every eval_every, the end): points, not a curve
        ax.plot(steps, values, marker='o', linestyle='--', label=key)
      else:
        ax.plot(steps, values, marker='.' if len(steps) < 50 else None, label=key)
    ax.set(title=name, xlabel='step')
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if len(members) > 1:
      ax.legend(fontsize='small')
  return fig


def plot(workdir: str | pathlib.Path, keys: Sequence[str] = DEFAULT_PLOT_KEYS) -> list[pathlib.Path]:
  """`workdir/plots/summary.png`, the run's headline curves (`figure` of `keys`; every metric's own curve is
  in TensorBoard); [] off process 0 or when no key was logged."""
  if not _is_writer():
    return []
  fig = figure(read(workdir), keys)
  return [] if fig is None else [save_figure(fig, pathlib.Path(workdir) / PLOTS_DIR / SUMMARY_FIGURE)]


# ---- the printed summary --------------------------------------------------------------------------


def percent(value: Any) -> str:
  """A share as people read it: '12.5%' ('n/a' for none)."""
  return 'n/a' if value is None or (isinstance(value, float) and math.isnan(value)) else f'{100 * value:.1f}%'


def format_value(name: str, value: Any) -> str:
  """A logged figure for people: shares (`SHARES`) in %, counts as they are, others to 4 significant digits."""
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return 'n/a'
  if SHARES & set(name.split('/')):
    return percent(value)
  return str(value) if isinstance(value, int) else f'{value:.4g}'


def before_after(rows: Sequence[Mapping[str, Any]], keys: Sequence[str],
                 labels: tuple[str, str] | None = None) -> list[tuple[str, str]]:
  """(key, 'first → last  (step s → t)') for each of `keys` in `rows`, from the first and last rows that
  hold it (`labels` name the two instead of their steps); a key logged once: its value. Absent keys are left out."""
  lines = []
  for key in keys:
    found = [(row['step'], row[key]) for row in rows if key in row]
    if not found:
      continue
    (first_step, first), (last_step, last) = found[0], found[-1]
    if len(found) == 1:
      lines.append((key, format_value(key, last)))
      continue
    which = ' → '.join(labels) if labels else f'step {first_step} → {last_step}'
    lines.append((key, f'{format_value(key, first)} → {format_value(key, last)}  ({which})'))
  return lines


def format_summary(title: str, figures: Sequence[tuple[str, str]], outputs: Sequence[tuple[str, Any]]) -> str:
  """The title, then one aligned 'name  text' line per figure and per output."""
  width = max((len(name) for name, _ in [*figures, *outputs]), default=0)
  return '\n'.join([title, *(f'  {name:<{width}}  {text}' for name, text in [*figures, *outputs])])


def print_summary(title: str, figures: Sequence[tuple[str, str]], outputs: Sequence[tuple[str, Any]]) -> str:
  """Prints `format_summary` to stdout on process 0 (others print nothing) and returns it."""
  if not _is_writer():
    return ''
  text = format_summary(title, figures, outputs)
  print(text, flush=True)
  return text


def summarize(workdir: str | pathlib.Path, keys: Sequence[str], *, title: str,
              outputs: Sequence[tuple[str, Any]] = (), labels: tuple[str, str] | None = None) -> str:
  """Prints (process 0) and returns a run's summary: `keys` first → last from metrics.jsonl (`before_after`),
  then where its outputs are: the workdir, metrics.jsonl, `outputs` ((label, path) pairs) and the summary
  figure when there is one."""
  if not _is_writer():
    return ''
  workdir = pathlib.Path(workdir)
  where = [('workdir', workdir.absolute()), ('metrics', workdir.absolute() / METRICS_FILE), *outputs]
  if (figure_path := workdir.absolute() / PLOTS_DIR / SUMMARY_FIGURE).exists():
    where.append(('figure', figure_path))
  return print_summary(title, before_after(read(workdir), keys, labels), where)
