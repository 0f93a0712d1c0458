"""Run logs: `metrics.jsonl`, TensorBoard events and PNG curves in the workdir (DESIGN §8).

Only process 0 writes. On resume from step s, lines of `metrics.jsonl` with a step beyond s are
dropped (the resumed run logs those steps again, with the same values), and TensorBoard events
from step s + 1 on are purged (tensorboardX `purge_step`), so every step appears once. A run that
starts from scratch (no checkpoint) drops every earlier line. On resume a last line cut short by a
crash is dropped with a warning; any other malformed line is an error naming file:line.
"""

import json
import math
import pathlib
from typing import Any, Mapping

from absl import logging
import jax
import numpy as np

from luckystar import errors
from luckystar.engine import artifacts

METRICS_FILE = 'metrics.jsonl'
PLOTS_DIR = 'plots'


def _is_writer() -> bool:
  return jax.process_index() == 0


def _rows(path: pathlib.Path, *, drop_torn_last: bool = False) -> list[tuple[str, dict[str, Any]]]:
  """(line, row) of each non-blank line of a metrics file. A line that is not a JSON object with an integer
  `step` is a UserError naming file:line; with `drop_torn_last`, a last such line (a write cut short by a
  crash or a full disk) is dropped with a warning instead."""
  lines = [(number, line) for number, line in enumerate(path.read_text().split('\n'), 1) if line.strip()]
  rows = []
  for number, line in lines:
    try:
      row = json.loads(line)
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


class Writer:
  """Appends one row per logged step to metrics.jsonl and TensorBoard; `plot()` draws PNGs."""

  def __init__(self, workdir: str | pathlib.Path, *, resumed_step: int | None = None):
    self.workdir = pathlib.Path(workdir)
    self._tensorboard = None
    if _is_writer():
      import tensorboardX  # pylint: disable=g-import-not-at-top  # here: it imports torch when installed (~2 s)
      last_kept = -1 if resumed_step is None else resumed_step
      _truncate_after(self.workdir / METRICS_FILE, last_kept)
      self._tensorboard = tensorboardX.SummaryWriter(str(self.workdir), purge_step=last_kept + 1, flush_secs=10)

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    if not _is_writer() or not metrics:
      return
    row = {'step': int(step), **{k: _scalar(v) for k, v in sorted(metrics.items())}}
    with (self.workdir / METRICS_FILE).open('a') as f:
      f.write(json.dumps(row, allow_nan=True) + '\n')
    for name, value in row.items():
      if name != 'step' and math.isfinite(value):  # NaN = undefined (e.g. no Korean prompt in the batch)
        self._tensorboard.add_scalar(name, value, global_step=row['step'])

  def close(self) -> None:
    if self._tensorboard is not None:
      self._tensorboard.close()


def pyplot():
  """matplotlib's pyplot on the file-only Agg backend (no display on a CPU box or a pod host), imported
  on first use so runs that never plot never load matplotlib."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def save_figure(fig, path: pathlib.Path) -> pathlib.Path:
  """Lays out, writes (creating the folder) and closes one figure."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  fig.savefig(path)
  pyplot().close(fig)
  return path


def plot(workdir: str | pathlib.Path) -> list[pathlib.Path]:
  """One PNG per metric of metrics.jsonl, `workdir/plots/<name with / as _>.png`."""
  if not _is_writer():
    return []
  plt = pyplot()

  series: dict[str, list[tuple[int, float]]] = {}
  for row in read(workdir):
    for name, value in row.items():
      if name != 'step' and isinstance(value, (int, float)) and math.isfinite(value):
        series.setdefault(name, []).append((row['step'], value))
  written = []
  for name, points in sorted(series.items()):
    steps, values = zip(*points)
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
    ax.plot(steps, values, marker='.' if len(points) < 50 else None)
    ax.set(title=name, xlabel='step')
    ax.grid(alpha=0.3)
    written.append(save_figure(fig, pathlib.Path(workdir) / PLOTS_DIR / (name.replace('/', '_') + '.png')))
  return written
