"""The paths the docs tell a user to take, run as written: RLVR on your own math_jsonl (docs/data.md)."""

import json

import pytest

from luckystar import errors
from luckystar.data import suites
from luckystar.engine import curriculum
from luckystar.stages import rlvr

TRAIN = [{'problem': f'What is {a} + {b}?', 'answer': str(a + b)} for a, b in ((3, 4), (10, 2), (9, 9), (12, 5))]
HELD_OUT = [{'problem': 'What is 2 + 2?', 'answer': '4'}, {'question': '7 더하기 8은 얼마입니까?', 'answer': 15}]


def _jsonl(path, records):
  path.write_text(''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in records), encoding='utf-8')
  return path


def test_rlvr_on_your_own_math_jsonl_runs_as_documented(tmp_path):
  """docs/data.md's own-data command on the smoke variant: the per-task selection dict names chat, which
  these sources lack (skipped, logged), and eval_prompts=8 exceeds the 2 held-out records (capped before any
  rollout)."""
  import main_runs
  train, held_out = _jsonl(tmp_path / 'train.jsonl', TRAIN), _jsonl(tmp_path / 'test.jsonl', HELD_OUT)
  workdir = tmp_path / 'run'
  overrides = (f'--config.rlvr.sources=bundled:math,math_jsonl:{train}',
               f'--config.rlvr.eval_sources=math_jsonl:{held_out}',
               '--config.rlvr.select_pass_rate=(0.0, 1.0)')   # tiny-sft solves nearly all bundled math: keep them all
  code, stdout, stderr = main_runs.outputs(main_runs.start(
      'configs/rlvr.py:smoke', workdir, cache_dir=tmp_path / 'jax_cache', overrides=overrides))
  assert code == 0, stderr[-3000:]
  assert 'rlvr: step 3 of 3' in stdout.splitlines()
  report = json.loads((workdir / 'data_report.json').read_text())
  assert report['sources'][f'math_jsonl:{train}']['kept'] == len(TRAIN)
  capped = stderr.index('config.rlvr.eval_prompts: 8 held-out prompts wanted, but')
  assert 'evaluating on those 2' in stderr[capped:capped + 300]
  assert capped < stderr.index('prompt selection:')   # before the first rollout
  assert "names tasks ['chat'] that config.rlvr.sources does not have" in stderr
  selection = json.loads((workdir / curriculum.SELECTION_FILE).read_text())
  assert selection['summary'] and all(key.startswith('math/') for key in selection['summary'])


def rlvr_config():
  """The keys `curriculum.eval_size` reads: the held-out split of the bundled suites."""
  import ml_collections
  return ml_collections.ConfigDict({'rlvr': {'eval_sources': '', 'eval_split': 'heldout'}})


@pytest.mark.fast
def test_eval_prompts_are_capped_at_what_the_eval_sources_hold():
  config = rlvr_config()
  pool = suites.load('math', 'train')[:40]
  heldout = suites.load('math', 'heldout')[:5] + suites.load('chat', 'heldout')[:50]   # chat is not RL's
  assert curriculum.eval_size(config, 200, pool, heldout) == 5
  assert curriculum.eval_size(config, 3, pool, heldout) == 3
  english = [e for e in pool if e.language == 'en']
  assert curriculum.eval_size(config, 200, english, heldout) == sum(e.language == 'en' for e in heldout[:5])
  with pytest.raises(errors.UserError, match='config.rlvr.eval_prompts'):
    curriculum.eval_size(config, 200, pool, suites.load('chat', 'heldout'))


@pytest.mark.fast
def test_selection_dict_skips_the_tasks_the_sources_lack():
  pool = suites.load('math', 'train')[:200]
  chosen = curriculum.selection_candidates(pool, {'chat': 96, 'function_calling': 32, 'math': 10, 'nl2sql': 16}, seed=0)
  assert len(chosen) == 10 and {e.task for e in chosen} == {'math'}
  assert chosen == curriculum.selection_candidates(pool, {'math': 10}, seed=0)
  with pytest.raises(errors.UserError, match="tasks \\['math'\\] only"):
    curriculum.selection_candidates(pool, {'chat': 16}, seed=0)
