"""Hostile checkpoint files and faults while saving (issue 54).

Files: a checkpoint's tokenizer, config and header files that are truncated, of the wrong JSON shape, nested
deeply, huge (a sparse file), a FIFO or a link to /dev/zero, or that give the tokenizer ids the model cannot
embed, stop `luckystar.load` with one line naming the file, before the tokenizers library or a parser sees
them; the directory repaired loads as before.

Faults: a disk that fills up and a checkpoints directory that turns read-only stop a run with one `error:`
line naming the path, no traceback and no shutdown noise, and the last complete checkpoint stays the resume
point. As root, chmod does not stop a write, so a read-only directory is `chattr +i` (an immutable directory
stops root too; a plain chmod when not root). A full disk is RLIMIT_FSIZE (EFBIG, the kernel's own error from
the same write path) set once the first checkpoint is saved, or /dev/full (ENOSPC) behind a workdir file.
"""

import contextlib
import json
import os
import pathlib
import re
import resource
import shutil
import signal
import subprocess
import sys
import textwrap

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import luckystar
import main_runs
from luckystar import config as config_lib
from luckystar import errors
from luckystar import model as model_lib
from luckystar import tokenizer as tokenizer_lib
from luckystar.engine import artifacts
from luckystar.engine import checkpoint
from luckystar.engine import metrics
from luckystar.engine import state as state_lib
from luckystar.interop import hf
from luckystar.interop import hf_tokenizer
from test_bad_input import CONFIG, _write_hf_dir

VOCAB = 8064            # the bundled tokenizer's 8000 ids, padded as real checkpoints pad their embeddings
HUGE = 150_000_000      # bytes: above every cap on a checkpoint's JSON files, and sparse, so cheap to make
DEEP = 100_000          # nesting levels: Python's parser would recurse once per level


# ---- fixtures -----------------------------------------------------------------------------------------

def _write_run_dir(workdir: pathlib.Path, config) -> pathlib.Path:
  """A luckystar run directory as a stage leaves it: checkpoints/1 (params and model config, with checksums)
  and the run's tokenizer record."""
  params = model_lib.init(config, jax.random.key(0))
  checkpoints = checkpoint.manager(workdir, keep=1)
  checkpoints.save(1, args=ocp.args.Composite(**{
      checkpoint.STATE: ocp.args.StandardSave({'params': params}),
      checkpoint.MODEL_CONFIG: ocp.args.JsonSave(config.to_dict())}))
  checkpoints.wait_until_finished()
  checkpoints.close()
  checkpoint.save_tokenizer(workdir, tokenizer_lib.default())
  return workdir


@pytest.fixture(scope='module')
def pristine(tmp_path_factory):
  """Good directories to copy and damage: a transformers one carrying the bundled tokenizer as tokenizer.json,
  one whose embedding is smaller than that tokenizer, and luckystar run directories of both."""
  root = tmp_path_factory.mktemp('pristine')
  files = hf_tokenizer.tokenizer_files(tokenizer_lib.default(), CONFIG.max_position_embeddings)
  dirs = {'hf': _write_hf_dir(root / 'hf', CONFIG.replace(vocab_size=VOCAB)),
          'hf_small_vocab': _write_hf_dir(root / 'hf_small_vocab', CONFIG)}
  for directory in dirs.values():
    for name, text in files.items():
      (directory / name).write_text(text, encoding='utf-8')
  dirs['run'] = _write_run_dir(root / 'run', CONFIG.replace(vocab_size=VOCAB))
  dirs['run_small_vocab'] = _write_run_dir(root / 'run_small_vocab', CONFIG)
  return dirs


@contextlib.contextmanager
def _deadline(seconds: int = 30):
  """A read that never ends (a FIFO with no writer) fails the test instead of hanging it."""
  def expire(*_):
    raise TimeoutError(f'still running after {seconds} s')
  previous = signal.signal(signal.SIGALRM, expire)
  signal.alarm(seconds)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# ---- how each file is damaged -------------------------------------------------------------------------

def _text(content: str | bytes):
  return lambda p: p.write_bytes(content if isinstance(content, bytes) else content.encode())


def _fifo(p):
  p.unlink()
  os.mkfifo(p)


def _dev_zero(p):
  p.unlink()
  p.symlink_to('/dev/zero')


def _sparse(p):
  with open(p, 'wb') as f:
    f.write(b'{"model": ')
  os.truncate(p, HUGE)


