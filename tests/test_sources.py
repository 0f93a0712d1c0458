"""Data sources in configs (`luckystar.data.sources`): every format read, checked up front and run through its
stage's smoke config; a malformed record is refused with file:line before any step."""

import json
import pathlib

import pytest

import data_files
import main_runs
from luckystar import errors
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import sources
from luckystar.engine import artifacts, checkpoint, prompts
from luckystar.stages import dpo, eval as eval_stage, rejection_sampling, rlvr, sft


@pytest.fixture(scope='module')
def files(tmp_path_factory):
  return data_files.write_all(tmp_path_factory.mktemp('data'))


@pytest.fixture(scope='module')
def tok():
  return tokenizer_lib.default()


def _prompt_sources(files) -> str:
  return f'math_jsonl:{files["math_jsonl"]},spider:{files["spider"]},bird:{files["bird"]}'


@pytest.mark.fast
def test_a_sources_string_is_parsed_and_checked_before_anything_is_read(files):
  items = sources.parse(f'bundled:math@2,math_jsonl:{files["math_jsonl"]}@0.5', key='config.x.sources')
  assert [(s.format, s.location, s.weight) for s in items] == [('bundled', 'math', 2.0),
                                                               ('math_jsonl', str(files['math_jsonl']), 0.5)]
  for spec, message in [('math:x', 'is not FORMAT:PATH'), ('bundled:math@0', 'weight must be a number > 0'),
                        ('bundled:math,,bundled:chat', 'empty item'), ('bundled:math,bundled:math', 'twice'),
                        ('math_jsonl:/nowhere.jsonl', '/nowhere.jsonl: no such file'),
                        (f'preference_jsonl:{files["preference_text"]}', 'this stage takes')]:
    with pytest.raises(errors.UserError, match=f'config.x.sources.*{message}|{message}'):
      sources.parse(spec, key='config.x.sources', formats=sources.PROMPT_FORMATS)
  with pytest.raises(errors.UserError, match='dev_databases: no such directory'):
    (files['bird'].parent / 'dev_databases').rename(files['bird'].parent / 'elsewhere')
    try:
      sources.parse(f'bird:{files["bird"]}', key='k')
    finally:
      (files['bird'].parent / 'elsewhere').rename(files['bird'].parent / 'dev_databases')
  # Fingerprints carry each file's content digest: another file content, another fingerprint.
  first = sources.fingerprint(items)
  assert first[1].startswith(f'math_jsonl:{files["math_jsonl"]}@0.5#') and first[0] == 'bundled:math@2'


@pytest.mark.fast
def test_every_prompt_format_reads_into_verifiable_examples(files, tok):
  spec = _prompt_sources(files) + f',kobalt_jsonl:{files["kobalt_jsonl"]}'
  examples, reports = prompts.from_sources(spec, key='k', split='train', seed=0, tokenizer=tok)
  by_source = {r.label.split(':')[0]: r for r in reports}
  assert [(r.kept, dict(r.dropped)) for r in reports] == [
      (4, {}), (3, {'nl2sql_empty_result': 1}), (3, {'nl2sql_empty_result': 1}), (2, {})]
  assert {e.task for e in examples} == {'math', 'nl2sql', 'korean_mc'} and {e.split for e in examples} == {'train'}
  korean = next(e for e in examples if e.prompt.startswith('5 곱하기'))
  assert (korean.language, korean.answer) == ('ko', '30')
  bird = [e for e in examples if e.id.startswith('bird:')]
  assert any('(Hint: oldest refers to MAX(age))' in e.prompt for e in bird)
  assert all(pathlib.Path(e.meta['db_path']).is_file() and 'singer' in e.system for e in bird)
  assert len({e.id for e in examples}) == len(examples)   # two files with one stem ('dev') keep their ids apart
  assert by_source['kobalt_jsonl'].kept == 2


