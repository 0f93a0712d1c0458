"""Entry point for every stage.

    python -m luckystar.main --config=configs/<stage>.py[:variant] --workdir=DIR [--config.key=value ...]

Writes DIR/config.json, then runs the stage named by `config.stage` (its module's `run(config, workdir)`).
Re-running on the same DIR resumes from its last checkpoint; the config may then change only in
`config.RESUME_MAY_CHANGE` (how long the run goes, how often it logs and checkpoints, how the batch is laid out).
"""

import pathlib
import re
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from luckystar import config as config_lib
from luckystar import errors
from luckystar import distributed

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
    module = config_lib.stage_module(config.stage)  # the first access also loads the config file
    distributed.maybe_initialize(config.distributed)  # before any device is touched
  except (ValueError, OSError, errors.UserError) as e:
    raise SystemExit(f'error: {e}') from None
  workdir.mkdir(parents=True, exist_ok=True)
  try:
    config_lib.save(config, workdir)
    module.run(config, str(workdir))
  except (FileNotFoundError, errors.UserError) as e:  # a bad init_from, checkpoint or data file
    raise SystemExit(f'error: {e}') from None


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with unknown `--config.*` keys reported by name instead of a traceback."""
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
