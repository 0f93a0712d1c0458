"""Hostile input gets one line naming the path or key and what is wrong (issue 38): `luckystar.load` on
broken transformers directories, and `python -m luckystar.main` on bad flags, config files and workdirs."""

import concurrent.futures
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import luckystar
from luckystar import config as config_lib
from luckystar import errors
from luckystar import main as main_lib
from luckystar import model as model_lib
from luckystar import quant
from luckystar.interop import hf
from luckystar.model.config import ModelConfig, pattern_layer_types

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                     layer_types=pattern_layer_types(2, 2), sliding_window=8, max_position_embeddings=64)
INT4 = CONFIG.replace(quant=quant.QuantSettings('serve', 4, 8, 'float32'))


# ---- luckystar.load ---------------------------------------------------------------------------------

def _write_hf_dir(path: pathlib.Path, config: ModelConfig) -> pathlib.Path:
  """A transformers directory of `config` written from numpy alone (no model init), tensors as
  `hf.expected_tensors` lists them; test_expected_tensors_are_what_a_real_model_writes keeps that honest."""
  rng = np.random.default_rng(0)
  float_shapes = hf.expected_tensors(config.replace(quant=None))
  tensors = {}
  for name, (shape, _, kind) in hf.expected_tensors(config).items():
    if kind == 'packed':
      tensors[name] = rng.integers(-2**31, 2**31, shape, dtype=np.int64).astype(np.int32)
    elif kind == 'shape':
      tensors[name] = np.array(float_shapes[name.replace('weight_shape', 'weight')][0], np.int64)
    else:
      tensors[name] = rng.standard_normal(shape).astype(np.float32)
  path.mkdir(parents=True)
  save_file(tensors, str(path / 'model.safetensors'))
  (path / 'config.json').write_text(json.dumps(hf.config_to_hf(config)))
  return path


@pytest.fixture(scope='module')
def good_dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp('good')
  return {'float': _write_hf_dir(root / 'float', CONFIG), 'int4': _write_hf_dir(root / 'int4', INT4)}


def _edit_config(path, **changes):
  config = json.loads((path / 'config.json').read_text())
  config.update(changes)
  (path / 'config.json').write_text(json.dumps({k: v for k, v in config.items() if v != 'DELETE'}))


def _edit_tensors(path, **changes):
  tensors = load_file(str(path / 'model.safetensors'))
  tensors.update({name.replace('__', '.'): value for name, value in changes.items()})
  save_file({name: value for name, value in tensors.items() if value is not None}, str(path / 'model.safetensors'))


def _shard(path, **remap):
  """model.safetensors as two shards and an index; `remap` points index entries (tensor: file) elsewhere."""
  tensors = load_file(str(path / 'model.safetensors'))
  (path / 'model.safetensors').unlink()
  names = sorted(tensors)
  weight_map = {name: 'model-1.safetensors' if i % 2 else 'model-2.safetensors' for i, name in enumerate(names)}
  for file in set(weight_map.values()):
    save_file({n: tensors[n] for n, f in weight_map.items() if f == file}, str(path / file))
  weight_map.update({name.replace('__', '.'): file for name, file in remap.items()})
  (path / hf.INDEX_FILE).write_text(json.dumps({'metadata': {}, 'weight_map': weight_map}))


def _index_the_wrong_shard(path):
  _shard(path)
  index = json.loads((path / hf.INDEX_FILE).read_text())
  other = {'model-1.safetensors': 'model-2.safetensors', 'model-2.safetensors': 'model-1.safetensors'}
  index['weight_map']['model.norm.weight'] = other[index['weight_map']['model.norm.weight']]
  (path / hf.INDEX_FILE).write_text(json.dumps(index))


def _link_shard_outside(path):
  _shard(path)
  outside = path.parent / f'{path.name}-elsewhere.safetensors'
  (path / 'model-1.safetensors').rename(outside)
  (path / 'model-1.safetensors').symlink_to(outside)