@pytest.mark.fast
def test_chat_and_preference_records_render_as_the_chat_template_does(files, tok):
  items, report = sources.chat_conversations(sources.parse(f'chat_jsonl:{files["chat_jsonl"]}', key='k')[0], tok)
  assert report.kept == 3 and len(report.questions) == 3
  messages, mode = sources.chat_messages(data_files.CHATS[0], 'f:1')
  assert mode == 'reasoning' and messages[1] == {
      'role': 'assistant', 'thinking': 'Multiply with the calculator.',
      'action': '{"tool_name": "calculator", "parameters": {"expression": "12*7"}}'}
  ids, mask = tok.render(messages, mode)
  assert items[0]['tokens'].tolist() == ids and items[0]['loss_mask'].tolist() == mask
  assert sources.chat_messages(data_files.CHATS[1], 'f:2')[1] == 'concise'   # no thinking: concise
  for layout in ('preference_text', 'preference_messages'):
    pairs, report = sources.preference_pairs(sources.parse(f'preference_jsonl:{files[layout]}', key='k')[0], tok)
    assert report.kept == 2 and all(p['kind'] == 'preference' and p['tokenizer'] == tok.fingerprint for p in pairs)
    for pair, record in zip(pairs, getattr(data_files, layout.upper().replace('PREFERENCE', 'PREFERENCES'))):   # each side trains its reply only
      prompt = record['prompt'] if isinstance(record['prompt'], list) else [{'role': 'user', 'content': record['prompt']}]
      start = len(tok.render(prompt, pair['mode'], add_generation_prompt=True)[0])
      for side in ('chosen', 'rejected'):
        mask = pair[f'{side}_loss_mask']
        assert not any(mask[:start]) and all(mask[start:]) and pair[f'{side}_length'] == len(mask) - start
  assert [p['mode'] for p in pairs] == ['concise', 'reasoning']


@pytest.mark.fast
@pytest.mark.parametrize('form', sorted(data_files.MALFORMED))
def test_a_malformed_record_is_refused_with_file_line_and_field(tmp_path, tok, form):
  path = data_files.write_all(tmp_path)[form]
  record, field = data_files.MALFORMED[form]
  line = data_files.break_file(path, record)
  kind = {'preference_text': 'preference_jsonl', 'preference_messages': 'preference_jsonl'}.get(form, form)
  source = sources.parse(f'{kind}:{path}', key='k')[0]
  with pytest.raises(errors.UserError) as raised:
    if kind == 'chat_jsonl':
      sources.chat_conversations(source, tok)
    elif kind == 'preference_jsonl':
      sources.preference_pairs(source, tok)
    else:
      prompts.from_sources(source.label, key='k', split='train', seed=0, tokenizer=tok)
  assert str(raised.value).startswith(f'{path}:{line}: ') and field in str(raised.value)


@pytest.mark.fast
def test_the_overlap_check_matches_exact_and_normalised_questions():
  shared = sources.overlap(['What is 3 + 4?', '서울은 어디?'], ['what is 3+4 ?', 'What is 3 + 4?', 'Other'])
  assert (shared['exact'], shared['normalised']) == (1, 2)   # punctuation and spacing aside, '3+4 ?' is '3 + 4?'
  shared = sources.overlap(['What  is 3 + 4?'], ['what is 3 + 4'])
  assert (shared['exact'], shared['normalised']) == (0, 1)


# ---- the stages' smoke configs from files ----------------------------------------------------------------


def _report(workdir) -> dict:
  return json.loads((pathlib.Path(workdir) / artifacts.DATA_REPORT).read_text())


def test_sft_trains_on_a_chat_file(files, tmp_path):
  config = data_files.smoke_config('sft', **{'sft.sources': f'chat_jsonl:{files["chat_jsonl"]}@0.7,bundled:conversations/concise@0.3',
                            'sft.seq_len': 128, 'sft.eval_examples_per_source': 2, 'total_steps': 2,
                            'checkpoint_every': 2, 'eval_every': 2})
  sft.run(config, str(tmp_path))
  assert checkpoint.latest_step(tmp_path) == 2
  report = _report(tmp_path)
  assert report['sources'][f'chat_jsonl:{files["chat_jsonl"]}']['kept'] == 3
  rows = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert any('eval/loss' in row for row in rows)   # held-out: the bundled source's split


