"""The config keys every stage shares (docs/training.md); `configs/*.py` start from `base(stage)`."""

import ast
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import pathlib
import traceback

import jax
import ml_collections

from luckystar import errors
from luckystar import files
from luckystar.engine import artifacts, checkpoint
from luckystar.rewards import judge as judge_lib
from luckystar.rewards import terms
from luckystar.tokenizer import formats

# config.stage → luckystar/stages/<stage>.py with `run(config, workdir)`, imported by name when it runs (main,
# the pipeline stage), so that no stage imports another.
STAGES = ('sft', 'rejection_sampling', 'rlvr', 'dpo', 'quantize', 'eval', 'pipeline')


def stage_module(stage: str):
  """The module that runs `stage`."""
  if stage not in STAGES:
    raise errors.UserError(f'config.stage={stage!r} is not a stage; expected one of {STAGES}')
  return importlib.import_module(f'luckystar.stages.{stage}')


MAX_SAVED_CONFIG_BYTES = 16 << 20   # a run's config.json is a few kB

# What a re-run on a workdir with checkpoints may change and still resume: how long the run goes, how often it
# logs, evaluates and checkpoints, and how its batch is split over devices and micro-batches (the loss is a sum
# over the global batch however it is split), and where its judge is served (a server moves between restarts; the
# verdict cache is keyed by the judge, so another judge starts its own). Anything else would continue one run
# with another's settings.
RESUME_MAY_CHANGE = ('total_steps', 'log_every', 'eval_every', 'checkpoint_every', 'keep_checkpoints',
                     'grad_accum_steps', 'mesh', 'distributed', 'judge')

# Keys with a known domain, checked by `check` before a stage runs. A rule covers every key whose last part is
# its name, at any depth: `batch_size` also covers `dpo.task_eval.batch_size` and a pipeline stage's own keys.
# 0 is allowed where it means "off" or "only at the end" (eval_every=0, per_task_language=0, top_k=0).
DOMAINS = {
    'an integer ≥ 1': ('total_steps', 'batch_size', 'grad_accum_steps', 'keep_checkpoints', 'max_new_tokens',
                       'seq_len', 'samples_per_prompt', 'selection_samples', 'updates_per_batch', 'max_prompt_tokens',
                       'length_multiple', 'selection_batch', 'eval_batch_size', 'sampling_batch',
                       'reference_batch_size', 'bits', 'initialization_timeout_s', 'selection_prompts'),
    'an integer ≥ 0': ('seed', 'warmup_steps', 'log_every', 'eval_every', 'checkpoint_every', 'top_k',
                       'max_tool_turns', 'max_tool_result_tokens', 'eval_examples_per_source', 'per_task_language',
                       'per_suite_language', 'max_prompts', 'eval_prompts', 'eval_samples', 'pass_k_samples',
                       'pass_k_problems', 'bfcl_per_category', 'champ_problems', 'group_size', 'pair_prompts',
                       'pairs_per_prompt', 'verbose_min_extra', 'math_max_difficulty', 'dynamic_sampling'),
    'a number ≥ 0': ('learning_rate', 'weight_decay', 'temperature', 'pass_k_temperature', 'kl_beta',
                     'clip_epsilon', 'sft_weight', 'anchor_weight'),
    'a number ≥ 0, or None (unset)': ('clip_low', 'clip_high'),
    'a number > 0': ('max_grad_norm', 'beta'),
    'a number in [0, 1)': ('b1', 'b2'),
    'a number in [0, 1]': ('ld_alpha',),
    'a number in [0, 0.5)': ('label_smoothing',),
    'a number in (0, 1]': ('top_p',),
}


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


_IN_DOMAIN = {
    'an integer ≥ 1': lambda v: _is_int(v) and v >= 1,
    'an integer ≥ 0': lambda v: _is_int(v) and v >= 0,
    'a number ≥ 0': lambda v: _is_number(v) and v >= 0,
    'a number ≥ 0, or None (unset)': lambda v: v is None or _is_number(v) and v >= 0,
    'a number > 0': lambda v: _is_number(v) and v > 0,
    'a number in [0, 1)': lambda v: _is_number(v) and 0 <= v < 1,
    'a number in [0, 1]': lambda v: _is_number(v) and 0 <= v <= 1,
    'a number in [0, 0.5)': lambda v: _is_number(v) and 0 <= v < 0.5,
    'a number in (0, 1]': lambda v: _is_number(v) and 0 < v <= 1,
}
_DOMAIN_OF = {name: domain for domain, names in DOMAINS.items() for name in names}


