"""The `pipeline` stage: the paper in miniature, stage by stage, each in its own directory.

    python -m luckystar.main --config=configs/pipeline.py --workdir=runs/paper

`config.pipeline.order` names the stages to run, `config.pipeline.stages.<name>` holds each one's
whole config (as its `configs/<stage>.py` builds it). Stage `<name>` runs in workdir/<name>, in this
process; a string value '@<other>[/path]', or such a path in a sources item ('rs_traces:@<other>/file@0.1'), is
resolved to workdir/<other>[/path], and `config.seed`
replaces every stage's seed. A finished stage writes workdir/<name>/stage_done.json (its resolved
config and wall time) and is skipped on a re-run under the same config (another is an error); an unfinished one resumes from its own checkpoint.

Expect workdir/<name>/ per stage, each with its own outputs; the paper's findings report is built from them
by `python experiments/paper_report.py --workdir=runs/paper`.
"""

import json
import pathlib
import re
import time

import jax
import ml_collections
import tqdm

from luckystar import config as config_lib
from luckystar import errors
from luckystar.engine import artifacts
from luckystar.engine import metrics as metrics_lib

DONE_FILE = 'stage_done.json'
# '@<stage>' opening a value or the path of a sources item (after 'FORMAT:'); a weight ('@0.1') starts with a digit.
REFERENCE = re.compile(r'(?:^|(?<=:))@([A-Za-z_][\w-]*)')


def _references(node, prefix: str = '') -> list[tuple[ml_collections.ConfigDict, str, str]]:
  """(the ConfigDict that holds it, its key there, its dotted key) of every '@...' string in a stage config."""
  found = []
  for key, value in node.items():
    if isinstance(value, ml_collections.ConfigDict):
      found += _references(value, f'{prefix}{key}.')
    elif isinstance(value, str) and REFERENCE.search(value):
      found.append((node, key, prefix + key))
  return found


def resolve(stage_config: ml_collections.ConfigDict, workdir: pathlib.Path, seed: int) -> ml_collections.ConfigDict:
  """A copy of `stage_config` with every '@<stage>[/path]' string made a path under `workdir`."""
  resolved = ml_collections.ConfigDict(stage_config.to_dict())
  for node, key, _ in _references(resolved):
    node[key] = REFERENCE.sub(lambda match: str(workdir / match.group(1)), node[key])
  resolved.seed = seed
  return resolved


def check_order(config) -> None:
  """Every stage in the order exists, and every '@<stage>' it reads runs before it."""
  stages, order = config.pipeline.stages, tuple(config.pipeline.order)
  if unknown := [name for name in order if name not in stages]:
    raise errors.UserError(f'config.pipeline.order names {unknown}, which config.pipeline.stages does not '
                           f'define; stages are {sorted(stages)}')
  for position, name in enumerate(order):
    for node, key, dotted in _references(stages[name]):
      value = node[key]
      for source in REFERENCE.findall(value):
        if source not in order[:position]:
          raise errors.UserError(f'config.pipeline.stages.{name}.{dotted}={value!r} reads stage {source!r}, which '
                                 f'does not run before it in config.pipeline.order={order}')


def run_stage(name: str, stage_config: ml_collections.ConfigDict, stage_dir: pathlib.Path) -> float:
  """Runs one stage in `stage_dir` unless it finished there before under the same config (its DONE_FILE, an
  `artifacts` record); its wall seconds (of the first run)."""
  def build():
    module = config_lib.stage_module(stage_config.stage)
    stage_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    config_lib.save(stage_config, stage_dir)
    module.run(stage_config, str(stage_dir))
    return {'wall_s': time.perf_counter() - start}, {}

  fingerprint = config_lib.flatten(json.loads(stage_config.to_json_best_effort()))
  return artifacts.load_or_build(stage_dir, DONE_FILE, fingerprint, build, what=f'pipeline stage {name!r}',
                                 remove=str(stage_dir))['wall_s']


def run(config, workdir: str) -> None:
  workdir = pathlib.Path(workdir)
  check_order(config)
  order = tuple(config.pipeline.order)
  wall = {}
  with tqdm.tqdm(order, desc='pipeline', unit='stage', disable=jax.process_index() != 0) as bar:
    for name in bar:
      bar.set_postfix_str(name)
      stage_config = resolve(config.pipeline.stages[name], workdir, config.seed)
      wall[name] = run_stage(name, stage_config, workdir / name)
  # Each stage printed its own summary when it ran; this one says where all of them are.
  metrics_lib.print_summary(
      f'pipeline: {len(order)} stages in {sum(wall.values()) / 60:.1f} min (wall time of each first run)',
      [(name, f'{(workdir / name).absolute()}  ({wall[name] / 60:.1f} min)') for name in order],
      [('paper report', f'python experiments/paper_report.py --workdir={workdir}')])