def test_rejection_sampling_rlvr_and_eval_read_prompt_files(files, tmp_path):
  config = data_files.smoke_config('rejection_sampling', **{'rejection_sampling.sources': _prompt_sources(files),
                                           'rejection_sampling.max_prompts': 2})
  rejection_sampling.run(config, str(tmp_path / 'rs'))
  stats = json.loads((tmp_path / 'rs' / rejection_sampling.STATS_FILE).read_text())
  assert stats['groups']['all']['prompts'] == 6 and {'math', 'nl2sql'} <= set(stats['groups'])
  assert all(item.split('#')[1] for item in stats['fingerprint']['sources'])   # each file's digest

  config = data_files.smoke_config('rlvr', **{'rlvr.sources': f'math_jsonl:{files["math_jsonl"]},spider:{files["spider"]}',
                             'rlvr.eval_sources': f'math_jsonl:{files["math_eval"]},bird:{files["bird"]}',
                             'rlvr.selection_prompts': {'math': 4, 'nl2sql': 3}, 'rlvr.select_pass_rate': (0.0, 1.0),
                             'rlvr.eval_prompts': 4, 'rlvr.eval_samples': 0, 'total_steps': 1, 'eval_every': 1,
                             'sampling.max_new_tokens': 24})
  rlvr.run(config, str(tmp_path / 'rlvr'))
  assert checkpoint.latest_step(tmp_path / 'rlvr') == 1
  report = _report(tmp_path / 'rlvr')
  # Shared with the eval files: a math question, and a question both NL2SQL layouts ask of their databases.
  assert report['overlap'] == {'exact': 2, 'normalised': 2,
                               'examples': ['How many singers are there?', 'What is 3 + 4?']}
  assert report['sources'][f'spider:{files["spider"]}'] == {'kept': 3, 'dropped': {'nl2sql_empty_result': 1},
                                                           'digest': sources.digest(sources.parse(
                                                               f'spider:{files["spider"]}', key='k')[0])}

  config = data_files.smoke_config('eval', **{'eval.suites': (), 'eval.modes': ('concise',), 'eval.pass_k_samples': 0,
                             'eval.sources': f'kobalt_jsonl:{files["kobalt_jsonl"]},bird:{files["bird"]},'
                                             f'math_jsonl:{files["math_eval"]}'})
  eval_stage.run(config, str(tmp_path / 'eval'))
  results = json.loads((tmp_path / 'eval' / 'results.json').read_text())
  assert set(results['suites']) == {'kobalt_jsonl:kobalt', 'bird:dev', 'math_jsonl:math_eval'}
  assert results['suites']['kobalt_jsonl:kobalt']['concise']['examples'] == 2


def test_dpo_trains_on_trl_preference_files_of_both_layouts(files, tmp_path):
  config = data_files.smoke_config('dpo', **{'dpo.sources': f'preference_jsonl:{files["preference_text"]}@0.5,'
                                           f'preference_jsonl:{files["preference_messages"]}@0.5',
                            'total_steps': 2, 'batch_size': 4})
  dpo.run(config, str(tmp_path))
  assert checkpoint.latest_step(tmp_path) == 2
  assert {label.split('/')[-1]: v['kept'] for label, v in _report(tmp_path)['sources'].items()} == {
      'preferences.jsonl': 2, 'preference_messages.jsonl': 2}


@pytest.mark.parametrize('stage,key,form', [('sft', 'sft.sources', 'chat_jsonl'),
                                            ('rlvr', 'rlvr.sources', 'math_jsonl'),
                                            ('dpo', 'dpo.sources', 'preference_text')])
def test_a_malformed_file_stops_a_stage_before_any_step_without_a_traceback(tmp_path, stage, key, form):
  path = data_files.write_all(tmp_path / 'data')[form]
  record, field = data_files.MALFORMED[form]
  line = data_files.break_file(path, record)
  kind = 'preference_jsonl' if form.startswith('preference') else form
  process = main_runs.start(f'configs/{stage}.py:smoke', tmp_path / 'run', cache_dir=tmp_path / 'cache',
                            overrides=(f'--config.{key}={kind}:{path}',))
  code, out, err = main_runs.outputs(process, timeout=300)
  assert code != 0 and f'{path}:{line}: ' in err and field in err and 'Traceback' not in err
  assert checkpoint.latest_step(tmp_path / 'run') is None and not (tmp_path / 'run' / 'metrics.jsonl').exists()