def _cut(path, end):
  """model.safetensors cut at byte `end` (from the end if negative)."""
  (path / 'model.safetensors').write_bytes((path / 'model.safetensors').read_bytes()[:end])


HOSTILE_DIRS = {
    # case: (which good dir, how to break it, what the message must say)
    'malformed_config_json': ('float', lambda p: (p / 'config.json').write_text('{"model_type": "cohere2",'),
                              ['config.json: invalid JSON: ', '(line 1, column']),
    'config_json_not_an_object': ('float', lambda p: (p / 'config.json').write_text('[]'),
                                  ['config.json: expected a JSON object, got a JSON list']),
    'config_missing_field': ('float', lambda p: _edit_config(p, hidden_size='DELETE'),
                             ['config.json: no hidden_size (a positive integer)']),
    'config_field_of_wrong_type': ('float', lambda p: _edit_config(p, num_hidden_layers='2'),
                                   ['config.json: num_hidden_layers="2" must be a positive integer']),
    'config_layer_types_disagree': ('float', lambda p: _edit_config(p, layer_types=['full_attention']),
                                    ['config.json: layer_types has 1 entries for 2 layers']),
    'malformed_index': ('float', lambda p: (_shard(p), (p / hf.INDEX_FILE).write_text('{"weight_map": {')),
                        [f'{hf.INDEX_FILE}: invalid JSON']),
    'index_without_weight_map': ('float', lambda p: (_shard(p), (p / hf.INDEX_FILE).write_text('{"weight_map": []}')),
                                 [f'{hf.INDEX_FILE}: "weight_map" must map each tensor name']),
    'index_escapes_with_dotdot': ('float', lambda p: _shard(p, model__norm__weight='../float/model.safetensors'),
                                  ["weight_map names '../float/model.safetensors', outside"]),
    'index_names_an_absolute_path': ('float', lambda p: _shard(p, model__norm__weight='/etc/hostname'),
                                     ["weight_map names '/etc/hostname', outside"]),
    'index_names_a_link_out': ('float', _link_shard_outside, ["weight_map names 'model-1.safetensors', a link to"]),
    'index_names_a_missing_shard': ('float', lambda p: _shard(p, model__norm__weight='model-9.safetensors'),
                                    ["weight_map names 'model-9.safetensors', which is not a file in"]),
    'index_names_the_wrong_shard': ('float', _index_the_wrong_shard,
                                    ['weight_map puts model.norm.weight in model-', '.safetensors, which does not hold']),
    'truncated_safetensors': ('float', lambda p: _cut(p, -100),
                              ['model.safetensors: truncated: its header lists', 'copy or download it again']),
    'not_safetensors': ('float', lambda p: (p / 'model.safetensors').write_text('version https://git-lfs.github.com\n'),
                        ['model.safetensors: not a safetensors file (its first 8 bytes give a header of']),
    'empty_safetensors': ('float', lambda p: _cut(p, 0), ['model.safetensors: not a safetensors file (0 bytes']),
    'tensor_of_wrong_shape': ('float', lambda p: _edit_tensors(p, model__layers__0__mlp__up_proj__weight=np.zeros(
        (31, 16), np.float32)), ['model.safetensors: tensor model.layers.0.mlp.up_proj.weight has shape [31, 16]',
                                 'config.json gives intermediate_size × hidden_size = [32, 16]']),
    'vocab_size_disagrees_with_embedding': ('float', lambda p: _edit_config(p, vocab_size=100), [
        'tensor model.embed_tokens.weight has shape [64, 16]', 'gives vocab_size × hidden_size = [100, 16]']),
    'missing_tensor': ('float', lambda p: _edit_tensors(p, model__layers__1__self_attn__k_proj__weight=None),
                       ['missing tensor model.layers.1.self_attn.k_proj.weight, which', 'config.json calls for']),
    'unexpected_tensor': ('float', lambda p: _edit_tensors(p, model__rotary_emb__inv_freq=np.zeros(4, np.float32)),
                          ["unexpected tensors, e.g. ['model.rotary_emb.inv_freq']"]),
    'integer_weights': ('float', lambda p: _edit_tensors(p, model__norm__weight=np.zeros(16, np.int32)),
                        ['tensor model.norm.weight is int32; luckystar reads it as one of float64']),
    'dtype_that_cannot_be_read': ('float', lambda p: _edit_tensors(p, model__norm__weight=np.zeros(16, np.uint32)),
                                  ["tensor model.norm.weight has dtype 'U32', which luckystar cannot read"]),
    'int4_packed_weights_of_wrong_shape': ('int4', lambda p: _edit_tensors(
        p, model__layers__0__mlp__down_proj__weight_packed=np.zeros((16, 3), np.int32)), [
            'tensor model.layers.0.mlp.down_proj.weight_packed has shape [16, 3]',
            'hidden_size × intermediate_size/8 = [16, 4]']),
}