def _nested(key: str = 'model'):
  return _text('{"%s": %s1%s}' % (key, '[' * DEEP, ']' * DEEP))


def _truncated(p):
  p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2])


def _edit_json(edit):
  def damage(p):
    value = json.loads(p.read_text(encoding='utf-8'))
    edit(value)
    p.write_text(json.dumps(value), encoding='utf-8')   # ensure_ascii: a lone surrogate goes out as \ud800
  return damage


def _add_vocab_piece(piece: str, piece_id: int):
  return _edit_json(lambda tokenizer: tokenizer['model']['vocab'].__setitem__(piece, piece_id))


def _add_far_token(token_id: int):
  """A piece with an id past the others, also an added token (so text containing it encodes to that id): the
  count of pieces still fits the embedding, the id does not."""
  def edit(tokenizer):
    tokenizer['model']['vocab']['<|FAR_AWAY|>'] = token_id
    tokenizer['added_tokens'].append({'id': token_id, 'content': '<|FAR_AWAY|>', 'single_word': False,
                                      'lstrip': False, 'rstrip': False, 'normalized': False, 'special': False})
  return _edit_json(edit)


def _safetensors_header(header: bytes):
  """model.safetensors whose 8-byte length frames `header` exactly (what the size check lets through)."""
  return _text(len(header).to_bytes(8, 'little') + header)


def _sparse_safetensors(p):
  with open(p, 'wb') as f:
    f.write((HUGE - 8).to_bytes(8, 'little') + b'{')
  os.truncate(p, HUGE)


def _nested_index(p):
  _nested('weight_map')(p)


def _manifest(workdir: pathlib.Path) -> pathlib.Path:
  return checkpoint.manifest_path(workdir / 'checkpoints' / '1', 0)


# case: (pristine directory, the file damaged (relative), how, what the message must also say)
TOKENIZER_JSON = 'tokenizer.json'
TOKENIZER_CONFIG = 'tokenizer_config.json'
RECORD = f'{checkpoint.TOKENIZER_DIR}/{checkpoint.TOKENIZER_RECORD}'
HOSTILE_FILES = {
    'tokenizer_json_truncated': ('hf', TOKENIZER_JSON, _truncated, ['invalid JSON']),
    'tokenizer_json_a_list': ('hf', TOKENIZER_JSON, _text('[{"model": {}}]'), ['a JSON object', 'list']),
    'tokenizer_json_nested': ('hf', TOKENIZER_JSON, _nested(), [f'nested {DEEP + 1} levels deep']),
    'tokenizer_json_huge': ('hf', TOKENIZER_JSON, _sparse, ['larger than']),
    'tokenizer_json_fifo': ('hf', TOKENIZER_JSON, _fifo, ['not a regular file']),
    'tokenizer_json_dev_zero': ('hf', TOKENIZER_JSON, _dev_zero, ['not a regular file']),
    'tokenizer_json_lone_surrogate': ('hf', TOKENIZER_JSON, _add_vocab_piece('\ud800x', 7999), ['not valid Unicode']),
    'tokenizer_json_no_model': ('hf', TOKENIZER_JSON, _edit_json(lambda t: t.pop('model')), ['tokenizers library']),
    'tokenizer_larger_than_vocab_size': ('hf_small_vocab', TOKENIZER_JSON, lambda p: None,
                                         ['ids up to 7999', 'vocab_size=64']),
    'tokenizer_id_past_vocab_size': ('hf', TOKENIZER_JSON, _add_far_token(9000),
                                     ['ids up to 9000', f'vocab_size={VOCAB}']),
    'tokenizer_config_fifo': ('hf', TOKENIZER_CONFIG, _fifo, ['not a regular file']),
    'tokenizer_config_dev_zero': ('hf', TOKENIZER_CONFIG, _dev_zero, ['not a regular file']),
    'tokenizer_config_nested': ('hf', TOKENIZER_CONFIG, _nested('bos_token'), ['nested']),
    'tokenizer_config_bos_not_text': ('hf', TOKENIZER_CONFIG, _edit_json(lambda c: c.__setitem__('bos_token', 5)),
                                      ['bos_token', 'a string']),
    'config_json_fifo': ('hf', 'config.json', _fifo, ['not a regular file']),
    'config_json_dev_zero': ('hf', 'config.json', _dev_zero, ['not a regular file']),
    'config_json_nested': ('hf', 'config.json', _nested('model_type'), ['nested']),
    'config_json_huge': ('hf', 'config.json', _sparse, ['larger than']),
    'safetensors_header_nested': ('hf', 'model.safetensors', _safetensors_header(b'{"x": %s%s}' % (
        b'[' * DEEP, b']' * DEEP)), ['nested']),
    'safetensors_header_huge': ('hf', 'model.safetensors', _sparse_safetensors, ['header of', 'at most']),
    'safetensors_fifo': ('hf', 'model.safetensors', _fifo, ['not a regular file']),
    'index_nested': ('hf', hf.INDEX_FILE, _nested_index, ['nested']),
    'run_manifest_fifo': ('run', 'checkpoints/1/checksums.process_0.json', _fifo, ['not a regular file']),
    'run_manifest_nested': ('run', 'checkpoints/1/checksums.process_0.json', _nested('files'), ['nested']),
    'run_tokenizer_record_fifo': ('run', RECORD, _fifo, ['not a regular file']),
    'run_tokenizer_record_dev_zero': ('run', RECORD, _dev_zero, ['not a regular file']),
    'run_tokenizer_record_nested': ('run', RECORD, _nested('chat_format'), ['nested']),
    'run_tokenizer_larger_than_vocab_size': ('run_small_vocab', f'{checkpoint.TOKENIZER_DIR}/tokenizer.model',
                                             lambda p: None,
                                             ['ids up to 7999', 'vocab_size=64']),
}


