"""A Hugging Face repo id ('org/name', 'org/name@revision') names its snapshot in the local hub cache, offline
(issue 55): `luckystar.load`, `config.init_from` and the command line all resolve it through
`loading.resolve`; a repo not in the cache is one line naming the cache and the download command."""

import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import luckystar
from luckystar import errors
from luckystar.engine import loading
from luckystar.engine import state as state_lib

from test_bad_input import CONFIG, INT4, ROOT, _write_hf_dir

MAIN_HASH, V1_HASH = 'a' * 40, 'b' * 40


def _cache_snapshot(cache: pathlib.Path, repo: str, commit: str, source: pathlib.Path,
                    refs: tuple[str, ...] = ()) -> pathlib.Path:
  """`source`'s files as `hf download` leaves them: blobs, a snapshot of links into them, refs naming the commit."""
  repo_dir = cache / ('models--' + repo.replace('/', '--'))
  snapshot = repo_dir / 'snapshots' / commit
  snapshot.mkdir(parents=True)
  (repo_dir / 'blobs').mkdir(exist_ok=True)
  (repo_dir / 'refs').mkdir(exist_ok=True)
  for file in sorted(source.iterdir()):
    shutil.copy(file, repo_dir / 'blobs' / f'{commit}-{file.name}')
    (snapshot / file.name).symlink_to(f'../../blobs/{commit}-{file.name}')
  for ref in refs:
    (repo_dir / 'refs' / ref).write_text(commit)
  return snapshot


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
  root = tmp_path_factory.mktemp('checkpoints')
  return {'float': _write_hf_dir(root / 'float', CONFIG), 'int4': _write_hf_dir(root / 'int4', INT4)}


@pytest.fixture
def cache(tmp_path, monkeypatch, checkpoints):
  """A hub cache holding org/tiny: main is the float checkpoint, tag v1 the int4 one."""
  cache = tmp_path / 'hub'
  _cache_snapshot(cache, 'org/tiny', MAIN_HASH, checkpoints['float'], refs=('main',))
  _cache_snapshot(cache, 'org/tiny', V1_HASH, checkpoints['int4'], refs=('v1',))
  monkeypatch.setenv('HF_HUB_CACHE', str(cache))
  return cache


@pytest.mark.fast
def test_a_repo_id_loads_its_cached_snapshot_at_main_or_a_revision(cache, checkpoints):
  snapshots = cache / 'models--org--tiny' / 'snapshots'
  assert loading.resolve('org/tiny') == snapshots / MAIN_HASH
  loaded = luckystar.load('org/tiny')
  assert loaded.config == CONFIG
  want = luckystar.load(checkpoints['float']).params
  assert jax.tree.all(jax.tree.map(np.array_equal, loaded.params, want))
  assert luckystar.load('org/tiny@v1').config == INT4                # a tag
  assert loading.resolve(f'org/tiny@{V1_HASH}') == snapshots / V1_HASH   # a commit


@pytest.mark.fast
def test_config_init_from_streams_a_cached_repo(cache):
  """A training stage's `config.init_from` goes through the same resolver: its tensors are read from the snapshot."""
  initial = state_lib.initial_model('org/tiny', stream=True)
  assert initial.model_config == CONFIG
  snapshot = cache / 'models--org--tiny' / 'snapshots' / MAIN_HASH
  assert {pathlib.Path(header.file).parent for header in initial.headers.values()} == {snapshot}


@pytest.mark.fast
def test_a_repo_not_in_the_cache_is_one_line_naming_the_cache_and_the_download_command(cache):
  for name, command in (('org/missing', 'hf download org/missing'),
                        ('org/tiny@v2', 'hf download org/tiny --revision v2')):
    with pytest.raises(errors.MissingFile) as raised:
      luckystar.load(name)
    message = str(raised.value)
    assert '\n' not in message and isinstance(raised.value, FileNotFoundError), message
    assert message.startswith(f'{name}: no such bundled model or directory'), message
    assert f'Hugging Face cache {cache} ' in message and f'`{command}`' in message, message
  assert not (cache / 'models--org--missing').exists()    # looking writes nothing


@pytest.mark.fast
def test_a_bundled_name_and_an_existing_local_directory_win(cache, checkpoints, tmp_path, monkeypatch):
  assert loading.resolve('tiny-sft') == loading.BUNDLED_DIR / 'tiny-sft'
  monkeypatch.chdir(tmp_path)
  shutil.copytree(checkpoints['int4'], tmp_path / 'org' / 'tiny')    # spelled like the cached repo
  assert loading.resolve('org/tiny') == pathlib.Path('org/tiny')
  assert luckystar.load('org/tiny').config == INT4


@pytest.mark.fast
def test_the_cache_is_where_hf_download_puts_it(monkeypatch, tmp_path):
  for variable in ('HF_HUB_CACHE', 'HUGGINGFACE_HUB_CACHE', 'HF_HOME', 'XDG_CACHE_HOME'):
    monkeypatch.delenv(variable, raising=False)
  assert loading.hub_cache_dir() == pathlib.Path.home() / '.cache' / 'huggingface' / 'hub'
  monkeypatch.setenv('HF_HOME', str(tmp_path / 'home'))
  assert loading.hub_cache_dir() == tmp_path / 'home' / 'hub'
  monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'cache'))
  assert loading.hub_cache_dir() == tmp_path / 'cache'


def test_command_line_init_from_a_repo_not_in_the_cache_is_one_error_line(tmp_path):
  cache = tmp_path / 'hub'
  env = {**os.environ, 'HF_HUB_CACHE': str(cache), 'JAX_PLATFORMS': 'cpu'}   # no log line probing for a TPU
  result = subprocess.run(
      [sys.executable, '-m', 'luckystar.main', '--config=configs/sft.py:smoke', '--config.init_from=org/missing',
       f'--workdir={tmp_path / "run"}'],
      cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
  lines = result.stderr.strip().splitlines()
  assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr[-3000:]
  assert len(lines) == 1, result.stderr[-3000:]
  assert lines[0].startswith('error: org/missing: no such bundled model or directory'), lines[0]
  assert f'Hugging Face cache {cache} ' in lines[0] and '`hf download org/missing`' in lines[0], lines[0]