@pytest.mark.fast
@pytest.mark.parametrize('case', HOSTILE_DIRS)
def test_load_refuses_a_broken_directory_in_one_line_naming_the_path(case, good_dirs, tmp_path):
  which, damage, fragments = HOSTILE_DIRS[case]
  path = tmp_path / which
  shutil.copytree(good_dirs[which], path)
  damage(path)
  with pytest.raises(errors.UserError) as raised:
    luckystar.load(path)
  message = str(raised.value)
  assert '\n' not in message and str(path) in message, message
  for fragment in fragments:
    assert fragment in message, message


@pytest.mark.fast
def test_good_directories_load_sharded_and_from_a_hub_cache_snapshot(good_dirs, tmp_path):
  """The refusals above leave alone what is fine: an index naming its own shards, and a Hugging Face cache
  snapshot, whose files are links into the repository's blobs/ outside the snapshot directory."""
  for which, config in (('float', CONFIG), ('int4', INT4)):
    assert luckystar.load(good_dirs[which]).config == config
  sharded = tmp_path / 'sharded'
  shutil.copytree(good_dirs['float'], sharded)
  _shard(sharded)
  want = luckystar.load(good_dirs['float']).params
  got = luckystar.load(sharded).params
  assert jax.tree.all(jax.tree.map(np.array_equal, got, want))
  repo = tmp_path / 'hub' / 'models--org--tiny'
  snapshot = repo / 'snapshots' / 'abc123'
  snapshot.mkdir(parents=True)
  (repo / 'blobs').mkdir()
  for file in sorted(sharded.iterdir()):
    shutil.copy(file, repo / 'blobs' / f'sha-{file.name}')
    (snapshot / file.name).symlink_to(f'../../blobs/sha-{file.name}')
  assert jax.tree.all(jax.tree.map(np.array_equal, luckystar.load(snapshot).params, want))


@pytest.mark.fast
def test_a_missing_path_is_a_user_error_and_still_a_file_not_found_error(tmp_path):
  with pytest.raises(errors.UserError, match='no-such-dir: no such bundled model or directory') as raised:
    luckystar.load(tmp_path / 'no-such-dir')
  assert isinstance(raised.value, FileNotFoundError)


def test_expected_tensors_are_what_a_real_model_writes():
  """`hf.expected_tensors` (what loading checks against) agrees with `params_to_hf` of an initialized model,
  float, Cohere v1 with QK-norm and int4, so a correct checkpoint is never refused."""
  v1 = CONFIG.replace(layer_types=('full_attention',) * 2, rope_on_full_layers=True, use_qk_norm=True)
  for config in (CONFIG, v1):
    shapes = jax.eval_shape(model_lib.init, config, jax.random.key(0))   # the model's own param shapes
    params = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), shapes)
    written = hf.params_to_hf(params, config)
    assert {n: tuple(t.shape) for n, t in written.items()} == {
        n: shape for n, (shape, _, _) in hf.expected_tensors(config).items()}
    if config is CONFIG:
      served_config, served = quant.convert(config, params, group_size=8, scale_dtype='float32')
      written = hf.params_to_hf(served, served_config)
      assert {n: tuple(t.shape) for n, t in written.items()} == {
          n: shape for n, (shape, _, _) in hf.expected_tensors(served_config).items()}


