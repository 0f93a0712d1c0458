"""The config keys every stage shares (DESIGN §8); `configs/*.py` start from `base(stage)`."""

import importlib
import importlib.util
import json
import pathlib

import jax
import ml_collections

from luckystar import errors
from luckystar.engine import artifacts, checkpoint

# config.stage → luckystar/stages/<stage>.py with `run(config, workdir)`, imported by name when it runs (main,
# the pipeline stage), so that no stage imports another.
STAGES = ('sft', 'rejection_sampling', 'rlvr', 'dpo', 'quantize', 'eval', 'pipeline')


def stage_module(stage: str):
  """The module that runs `stage`."""
  if stage not in STAGES:
    raise errors.UserError(f'config.stage={stage!r} is not a stage; expected one of {STAGES}')
  return importlib.import_module(f'luckystar.stages.{stage}')


# What a re-run on a workdir with checkpoints may change and still resume: how long the run goes, how often it
# logs, evaluates and checkpoints, and how its batch is split over devices and micro-batches (the loss is a sum
# over the global batch however it is split). Anything else would continue one run with another's settings.
RESUME_MAY_CHANGE = ('total_steps', 'log_every', 'eval_every', 'checkpoint_every', 'keep_checkpoints',
                     'grad_accum_steps', 'mesh', 'distributed')


def save(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> None:
  """workdir/config.json: the config a stage runs with (main and the pipeline call this on every process;
  process 0 writes it, atomically). Over a run that has checkpoints, a config that differs from the saved one
  outside RESUME_MAY_CHANGE is a UserError naming the keys, on every process, and the saved config stays."""
  path = pathlib.Path(workdir) / 'config.json'
  text = config.to_json_best_effort(indent=2) + '\n'
  if path.is_file() and checkpoint.latest_step(workdir) is not None:
    saved, new = flatten(json.loads(path.read_text())), flatten(json.loads(text))
    if differ := sorted(key for key in saved.keys() | new.keys() if saved.get(key, '<absent>') != new.get(
        key, '<absent>') and key.split('.')[0] not in RESUME_MAY_CHANGE):
      raise errors.UserError(f'{workdir} holds checkpoints of a run with another config ({", ".join(differ[:6])} differ: '
                             f'{ {key: saved.get(key, "<absent>") for key in differ[:6]} } there); a re-run resumes it, so '
                             f'only {", ".join(RESUME_MAY_CHANGE)} may change. Use a new --workdir, or delete {path.parent} '
                             f'to start over')
  if jax.process_index() == 0:
    artifacts.write_atomically(path, text)


def flatten(tree: dict, prefix: str = '') -> dict:
  """Nested dicts as {'a.b': value}."""
  flat = {}
  for key, value in tree.items():
    flat.update(flatten(value, f'{prefix}{key}.') if isinstance(value, dict) else {f'{prefix}{key}': value})
  return flat


def base(stage: str) -> ml_collections.ConfigDict:
  """Shared keys with defaults; the stage's own settings go in `config.<stage>`."""
  if stage not in STAGES:
    raise ValueError(f'unknown stage {stage!r}; expected one of {STAGES}')
  config = ml_collections.ConfigDict()
  config.stage = stage
  config.seed = 0
  config.init_from = 'tiny-sft'       # bundled name, luckystar checkpoint dir, or transformers dir
  # ModelConfig fields replaced at init, e.g. dict(sliding_window=512); checkpoints keep the result.
  config.model_overrides = ml_collections.ConfigDict()
  config.total_steps = 100
  config.batch_size = 8
  config.learning_rate = 1e-5
  # Optimizer (AdamW, linear warmup then cosine to 0 at total_steps; luckystar.engine.optim).
  config.warmup_steps = 0
  config.weight_decay = 0.0
  config.b1 = 0.9
  config.b2 = 0.95
  config.max_grad_norm = 1.0
  config.grad_accum_steps = 1          # micro-batches per step; the loss stays sum / count over the batch
  config.keep_checkpoints = 3
  config.log_every = 1
  config.eval_every = 50
  config.checkpoint_every = 50
  # Device mesh ('data', 'fsdp', 'tensor'); -1 takes the remaining devices.
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  # Multi-process runs: when to call jax.distributed.initialize() (luckystar.distributed).
  config.distributed = ml_collections.ConfigDict(dict(initialize='auto', coordinator_address='', num_processes=0,
                                                      process_id=-1, initialization_timeout_s=300))
  config.sampling = ml_collections.ConfigDict(dict(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=256))
  config[stage] = ml_collections.ConfigDict()
  return config


def from_file(path: str | pathlib.Path, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of a config file such as configs/rlvr.py, as `--config=path[:arg]` loads it;
  for scripts that build a stage's config in process (benchmarks)."""
  spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem + '_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)