def _copy(pristine, which: str, tmp_path: pathlib.Path) -> pathlib.Path:
  path = tmp_path / which
  shutil.copytree(pristine[which], path, symlinks=True)
  return path


@pytest.mark.fast
@pytest.mark.parametrize('case', HOSTILE_FILES)
def test_a_hostile_checkpoint_file_is_one_error_naming_it(case, pristine, tmp_path):
  which, name, damage, fragments = HOSTILE_FILES[case]
  path = _copy(pristine, which, tmp_path)
  target = path / name
  damage(target)
  with _deadline(), pytest.raises(errors.UserError) as raised:
    luckystar.load(path)
  message = str(raised.value)
  assert '\n' not in message and len(message) < 600, message
  assert str(target) in message, message
  for fragment in fragments:
    assert fragment in message, message
  if which.endswith('small_vocab'):
    return   # the directory itself disagrees; nothing to repair
  # Nothing else was touched: the file put back, the directory loads as it did.
  target.unlink()
  if (pristine[which] / name).exists():
    shutil.copyfile(pristine[which] / name, target)
  want = luckystar.load(pristine[which])
  got = luckystar.load(path)
  assert got.config == want.config and got.tokenizer.fingerprint == want.tokenizer.fingerprint
  assert jax.tree.all(jax.tree.map(np.array_equal, got.params, want.params))


@pytest.mark.fast
def test_an_index_or_config_that_is_a_link_to_a_regular_file_still_loads(pristine, tmp_path):
  """The refusals above leave alone what is fine: a Hugging Face cache links every file to a blob."""
  path = _copy(pristine, 'hf', tmp_path)
  for name in ('config.json', TOKENIZER_JSON, TOKENIZER_CONFIG, 'model.safetensors'):
    (path / name).rename(tmp_path / f'blob-{name}')
    (path / name).symlink_to(tmp_path / f'blob-{name}')
  assert luckystar.load(path).tokenizer.vocab_size == 8000


# ---- faults while writing the workdir, in process ---------------------------------------------------------

@contextlib.contextmanager
def _file_size_limit(limit: int):
  """Writes past `limit` bytes fail with EFBIG, as on a disk that filled up (SIGXFSZ ignored, as a run
  that must report the error would)."""
  previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  previous = resource.getrlimit(resource.RLIMIT_FSIZE)
  resource.setrlimit(resource.RLIMIT_FSIZE, (limit, previous[1]))
  try:
    yield
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, previous)
    signal.signal(signal.SIGXFSZ, previous_handler)


def _can_make_read_only(tmp_path: pathlib.Path) -> bool:
  probe = tmp_path / 'probe'
  probe.mkdir()
  if os.geteuid() != 0:
    return True
  return subprocess.run(['chattr', '+i', str(probe)], capture_output=True).returncode == 0 and not subprocess.run(
      ['chattr', '-i', str(probe)], capture_output=True).returncode