def check(config: ml_collections.ConfigDict) -> None:
  """A UserError naming each key whose value lies outside its DOMAINS entry (`config.batch_size=0 is not an
  integer ≥ 1`), before anything is created, read or trained."""
  problems = [f'config.{key}={value!r} is not {_DOMAIN_OF[leaf]}'
              for key, value in flatten(config.to_dict()).items()
              if (leaf := key.rsplit('.', 1)[-1]) in _DOMAIN_OF and not _IN_DOMAIN[_DOMAIN_OF[leaf]](value)]
  if config.get('chat_format', 'auto') not in formats.CHOICES:
    problems.append(f'config.chat_format={config.chat_format!r} is not one of {formats.CHOICES}')
  problems += [problem for where, judge in _judge_configs(config.to_dict())
               for problem in judge_lib.config_problems(judge, where)]
  problems += _reward_problems(flatten(config.to_dict()))
  if problems:
    raise errors.UserError('; '.join(problems))


def _reward_problems(flat: dict) -> list[str]:
  """The `rlvr.reward` / `rlvr.language_penalty` errors (docs/rl.md#reward-terms) of every RLVR section."""
  problems = []
  for key in flat:
    if key == 'rlvr.reward' or key.endswith('.rlvr.reward'):
      try:
        terms.weights_of(flat[key], flat.get(key.removesuffix('reward') + 'language_penalty'))
      except errors.UserError as e:
        problems.append(str(e).replace(terms.REWARD_KEY, f'config.{key}'))
  return problems


# Keys a `--config.<key>=V` flag may set although the config file does not define them with that shape (a locked
# ConfigDict refuses both): `main` sets them after parsing the rest.
#   model_overrides.<field>   any ModelConfig field (luckystar.model.ModelConfig), e.g. param_dtype=bfloat16
#   selection_prompts         one count for every task instead of the config file's dict task → count
# Each also works at any depth (a pipeline stage's own), by the last parts of the key.
OPEN_KEYS = ('model_overrides.<field>', 'selection_prompts')


def is_open_key(key: str) -> bool:
  """Whether `--config.<key>=V` is one of OPEN_KEYS."""
  parts = key.split('.')
  return parts[-1] == 'selection_prompts' or (len(parts) > 1 and parts[-2] == 'model_overrides')


def set_open_key(config: ml_collections.ConfigDict, key: str, given: str, flag: str) -> None:
  """Sets the OPEN_KEYS entry `key` from the text of `flag` (`--config.<key>=<given>`), or a UserError naming
  the flag: an unknown ModelConfig field, a value of another type."""
  from luckystar import model  # pylint: disable=g-import-not-at-top
  *parents, leaf = key.split('.')
  node = config
  for part in parents:
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      raise errors.UserError(f'{flag}: the config has no key {part!r} there')
    node = node[part]
  if parents and parents[-1] == 'model_overrides':
    fields = {field.name: field for field in dataclasses.fields(model.ModelConfig)}
    if leaf not in fields or leaf == 'quant':
      raise errors.UserError(f'{flag}: {leaf!r} is not a ModelConfig field a flag can set; fields: '
                             f'{sorted(set(fields) - {"quant"})}')
    if isinstance(fields[leaf].default, str):
      value = given
    else:
      try:
        value = ast.literal_eval({'true': 'True', 'false': 'False', 'none': 'None'}.get(given, given))
      except (ValueError, SyntaxError):
        raise errors.UserError(f'{flag}: {given!r} is not a value of ModelConfig.{leaf}') from None
  else:
    try:
      value = int(given)
    except ValueError:
      raise errors.UserError(f'{flag}: expected one integer, the candidates for every task (set one task\'s '
                             f'count with --config.{key}.<task>=N)') from None
  with config.unlocked():
    if leaf in node:
      del node[leaf]   # the type may change (a dict becomes a count)
    node[leaf] = value


