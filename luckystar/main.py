"""Entry point for every stage.

    python -m luckystar.main --config=configs/<stage>.py[:variant] --workdir=DIR [--config.key=value ...] [--dry_run]

Writes DIR/config.json, then runs the stage named by `config.stage` (its module's `run(config, workdir)`).
Re-running on the same DIR resumes from its last checkpoint; the config may then change only in
`config.RESUME_MAY_CHANGE` (how long the run goes, how often it logs and checkpoints, how the batch is laid out).
Bad input (a config file that does not load, a value outside its `config.DOMAINS`, a workdir that cannot be
one) stops with one `error: ...` line and a non-zero exit, before anything is written; so does a write the disk
refuses during the run (full, or made read-only), naming the path: the re-run after the fix resumes from the
last complete checkpoint.

--dry_run checks the same command without running it, in seconds: the config (keys, domains, mesh sizes against
the devices), every data source of the stage (parsed, each file present and a regular file) and `init_from` (a
bundled name, a run directory with a checkpoint, or a transformers directory's config.json and tensor headers;
no weights read); it prints the resolved config and what would run, writes nothing and exits 0.
`--config.model_overrides.<field>=V` takes any ModelConfig field; `--config.rlvr.selection_prompts=N` one count
for every task (config.OPEN_KEYS). JAX's backend INFO lines are hidden unless --verbosity=1 or more.
"""

import json
import logging
import os
import pathlib
import re
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from luckystar import config as config_lib
from luckystar import errors
from luckystar import distributed
from luckystar.engine import artifacts
from luckystar.engine import checkpoint
from luckystar.engine import state as state_lib

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file, `file.py` or `file.py:variant`.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory; re-running on the same one resumes.')
_DRY_RUN = flags.DEFINE_boolean('dry_run', False, 'Check the config, its data sources and init_from, print the '
                                 'resolved config and what would run; write nothing.')
flags.mark_flags_as_required(['config', 'workdir'])

# `--config.<key>=V` overrides config.OPEN_KEYS takes, set after absl has parsed the rest (a locked config refuses
# them): (flag, dotted key, value as given).
_OPEN_OVERRIDES: list[tuple[str, str, str]] = []


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if flags.FLAGS.verbosity < 1:   # jax's backend discovery ("Unable to initialize backend 'tpu'") is not news
    logging.getLogger('jax').setLevel(logging.WARNING)
  config = _CONFIG.value
  workdir = pathlib.Path(_WORKDIR.value)
  try:
    for flag, key, value in _OPEN_OVERRIDES:
      config_lib.set_open_key(config, key, value, flag)
    config_lib.check(config)
    module = config_lib.stage_module(config.stage)
    if not _DRY_RUN.value:   # a dry run checks a multi-process launch on this host alone
      distributed.maybe_initialize(config.distributed)  # before any device is touched
    # A dry run of a multi-process launch sees this host's devices only: it checks the mesh sizes, not their count.
    multiprocess = config.distributed.initialize == 'always' or config.distributed.initialize == 'auto' and (
        distributed.launched_multiprocess() or config.distributed.num_processes > 1)
    state_lib.check_mesh(config.mesh, count_devices=not (_DRY_RUN.value and multiprocess))
    if _DRY_RUN.value:
      dry_run(config, module, workdir)
      return
    make_workdir(workdir)
  except (ValueError, OSError, errors.UserError) as e:
    raise SystemExit(f'error: {e}') from None
  try:
    config_lib.save(config, workdir)
    module.run(config, str(workdir))
  except (FileNotFoundError, errors.UserError) as e:  # a bad init_from, checkpoint or data file
    raise SystemExit(f'error: {e}') from None
  except OSError as e:   # a write the disk refused outside the training loop (which says where it resumes)
    if (failure := artifacts.write_failure(e)) is None:
      raise
    raise SystemExit(f'error: {failure}; then re-run the same command') from None


def dry_run(config, module, workdir: pathlib.Path) -> None:
  """Checks what the run would read (data sources, init_from) and where it would write, then prints the resolved
  config and a one-line summary; creates and writes nothing."""
  check_workdir(workdir)
  notes = config_lib.check_inputs(config)
  if hasattr(module, 'dry_run_notes'):   # a stage's own checks of its data, and what it would leave out
    notes += module.dry_run_notes(config)
  print(config.to_json_best_effort(indent=2))
  for note in notes:
    print(f'note: {note}')
  latest = checkpoint.latest_step(workdir) if workdir.is_dir() else None
  if config.stage == 'pipeline':
    what = 'stages ' + ' → '.join(config.pipeline.order)
  elif config.stage in ('eval', 'quantize'):
    what = f'from {config.init_from}'
  else:
    what = f'{config.total_steps} steps from {config.init_from}'
  resume = f', resuming from step {latest}' if latest is not None else ''
  print(f'would run: stage {config.stage}, {what}{resume}, writing {workdir}')