@contextlib.contextmanager
def _read_only(path: pathlib.Path):
  """`path` refuses writes, root's included: chattr +i (chmod does not stop root), chmod otherwise."""
  if os.geteuid() == 0:
    subprocess.run(['chattr', '+i', str(path)], check=True)
  else:
    path.chmod(0o555 if path.is_dir() else 0o444)
  try:
    yield
  finally:
    if os.geteuid() == 0:
      subprocess.run(['chattr', '-i', str(path)], check=True)
    else:
      path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture
def read_only(tmp_path):
  if not _can_make_read_only(tmp_path):
    pytest.skip('chattr +i is not supported here (an overlay or tmpfs filesystem) and root ignores chmod')
  return _read_only


def _one_line_naming(error: BaseException, path: pathlib.Path, *fragments: str) -> str:
  message = str(error)
  assert isinstance(error, errors.UserError), repr(error)
  assert '\n' not in message and str(path) in message, message
  for fragment in fragments:
    assert fragment in message, message
  return message


def _two_rows(workdir: pathlib.Path) -> metrics.Writer:
  writer = metrics.Writer(workdir)
  writer.write(0, {'eval/loss': 2.0})
  writer.write(1, {'train/loss': 1.5})
  return writer


@pytest.mark.fast
def test_metrics_on_a_full_disk_is_one_error_and_keeps_the_rows(tmp_path):
  """metrics.jsonl cannot grow (real ENOSPC: /dev/full takes the append): the rows before stay readable."""
  writer = _two_rows(tmp_path)
  kept = (tmp_path / metrics.METRICS_FILE).read_text()
  (tmp_path / 'kept.jsonl').write_text(kept)
  (tmp_path / metrics.METRICS_FILE).unlink()
  (tmp_path / metrics.METRICS_FILE).symlink_to('/dev/full')
  with pytest.raises(Exception) as raised:
    writer.write(2, {'train/loss': 1.0})
  writer.close()
  _one_line_naming(raised.value, tmp_path / metrics.METRICS_FILE, 'No space left on device')
  (tmp_path / metrics.METRICS_FILE).unlink()
  (tmp_path / 'kept.jsonl').rename(tmp_path / metrics.METRICS_FILE)
  assert [row['step'] for row in metrics.read(tmp_path)] == [0, 1]


@pytest.mark.fast
def test_tensorboard_events_on_a_full_disk_is_one_error_naming_the_file(tmp_path):
  writer = _two_rows(tmp_path)
  events = next(tmp_path.glob('events.out.tfevents.*'))
  with _file_size_limit(events.stat().st_size), pytest.raises(Exception) as raised:
    for step in range(2, 40):   # however the events are buffered, they reach the file within a few rows
      writer.write(step, {'train/loss': 1.0, 'train/other': 2.0})
    writer.close()
  _one_line_naming(raised.value, events, 'File too large')
  assert [row['step'] for row in metrics.read(tmp_path)][:2] == [0, 1]


@pytest.mark.fast
def test_a_read_only_metrics_file_is_one_error_naming_it(tmp_path, read_only):
  writer = _two_rows(tmp_path)
  with read_only(tmp_path / metrics.METRICS_FILE), pytest.raises(Exception) as raised:
    writer.write(2, {'train/loss': 1.0})
  writer.close()
  _one_line_naming(raised.value, tmp_path / metrics.METRICS_FILE, 'make it writable')
  assert [row['step'] for row in metrics.read(tmp_path)] == [0, 1]


@pytest.mark.fast
def test_the_summary_figure_on_a_full_disk_keeps_the_previous_one(tmp_path):
  _two_rows(tmp_path).close()
  [figure] = metrics.plot(tmp_path, ('train/loss', 'eval/loss'))
  before = figure.read_bytes()
  with _file_size_limit(1000), pytest.raises(Exception) as raised:
    metrics.plot(tmp_path, ('train/loss', 'eval/loss'))
  _one_line_naming(raised.value, figure, 'File too large')
  assert figure.read_bytes() == before and sorted(p.name for p in figure.parent.iterdir()) == [figure.name]