# ---- python -m luckystar.main -------------------------------------------------------------------------

def _run(args):
  return subprocess.run([sys.executable, '-m', 'luckystar.main', *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)


def _truncated_resume_workdir(root):
  """A workdir with a checkpoint whose config.json was cut short: a re-run cannot check it resumes the same run."""
  workdir = root / 'truncated'
  (workdir / 'checkpoints' / '2').mkdir(parents=True)
  (workdir / 'config.json').write_text('{"stage": "sft", "se')
  return workdir


# case: (arguments after `python -m luckystar.main`, with {root} for a scratch directory; how stderr begins)
HOSTILE_COMMANDS = {
    'missing_config_file': (['--config={root}/no_such.py', '--workdir={root}/w'],
                            'error: {root}/no_such.py: no such config file'),
    'unknown_variant': (['--config=configs/sft.py:nosuch', '--workdir={root}/w'],   # configs/sft.py:<line>: ...
                        'error: configs/sft.py:'),
    'config_syntax_error': (['--config={root}/broken.py', '--workdir={root}/w'],
                            'error: {root}/broken.py:2: syntax error in the config file'),
    'workdir_is_a_file': (['--config=configs/sft.py:smoke', '--workdir={root}/a_file'],
                          'error: --workdir={root}/a_file: {root}/a_file is a file, not a directory'),
    'workdir_under_a_file': (['--config=configs/sft.py:smoke', '--workdir={root}/a_file/run'],
                             'error: --workdir={root}/a_file/run: {root}/a_file is a file, not a directory'),
    'workdir_not_writable': (['--config=configs/sft.py:smoke', '--workdir={root}/read_only/run'],
                             'error: --workdir={root}/read_only/run: cannot create it (Permission denied)'),
    'truncated_workdir_config_json': (['--config=configs/sft.py:smoke', '--workdir={root}/truncated'],
                                      'error: {root}/truncated/config.json: invalid JSON: Unterminated string'),
    'batch_size_zero': (['--config=configs/sft.py:smoke', '--config.batch_size=0', '--workdir={root}/w'],
                        'error: config.batch_size=0 is not an integer ≥ 1'),
    'negative_total_steps': (['--config=configs/rlvr.py:smoke', '--config.total_steps=-3', '--workdir={root}/w'],
                             'error: config.total_steps=-3 is not an integer ≥ 1'),
    'pipeline_stage_key_out_of_domain': (['--config=configs/pipeline.py:smoke', '--workdir={root}/w',
                                          '--config.pipeline.stages.rlvr.rlvr.samples_per_prompt=0'],
                                         'error: config.pipeline.stages.rlvr.rlvr.samples_per_prompt=0 is not'),
    'override_of_wrong_type': (['--config=configs/sft.py:smoke', '--config.batch_size=eight', '--workdir={root}/w'],
                               "error: flag --config.batch_size=eight: invalid literal for int()"),
}


@pytest.fixture(scope='module')
def command_results(tmp_path_factory):
  """Every HOSTILE_COMMANDS case run at once (each is mostly import time), 4 at a time."""
  root = tmp_path_factory.mktemp('cli')
  (root / 'broken.py').write_text('def get_config(arg=None):\n  return config_lib.base(\n')
  (root / 'a_file').write_text('not a directory\n')
  (root / 'read_only').mkdir(mode=0o555)
  _truncated_resume_workdir(root)
  cases = {case: [arg.format(root=root) for arg in args] for case, (args, _) in HOSTILE_COMMANDS.items()
           if case != 'workdir_not_writable' or os.geteuid() != 0}   # root may write anywhere
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    results = dict(zip(cases, pool.map(_run, cases.values())))
  return root, results


@pytest.mark.parametrize('case', HOSTILE_COMMANDS)
def test_bad_command_line_input_stops_with_one_error_line(case, command_results):
  root, results = command_results
  if case not in results:
    pytest.skip('running as root, which may write to any directory')
  result, want = results[case], HOSTILE_COMMANDS[case][1].format(root=root)
  lines = result.stderr.strip().splitlines()
  assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr[-3000:]
  # one `error:` line; a flag error adds absl's usage line
  assert len(lines) == (2 if case == 'override_of_wrong_type' else 1), result.stderr[-3000:]
  assert lines[0].startswith(want), (lines[0], want)
  if case == 'unknown_variant':
    assert 'unknown variant configs/sft.py:nosuch; expected configs/sft.py, ' in lines[0], lines[0]
  assert not (root / 'w').exists()    # refused before the workdir is made


@pytest.mark.fast
def test_every_shipped_config_is_in_its_domains():
  """config.DOMAINS refuses no config this repository ships, in any variant (the pipeline's stages included)."""
  for file in sorted((ROOT / 'configs').glob('*.py')):
    for variant in (None, 'smoke', 'base', 'teacher', 'per_channel', 'with_math'):
      try:
        config = config_lib.from_file(file, variant)
      except errors.UserError as e:
        assert 'unknown variant' in str(e), e
        continue
      config_lib.check(config)


@pytest.mark.fast
def test_check_names_every_key_out_of_its_domain():
  config = config_lib.base('dpo')
  config.batch_size, config.learning_rate, config.sampling.top_p = True, float('nan'), 0.0
  config.dpo = ml_collections.ConfigDict(dict(task_eval=dict(max_new_tokens=0), label_smoothing=0.5))
  with pytest.raises(errors.UserError) as raised:
    config_lib.check(config)
  assert str(raised.value) == (
      'config.batch_size=True is not an integer ≥ 1; config.dpo.label_smoothing=0.5 is not a number in [0, 0.5); '
      'config.dpo.task_eval.max_new_tokens=0 is not an integer ≥ 1; config.learning_rate=nan is not a number ≥ 0; '
      'config.sampling.top_p=0.0 is not a number in (0, 1]')


@pytest.mark.fast
def test_config_files_that_do_not_load_are_named_by_file_and_line(tmp_path):
  """`config.from_file` (main, the pipeline and scripts load configs with it) in process."""
  cases = {
      'missing.py': (None, 'missing.py: no such config file'),
      'syntax.py': ('def get_config(arg=None):\n  return {\n', 'syntax.py:2: syntax error in the config file'),
      'raises.py': ('def get_config(arg=None):\n  return undefined\n', "raises.py:2: NameError: name 'undefined'"),
      'variant.py': ('def get_config(arg=None):\n  raise ValueError(f"unknown variant {arg}")\n',
                     'variant.py:2: unknown variant x'),
      'no_get_config.py': ('CONFIG = 1\n', 'no_get_config.py: defines no get_config(arg)'),
      'not_a_config.py': ('def get_config(arg=None):\n  return {}\n', "get_config('x') returned dict, not a ConfigDict"),
  }
  for name, (text, want) in cases.items():
    if text is not None:
      (tmp_path / name).write_text(text)
    with pytest.raises(errors.UserError) as raised:
      config_lib.from_file(tmp_path / name, 'x')
    assert want in str(raised.value) and '\n' not in str(raised.value), (name, str(raised.value))


@pytest.mark.fast
def test_config_argument_is_found_as_absl_reads_it():
  argv = ['main', '--workdir=w', '--config', 'configs/sft.py:smoke', '--config.seed=1']
  assert main_lib._config_argument(argv) == 'configs/sft.py:smoke'
  assert main_lib._config_argument(['main', '-config=a.py', '--config=b.py:x']) == 'b.py:x'
  assert main_lib._config_argument(['main', '--config.seed=1', '--', '--config=c.py']) is None