def check_inputs(config: ml_collections.ConfigDict) -> list[str]:
  """A UserError unless what the config reads is there: every `*sources` string (parsed; files present and regular
  files) and every `init_from` (its model config and tensor headers read, no weights); a pipeline's '@<stage>'
  references, made by the run, are skipped. For `main --dry_run`; returns notes for the user (none yet)."""
  from luckystar.data import sources as sources_lib  # pylint: disable=g-import-not-at-top
  tree = config.to_dict()
  for key, value in flatten(tree).items():
    leaf = key.rsplit('.', 1)[-1]
    if leaf.endswith('sources') and isinstance(value, str) and value.strip():
      items = [item for item in value.split(',') if not item.partition(':')[2].startswith('@')]
      sources_lib.parse(','.join(items), key=f'config.{key}')
    elif leaf == 'init_from' and isinstance(value, str) and value and not value.startswith('@'):
      parent = key.rpartition('.')[0]
      overrides = flatten_get(tree, f'{parent}.model_overrides' if parent else 'model_overrides') or {}
      check_init_from(value, overrides, f'config.{key}')
  return []


def flatten_get(tree: dict, key: str):
  """tree['a']['b'] for key 'a.b'; None if absent."""
  for part in key.split('.'):
    if not isinstance(tree, dict) or part not in tree:
      return None
    tree = tree[part]
  return tree


def check_init_from(init_from: str, overrides: dict, where: str = 'config.init_from') -> None:
  """A UserError unless `init_from` names a model `state.initial_model` can start from: 'random:<size>', a
  bundled name, a run directory with a complete checkpoint, or a transformers directory; reads its model config
  and tensor headers (with `overrides` applied), never its weights."""
  from luckystar.engine import loading  # pylint: disable=g-import-not-at-top
  from luckystar.engine import state as state_lib  # pylint: disable=g-import-not-at-top
  from luckystar.interop import hf  # pylint: disable=g-import-not-at-top
  from luckystar import model  # pylint: disable=g-import-not-at-top
  if init_from.startswith(state_lib.RANDOM_INIT_PREFIX):
    state_lib.initial_model(init_from, overrides)   # a named size: no params made
    return
  try:
    path = loading.resolve(init_from)
    if checkpoint.is_run_dir(path):
      step_dir = checkpoint._step_dir(path.absolute())  # pylint: disable=protected-access
      # The file orbax's JsonCheckpointHandler writes (checkpoint.load_params reads it so).
      saved = files.read_json(step_dir / checkpoint.MODEL_CONFIG / 'metadata', MAX_SAVED_CONFIG_BYTES, 'model config',
                              finite=False)
      model.ModelConfig(**saved).replace(**overrides)
    elif hf.is_hf_dir(path):
      hf.read_config(path, **overrides)
    else:
      raise errors.InvalidFile(f'{path}: not a model directory luckystar can read (a transformers Cohere2/Cohere '
                               f'directory with config.json and safetensors, or a luckystar run directory)')
  except errors.UserError as e:
    raise errors.UserError(f'{where}={init_from!r}: {e}') from None
  except (TypeError, ValueError) as e:   # a model config that does not take the overrides
    raise errors.UserError(f'{where}={init_from!r}: {type(e).__name__}: {e}') from None


def _judge_configs(tree: dict, prefix: str = 'config') -> list[tuple[str, object]]:
  """(dotted key, value) of every `judge` key at any depth: the stage's own and a pipeline stage's."""
  found = []
  for key, value in tree.items():
    if key == 'judge':
      found.append((f'{prefix}.{key}', value))
    elif isinstance(value, dict):
      found += _judge_configs(value, f'{prefix}.{key}')
  return found


