"""experiments/cold_start_data.py's sources through the library's registry (`luckystar.data.sources`), and the
cold-start pipeline config that uses them (experiments/cold_start_pipeline.py)."""

import pathlib
import sqlite3

import ml_collections
import numpy as np
import pytest

from luckystar import config as config_lib
from luckystar import errors
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import conversations, nl2sql, sources, suites
from luckystar.data.examples import rs_only
from luckystar.stages import pipeline as reproduce
from luckystar.engine import curriculum
from luckystar.stages import rlvr
from luckystar.stages import sft
from luckystar.tools import sql as sql_tool

import cold_start_data

PIPELINE = pathlib.Path(cold_start_data.__file__).with_name('cold_start_pipeline.py')


@pytest.fixture(scope='module')
def tok():
  return tokenizer_lib.default()


@pytest.mark.fast
def test_the_experiment_registers_its_drills_and_rl_only_prompts():
  assert set(cold_start_data.DRILL_SOURCES) <= set(sources.sft_names())
  assert set(cold_start_data.RL_ONLY_SOURCES) <= set(sources.prompt_names())


def test_rl_only_databases_have_the_training_schema_and_share_no_question(tmp_path):
  """RL-only NL2SQL (`cold_start_data.rl_suite`): the training wording with rows of their own, split 'train', and
  no question text of a student split or of the teacher's suite."""
  nl2sql.build_databases(tmp_path)
  rl = cold_start_data.rl_suite(tmp_path, count=2)
  assert rl == cold_start_data.rl_suite(tmp_path, count=2) and {e.split for e in rl} == {'train'}
  assert {e.language for e in rl} == {'en', 'ko'}
  assert {e.meta['db_id'] for e in rl} == {f'{d}_r{k}' for d in nl2sql.DOMAINS for k in range(2)}
  taken = {e.prompt for e in suites.load('nl2sql', db_dir=tmp_path)} | {
      e.prompt for e in nl2sql.teacher_suite(tmp_path)}
  assert not {e.prompt for e in rl} & taken
  train = nl2sql.build_databases(tmp_path)['hr_0']
  own = next(e.meta['db_path'] for e in rl if e.meta['db_id'] == 'hr_r1')
  assert sql_tool.schema(own) == sql_tool.schema(train)
  staff = lambda path: {row[0] for row in sqlite3.connect(path).execute('SELECT name FROM employees')}
  assert len(staff(own) & staff(train)) < len(staff(own)) // 10
  for e in rl[::20]:
    with sqlite3.connect(e.meta['db_path']) as conn:
      conn.execute(e.answer).fetchall()


def test_rl_only_prompts_join_rls_pool_never_its_eval_set():
  """`config.rlvr.sources='bundled:nl2sql,bundled:nl2sql_rl_only_1'`: RL-only prompts join RL's train pool after the training
  databases' own, never the held-out set reserved from it, and change the selection cache's fingerprint."""
  config = ml_collections.ConfigDict(dict(seed=0, init_from='tiny-sft', sampling=dict(temperature=1.0), rlvr=dict(
      sources='bundled:nl2sql', max_prompt_tokens=384, selection_prompts={'nl2sql': 48}, selection_samples=8,
      select_pass_rate=(0.125, 0.875), eval_prompts=96, eval_split='train')))
  tok = tokenizer_lib.default()
  pool, _ = curriculum.prompt_pool(config.rlvr, 'train', tok, seed=0)
  heldout, _ = curriculum.reserve_eval(config, tok, pool)
  fingerprint = curriculum._fingerprint(config, tokenizer_lib.default())
  config.rlvr.sources = 'bundled:nl2sql,bundled:nl2sql_rl_only_1'
  bigger, _ = curriculum.prompt_pool(config.rlvr, 'train', tok, seed=0)
  rl_ids = {e.id for e in cold_start_data.rl_only(1)}
  rl_only = [e for e in bigger if e.id in rl_ids]
  assert rl_only and bigger == pool + rl_only and not {e.id for e in pool} & rl_ids
  assert not {e.prompt for e in rl_only} & {e.prompt for e in suites.load('nl2sql') if rs_only(e, 0)}
  same_heldout, bigger_rest = curriculum.reserve_eval(config, tok, bigger)
  assert same_heldout == heldout                                   # the eval set stays on the training databases
  fresh = [e for e in rl_only if e.answer not in {h.answer for h in heldout}]
  assert fresh and [e for e in bigger_rest if e.id in rl_ids] == fresh
  assert curriculum._fingerprint(config, tokenizer_lib.default()) != fingerprint   # other RL-only databases