@pytest.mark.fast
def test_config_json_on_a_full_disk_keeps_the_saved_config(tmp_path):
  """main writes config.json first; a full disk there (real ENOSPC) leaves the saved one whole and no temporary
  file behind."""
  config = config_lib.from_file('configs/sft.py', 'smoke')
  config_lib.save(config, tmp_path)
  saved = (tmp_path / 'config.json').read_text()
  (tmp_path / 'config.json.tmp').symlink_to('/dev/full')
  with config.unlocked():
    config.total_steps = 8
  with pytest.raises(Exception) as raised:
    config_lib.save(config, tmp_path)
  _one_line_naming(raised.value, tmp_path / 'config.json', 'No space left on device', 'free space')
  assert (tmp_path / 'config.json').read_text() == saved
  assert sorted(p.name for p in tmp_path.iterdir()) == ['config.json']


@pytest.mark.fast
def test_a_read_only_workdir_stops_the_tokenizer_record_in_one_line(tmp_path, read_only):
  checkpoint.save_tokenizer(tmp_path, tokenizer_lib.default())
  before = {p.name: p.read_bytes() for p in (tmp_path / checkpoint.TOKENIZER_DIR).iterdir()}
  with read_only(tmp_path / checkpoint.TOKENIZER_DIR), pytest.raises(Exception) as raised:
    checkpoint.save_tokenizer(tmp_path, tokenizer_lib.default())
  _one_line_naming(raised.value, tmp_path / checkpoint.TOKENIZER_DIR, 'Operation not permitted'
                   if os.geteuid() == 0 else 'Permission denied')
  assert {p.name: p.read_bytes() for p in (tmp_path / checkpoint.TOKENIZER_DIR).iterdir()} == before


@pytest.mark.fast
def test_a_save_into_a_read_only_checkpoints_dir_fails_at_once_and_keeps_the_last_step(pristine, tmp_path,
                                                                                       read_only):
  """orbax made step directories in the background, where a refused mkdir left it waiting 5 minutes; now the
  save stops at once, and the next save, with permission back, completes."""
  workdir = _copy(pristine, 'run', tmp_path)
  loaded = luckystar.load(workdir)
  params = loaded.params
  state = state_lib.TrainState(step=np.int32(2), params=params, opt_state={}, rng=np.zeros(2, np.uint32),
                               skipped_updates=np.int32(0))
  iterator = iter(grain.MapDataset.range(4).to_iter_dataset())
  checkpoints = checkpoint.manager(workdir, keep=1)
  with _deadline(), read_only(workdir / 'checkpoints'), pytest.raises(Exception) as raised:
    checkpoint.save(checkpoints, state, iterator, loaded.config)
  _one_line_naming(raised.value, workdir / 'checkpoints', 'make it writable')
  assert checkpoint.latest_step(workdir) == 1 and sorted(p.name for p in (workdir / 'checkpoints').iterdir()) == ['1']
  checkpoint.save(checkpoints, state, iterator, loaded.config)
  checkpoint.wait_until_saved(checkpoints)
  checkpoints.close()
  assert checkpoint.latest_step(workdir) == 2
  assert jax.tree.all(jax.tree.map(np.array_equal, checkpoint.load_params(workdir)[1], params))


# ---- faults while saving checkpoints, end to end -------------------------------------------------------------

SMOKE = 'configs/sft.py:smoke'   # 4 steps, a checkpoint every 2
ONE_KEPT = ('--config.keep_checkpoints=1',)   # orbax must not drop step 2 before step 4 is whole
# `python -m luckystar.main`, with a full disk from the second checkpoint save on: the first one completes.
_FULL_AFTER_FIRST_SAVE = textwrap.dedent('''
    import resource, signal, sys
    from absl import app
    from luckystar import main
    from luckystar.engine import checkpoint
    real_save, saves = checkpoint.save, []
    def save(*args, **kwargs):
      saves.append(1)
      if len(saves) == 2:
        args[0].wait_until_finished()   # the first save is whole before the disk fills, however slow the machine
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
      return real_save(*args, **kwargs)
    checkpoint.save = save
    sys.argv = ['luckystar.main', *sys.argv[1:]]
    app.run(main.main, flags_parser=main.parse_flags)
''')