def save(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> None:
  """workdir/config.json: the config a stage runs with (main and the pipeline call this on every process;
  process 0 writes it, atomically). Over a run that has checkpoints, a config that differs from the saved one
  outside RESUME_MAY_CHANGE is a UserError naming the keys, on every process, and the saved config stays. A key
  the saved config lacks (an option added since the run started) does not count: the run resumes with it."""
  path = pathlib.Path(workdir) / 'config.json'
  text = config.to_json_best_effort(indent=2) + '\n'
  if os.path.lexists(path) and checkpoint.latest_step(workdir) is not None:   # a FIFO is refused, not read
    saved, new = flatten(_saved_config(path)), flatten(json.loads(text))
    if differ := sorted(key for key in saved if saved[key] != new.get(key, '<absent>')
                        and key.split('.')[0] not in RESUME_MAY_CHANGE):
      raise errors.UserError(f'{workdir} holds checkpoints of a run with another config ({", ".join(differ[:6])} differ: '
                             f'{ {key: saved.get(key, "<absent>") for key in differ[:6]} } there); a re-run resumes it, so '
                             f'only {", ".join(RESUME_MAY_CHANGE)} may change. Use a new --workdir, or delete {path.parent} '
                             f'to start over')
  if jax.process_index() == 0:
    try:
      artifacts.write_atomically(path, text)
    except artifacts.WriteFailed:
      raise   # a full disk or a read-only workdir: names the path and what to do
    except OSError as e:
      raise errors.UserError(f'cannot write {path} ({e.strerror}); use a --workdir this user can write to') from None


def _saved_config(path: pathlib.Path) -> dict:
  """The config.json of a run with checkpoints, or a UserError: without it a re-run cannot be checked. Read
  within bounds (`luckystar.files`): a FIFO, a device or a huge file is refused, not read."""
  try:
    return files.read_json_object(path, MAX_SAVED_CONFIG_BYTES, 'saved config', finite=False)
  except errors.InvalidFile as e:
    raise errors.UserError(f'{e}; it is the config of the run whose checkpoints are in '
                           f'{checkpoint.directory(path.parent)}, which a re-run must match. Restore it, delete it to '
                           f'resume under the new config unchecked, or use a new --workdir') from None


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
  # The chat format of init_from's tokenizer: 'auto' detects it from the special tokens (luckystar.tokenizer).
  config.chat_format = 'auto'
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
  # The LLM judge, asked only where rule verifiers cannot decide (rewards.judge; off: 'none'). 'http': an
  # OpenAI-compatible server (vLLM, `python -m luckystar.serve`) at base_url serving `model`; 'model': init_from
  # (anything `luckystar.load` reads) in this process, greedy and concise. guided_choice: the server may answer
  # only YES or NO (vLLM's extension; False for a server without it).
  config.judge = ml_collections.ConfigDict(judge_lib.DEFAULTS)
  config[stage] = ml_collections.ConfigDict()
  return config


def variants(path: str | pathlib.Path) -> list[str]:
  """The `:variant` names a config file's get_config takes: the strings its code compares `arg` with
  (`if arg == 'smoke':`), in the order they appear; read from the source, nothing run."""
  names = []
  for node in ast.walk(ast.parse(pathlib.Path(path).read_text())):
    if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == 'arg':
      names += [c.value for c in node.comparators if isinstance(c, ast.Constant) and isinstance(c.value, str)]
  return sorted(set(names), key=names.index)


def from_file(path: str | pathlib.Path, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of a config file such as configs/rlvr.py, as `--config=path[:arg]` loads it;
  for scripts that build a stage's config in process (benchmarks). A missing file, a syntax error or an
  exception raised in the file (an unknown variant) is a UserError naming file:line."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise errors.UserError(f'{path}: no such config file' + (' (it is a directory)' if path.is_dir() else ''))
  spec = importlib.util.spec_from_file_location(path.stem + '_config', path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    if not callable(getattr(module, 'get_config', None)):
      raise errors.UserError(f'{path}: defines no get_config(arg); a config file returns its ConfigDict from one')
    config = module.get_config(arg)
  except errors.UserError:
    raise
  except SyntaxError as e:
    raise errors.UserError(f'{e.filename}:{e.lineno}: syntax error in the config file: {e.msg}') from None
  except Exception as e:  # the file's own code failed: say where in it, without a traceback
    line = next((f'{path}:{frame.lineno}' for frame in reversed(traceback.extract_tb(e.__traceback__))
                 if pathlib.Path(frame.filename).resolve() == path.resolve()), str(path))
    # A ValueError is how a config file rejects its argument (an unknown variant); its message says it all.
    message = str(e) if type(e) is ValueError else f'{type(e).__name__}: {e}'
    raise errors.UserError(f'{line}: {" ".join(message.split())}') from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise errors.UserError(f'{path}: get_config({arg!r}) returned {type(config).__name__}, not a ConfigDict')
  return config
