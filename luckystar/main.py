"""Entry point for every stage.

    python -m luckystar.main --config=configs/<stage>.py[:variant] --workdir=DIR [--config.key=value ...]

Writes DIR/config.json, then runs the stage named by `config.stage` (its module's `run(config, workdir)`).
Re-running on the same DIR resumes from its last checkpoint; the config may then change only in
`config.RESUME_MAY_CHANGE` (how long the run goes, how often it logs and checkpoints, how the batch is laid out).
Bad input (a config file that does not load, a value outside its `config.DOMAINS`, a workdir that cannot be
one) stops with one `error: ...` line and a non-zero exit, before anything is written; so does a write the disk
refuses during the run (full, or made read-only), naming the path: the re-run after the fix resumes from the
last complete checkpoint.
"""

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

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file, `file.py` or `file.py:variant`.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory; re-running on the same one resumes.')
flags.mark_flags_as_required(['config', 'workdir'])

def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  config = _CONFIG.value
  workdir = pathlib.Path(_WORKDIR.value)
  try:
    config_lib.check(config)
    module = config_lib.stage_module(config.stage)
    distributed.maybe_initialize(config.distributed)  # before any device is touched
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


def make_workdir(workdir: pathlib.Path) -> None:
  """Creates `workdir` if need be; a UserError if it cannot be a run directory (a file, under a file, not
  writable)."""
  if blocker := next((p for p in (workdir, *workdir.parents) if p.exists() and not p.is_dir()), None):
    raise errors.UserError(f'--workdir={workdir}: {blocker} is a file, not a directory; choose another --workdir')
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


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with unknown `--config.*` keys reported by name instead of a traceback, and a config
  file that does not load (missing, a syntax error, an unknown :variant) reported as file:line."""
  if (config_file := _config_argument(argv)) is not None:
    # Loaded here first: ml_collections would defer a missing file's error under an internal name, and
    # print a config's own error (an unknown variant) inside a traceback.
    try:
      config_lib.from_file(*config_file.split(':', 1))
    except errors.UserError as e:
      sys.exit(f'error: {e}')
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