@pytest.mark.parametrize('split', ['train', 'heldout'])
@pytest.mark.parametrize('variant', ['teacher', None])   # the teacher's data and the student's conversations
def test_the_copy_drill_is_a_mixture_source_rendered_only_when_weighed(tok, monkeypatch, split, variant):
  """The registered 'copy' (the quoted drill) beside the teacher's or the student's sources, as the cold-start
  teacher takes it at 0.1."""
  own = ({'reasoning': [{'tokens': np.ones(3, np.int32)}], 'concise': []}, dict(conversations.DEFAULT_WEIGHTS))
  monkeypatch.setattr(conversations, 'teacher_sources', lambda *a, **k: (dict(own[0]), dict(own[1])))
  monkeypatch.setattr(conversations, 'sft_sources', lambda *a, **k: (dict(own[0]), dict(own[1])))
  config = config_lib.from_file('configs/sft.py', variant)
  raw, weights, _ = sft.sources(config, split, tokenizer=tok, vocab_size=tok.vocab_size)
  assert 'bundled:copy/copy' not in raw                             # no library config names it
  config.sft.sources += ',bundled:copy@0.1'
  raw, weights, _ = sft.sources(config, split, tokenizer=tok, vocab_size=tok.vocab_size)
  data = 'teacher' if variant else 'conversations'
  assert weights == {f'bundled:{data}/reasoning': 0.8, f'bundled:{data}/concise': 0.2, 'bundled:copy/copy': 0.1}
  assert len(raw['bundled:copy/copy']) == cold_start_data.COPY_COUNTS[split]
  drills, _ = cold_start_data.copy_sources(tok, split=split, count=4, drill=cold_start_data.DRILL_SOURCES['copy'])
  assert all(np.array_equal(a['tokens'], b['tokens']) for a, b in zip(raw['bundled:copy/copy'], drills['copy']))


@pytest.mark.fast
def test_each_drill_is_sft_data_of_its_own_name(tok):
  for name, drill in cold_start_data.DRILL_SOURCES.items():
    config = config_lib.from_file(PIPELINE, name)
    assert (config.stage, config.sft.sources) == ('sft', f'bundled:{name}')
    raw, weights, _ = sft.sources(config, 'heldout', tokenizer=tok, vocab_size=tok.vocab_size)
    label = f'bundled:{name}/{name}'
    assert weights == {label: 1.0} and len(raw[label]) == cold_start_data.COPY_COUNTS['heldout']
    drills, _ = cold_start_data.copy_sources(tok, split='heldout', count=4, drill=drill)
    assert all(np.array_equal(a['tokens'], b['tokens']) for a, b in zip(raw[label], drills['copy']))


@pytest.mark.fast
def test_the_pipeline_reads_only_earlier_stages_and_names_registered_data():
  config = config_lib.from_file(PIPELINE)
  reproduce.check_order(config)
  stages = config.pipeline.stages
  assert tuple(config.pipeline.order)[:3] == ('copy', 'teacher', 'rejection_sampling')
  assert stages.teacher.sft.sources == 'bundled:teacher/reasoning@0.72,bundled:teacher/concise@0.18,bundled:copy@0.1'
  assert [stages[n].sft.sources for n in ('copy', 'student_copy', 'student_named', 'student_schema')] == [
      'bundled:copy', 'bundled:copy', 'bundled:copy_named', 'bundled:copy_schema']
  assert [s.split('@')[0] for s in stages.sft.sft.sources.split(',')] == [
      'bundled:conversations/reasoning', 'bundled:conversations/concise', 'rs_traces:', 'bundled:copy_schema']
  with pytest.raises(errors.UserError, match='cold_start_pipeline.py:fancy'):
    config_lib.from_file(PIPELINE, 'fancy')