def _start(workdir, cache, code=None):
  """`python -m luckystar.main` on the smoke config, or `python -c code` with its arguments."""
  if code is None:
    return main_runs.start(SMOKE, workdir, cache_dir=cache, overrides=ONE_KEPT)
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'} | {
      'JAX_COMPILATION_CACHE_DIR': str(cache), 'PYTHONHASHSEED': '0'}   # as main_runs.start runs it
  return subprocess.Popen([sys.executable, '-c', code, f'--config={SMOKE}', f'--workdir={workdir}', *ONE_KEPT],
                          cwd=main_runs.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


LOG_LINE = re.compile(r'^[IWEF]\d{4} ')          # absl's log lines on stderr
PROGRESS_BAR = re.compile(r'^\s*\d+%\|')           # tqdm's


def _printed(stderr: str) -> list[str]:
  """stderr without absl's log lines and the progress bar: what the user reads."""
  return [line for line in stderr.splitlines()
          if line.strip() and not LOG_LINE.match(line) and not PROGRESS_BAR.match(line)]


def _assert_one_error_line(code: int, stderr: str, *fragments: str) -> str:
  printed = _printed(stderr)
  assert code not in (0, None) and code > 0, stderr[-3000:]
  for noise in ('Traceback', 'sys.meta_path', 'Exception ignored', 'never awaited', 'Timeout waiting'):
    assert noise not in stderr, stderr[-3000:]
  assert not [line for line in stderr.splitlines() if line[:1] in 'EF' and LOG_LINE.match(line)], stderr[-3000:]
  assert len(printed) == 1 and printed[0].startswith('error: '), printed
  for fragment in fragments:
    assert fragment in printed[0], printed[0]
  return printed[0]


@pytest.fixture(scope='module')
def faulted_runs(tmp_path_factory):
  """One smoke workdir taken through a full disk at the step-4 save, then a read-only checkpoints/ at the
  resumed run's step-4 save, then a run with room and permission again."""
  root = tmp_path_factory.mktemp('faults')
  workdir, cache, runs = root / 'run', root / 'jax_cache', {}
  code, stdout, stderr = main_runs.outputs(_start(workdir, cache, code=_FULL_AFTER_FIRST_SAVE), timeout=300)
  runs['disk_full'] = dict(code=code, stderr=stderr, checkpoints=sorted(p.name for p in (workdir / 'checkpoints').iterdir()),
                           steps=main_runs.steps(workdir))
  if _can_make_read_only(root):
    with _read_only(workdir / 'checkpoints'):
      code, stdout, stderr = main_runs.outputs(_start(workdir, cache), timeout=300)
    runs['read_only'] = dict(code=code, stderr=stderr, steps=main_runs.steps(workdir),
                             checkpoints=sorted(p.name for p in (workdir / 'checkpoints').iterdir()))
  code, stdout, stderr = main_runs.outputs(_start(workdir, cache), timeout=300)
  runs['resumed'] = dict(code=code, stderr=stderr, stdout=stdout)
  runs['workdir'] = workdir
  return runs


def test_a_full_disk_during_a_checkpoint_save_is_one_error_and_keeps_the_last_checkpoint(faulted_runs):
  run, checkpoints = faulted_runs['disk_full'], faulted_runs['workdir'] / 'checkpoints'
  line = _assert_one_error_line(run['code'], run['stderr'], str(checkpoints), 'File too large',
                                'resumes from step 2')
  assert run['checkpoints'] == ['2'], (run['checkpoints'], line)   # step 2 kept, no partial step 4 left
  assert run['steps'] == [0, 1, 2, 3, 4]


def test_a_read_only_checkpoints_dir_is_one_error_and_keeps_the_last_checkpoint(faulted_runs):
  if 'read_only' not in faulted_runs:
    pytest.skip('chattr +i is not supported here and root ignores chmod')
  run, checkpoints = faulted_runs['read_only'], faulted_runs['workdir'] / 'checkpoints'
  _assert_one_error_line(run['code'], run['stderr'], str(checkpoints),
                         'Operation not permitted' if os.geteuid() == 0 else 'Permission denied',
                         'resumes from step 2')
  assert 'resumed from' in run['stderr'] and run['checkpoints'] == ['2']
  assert run['steps'] == [0, 1, 2, 3, 4]


def test_after_the_faults_a_re_run_resumes_from_the_kept_checkpoint_and_finishes(faulted_runs):
  run, workdir = faulted_runs['resumed'], faulted_runs['workdir']
  assert run['code'] == 0, run['stderr'][-3000:]
  assert f'resumed from {workdir / "checkpoints"} at step 2' in run['stderr']
  assert sorted(p.name for p in (workdir / 'checkpoints').iterdir()) == ['4']
  assert main_runs.steps(workdir) == [0, 1, 2, 3, 4]
  assert checkpoint.load_params(workdir)[0] is not None