def check_workdir(workdir: pathlib.Path) -> None:
  """A UserError if `workdir` cannot be a run directory (a file, under a file, not writable), creating nothing."""
  if blocker := next((p for p in (workdir, *workdir.parents) if p.exists() and not p.is_dir()), None):
    raise errors.UserError(f'--workdir={workdir}: {blocker} is a file, not a directory; choose another --workdir')
  existing = next(p for p in (workdir, *workdir.absolute().parents) if p.exists())
  if not os.access(existing, os.W_OK | os.X_OK):
    raise errors.UserError(f'--workdir={workdir}: this user cannot write {"there" if existing == workdir else existing}; '
                           f'choose another --workdir')


def make_workdir(workdir: pathlib.Path) -> None:
  """Creates `workdir` if need be; a UserError if it cannot be a run directory (a file, under a file, not
  writable)."""
  check_workdir(workdir)
  try:
    workdir.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise errors.UserError(f'--workdir={workdir}: cannot create it ({e.strerror}); choose another --workdir') from None
  if not os.access(workdir, os.W_OK | os.X_OK):
    raise errors.UserError(f'--workdir={workdir}: this user cannot write there; choose another --workdir')


def _config_argument(argv: list[str]) -> str | None:
  """The value of --config in argv as absl reads it (--config=X, -config=X or --config X; the last one wins)."""
  value = None
  for position, arg in enumerate(argv[1:], 1):
    if arg == '--':
      break
    name, equals, given = arg.lstrip('-').partition('=')
    if arg.startswith('-') and name == 'config':
      value = given if equals else (argv[position + 1] if position + 1 < len(argv) else None)
  return value


def _config_help(config_file: str) -> str:
  """What --help adds for the named config file: its variants and its top-level keys."""
  path, _, arg = config_file.partition(':')
  config = config_lib.from_file(path, arg or None)
  variants = ', '.join(f'{path}:{name}' for name in config_lib.variants(path)) or 'none'
  keys = '\n'.join(f'  {key}: ' + (f'{{{", ".join(value)}}}' if isinstance(value, dict) else json.dumps(value, default=str))
                   for key, value in config.to_dict().items())
  return f'\n{config_file}\n variants: {path}, {variants}\n top-level keys (--config.<key>=...):\n{keys}\n'


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with unknown `--config.*` keys reported by name instead of a traceback, and a config
  file that does not load (missing, a syntax error, an unknown :variant) reported as file:line. --help with
  --config also lists that file's variants and top-level keys."""
  if (config_file := _config_argument(argv)) is not None:
    # Loaded here first: ml_collections would defer a missing file's error under an internal name, and
    # print a config's own error (an unknown variant) inside a traceback.
    try:
      config_lib.from_file(*config_file.split(':', 1))
      if {'--help', '-help', '-h', '--helpshort', '-?'} & set(argv):
        sys.modules['__main__'].__doc__ = (sys.modules['__main__'].__doc__ or '') + _config_help(config_file)
    except errors.UserError as e:
      sys.exit(f'error: {e}')
  open_keys = [(arg, *arg[len('--config.'):].split('=', 1)) for arg in argv[1:]
               if arg.startswith('--config.') and '=' in arg and config_lib.is_open_key(arg[len('--config.'):].split('=')[0])]
  _OPEN_OVERRIDES[:] = open_keys
  # ml_collections finds overrides in sys.argv itself, so they leave both.
  argv = [arg for arg in argv if arg not in {flag for flag, _, _ in open_keys}]
  sys.argv[:] = [arg for arg in sys.argv if arg not in {flag for flag, _, _ in open_keys}]
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:  # ml_collections' locked-config error for an unknown key
    # Its message is the key, quoted, maybe escaped and followed by a close match ('\'totl_steps\'\nDid you mean
    # "total_steps" instead of "totl_steps"?').
    message = str(e).encode().decode('unicode_escape')
    key = (re.search(r"[\w.-]+", message) or [message])[0]
    suggestion = (re.search(r'Did you mean "([^"]+)"', message) or [None, None])[1]
    given = [a.split('=')[0] for a in argv if a.startswith('--config.') and key in a.split('=')[0]]
    sys.exit(f'error: unknown config key {key!r} (from {", ".join(given) or "a --config override"}); '
             + (f'did you mean {suggestion!r}? ' if suggestion else '')
             + 'configs are locked, so an override must name a key the config file defines')
  except flags.Error as e:
    sys.exit(f'error: {e}\nUsage: python -m luckystar.main --config=configs/<stage>.py --workdir=DIR')


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
