"""experiments/paper_report.py: each paper finding read from a `pipeline` run's stage outputs, and its command line."""

import json

import pytest

from luckystar.stages import pipeline

import paper_report

pytestmark = pytest.mark.fast



def _write_stage(workdir, name, rows=(), results=None):
  stage_dir = workdir / name
  stage_dir.mkdir()
  (stage_dir / pipeline.DONE_FILE).write_text(json.dumps({'config': {}, 'wall_s': 60.0}))
  (stage_dir / 'metrics.jsonl').write_text(''.join(json.dumps(row) + '\n' for row in rows))
  if results is not None:
    (stage_dir / 'results.json').write_text(json.dumps(results))


def _results(**suites):
  return {'suites': {name: {mode: {'correctness': value} for mode, value in modes.items()}
                     for name, modes in suites.items()}}


def _paper_run(tmp_path) -> tuple[str, ...]:
  """A pipeline workdir whose stages wrote small, hand-made outputs; the stage order (eval_int4 unfinished)."""
  mismatch = lambda values, end: [{'step': i + 1, 'train/language_mismatch': v} for i, v in enumerate(values)] + [
      {'step': 0, 'eval/language_mismatch': 0.0, 'eval/correctness': 0.2},
      {'step': len(values), 'eval/language_mismatch': end, 'eval/correctness': 0.3}]
  _write_stage(tmp_path, 'rlvr', mismatch([0.0, 0.0, 0.1, 0.0], 0.0))
  _write_stage(tmp_path, 'rlvr_no_penalty', mismatch([0.0, 0.1, 0.2, 0.3], 0.25))
  for name, zero_variance, correct, end in (('nl2sql_from_base', 1.0, 0.0, 0.0),
                                            ('nl2sql_from_sft', 0.5, 0.1, 0.1)):
    _write_stage(tmp_path, name, [
        {'step': 0, 'eval/correctness': 0.0},
        {'step': 1, 'train/zero_variance_groups': zero_variance, 'train/correctness': correct},
        {'step': 1, 'eval/correctness': end}])
    rates = {'a': 0.0, 'b': 0.0, 'c': 0.0, 'd': 0.0} if name == 'nl2sql_from_base' else {'a': 0.0, 'b': 0.25}
    (tmp_path / name / paper_report.SELECTION_FILE).write_text(json.dumps({'pass_rates': rates}))
  _write_stage(tmp_path, 'dpo', [{'step': 0, 'eval/concise/response_length': 20.0, 'eval/concise/correctness': 0.5,
                                  'eval/reasoning/response_length': 60.0, 'eval/reasoning/correctness': 0.2},
                                 {'step': 9, 'eval/concise/response_length': 12.0, 'eval/concise/correctness': 0.49,
                                  'eval/reasoning/response_length': 58.0, 'eval/reasoning/correctness': 0.19}])
  _write_stage(tmp_path, 'eval_base', results=_results(math={'reasoning': 0.1, 'concise': 0.1}, chat={'concise': 0.5}))
  _write_stage(tmp_path, 'eval_final',
               results=_results(math={'reasoning': 0.3, 'concise': 0.1}, chat={'concise': 0.45}))
  for name, korean in (('eval_sft', 0.05), ('eval_sft_korean_thinking', 0.02)):
    _write_stage(tmp_path, name, results={'suites': {'math': {'reasoning': {
        'correctness': 0.04, 'correctness/en': 0.03, 'correctness/ko': korean, 'examples': 128}}}})
  order = ('eval_sft', 'eval_sft_korean_thinking', 'rlvr', 'rlvr_no_penalty', 'nl2sql_from_base', 'nl2sql_from_sft',
           'dpo', 'eval_base', 'eval_final', 'eval_int4')   # eval_int4 never finished: its finding is left out
  return order


def test_the_report_reads_each_finding_from_the_stage_outputs(tmp_path):
  order = _paper_run(tmp_path)
  results = paper_report.report(tmp_path, order, {name: 60.0 for name in order})
  findings = {f['title'].split(':')[0]: f for f in results['findings']}
  assert sorted(findings) == ['Cold start', 'DPO for conciseness', 'Table 1', 'Table 2', 'Table 3', 'Table 4']
  assert findings['Table 1']['reproduced'] and '+3.0 points (64 Korean prompts)' in findings['Table 1']['verdict']
  penalised, free = findings['Table 2']['rows']
  assert penalised[1:5] == pytest.approx([0.0, 5.0, 0.0, 0.0]) and free[1:5] == pytest.approx([5.0, 25.0, 0.0, 25.0])
  assert findings['Table 2']['reproduced']
  cold_start = findings['Cold start']
  assert cold_start['reproduced'] and [row[1] for row in cold_start['rows']] == [100.0, 50.0]
  assert findings['DPO for conciseness']['reproduced']      # −40% length, −1 point in each mode
  assert '40.0%' in findings['DPO for conciseness']['verdict']
  assert findings['Table 3']['reproduced'] and '+20.0 points' in findings['Table 3']['verdict']
  assert not findings['Table 4']['reproduced'] and '-5.0 points' in findings['Table 4']['verdict']
  assert results['rlvr']['eval/correctness'] == (0.2, 0.3)
  paper_report.write(tmp_path, results)
  assert '| Table 4: general quality preserved | **no** |' in (tmp_path / 'report.md').read_text()
  assert (tmp_path / 'plots' / 'table2_language_mismatch.png').is_file()


def test_the_command_line_writes_the_report_of_a_pipeline_workdir(tmp_path):
  order = _paper_run(tmp_path)
  (tmp_path / 'config.json').write_text(json.dumps({'stage': 'pipeline', 'pipeline': {'order': list(order)}}))
  paper_report.main([f'--workdir={tmp_path}'])
  finished = [name for name in order if name != 'eval_int4']
  expected = paper_report.report(tmp_path, order, {name: 60.0 for name in finished})   # walls from stage_done.json
  # The same files `write` makes (NaN cells included, hence text, not parsed JSON).
  assert (tmp_path / 'report.json').read_text() == json.dumps(expected, indent=2, ensure_ascii=False) + '\n'
  report = (tmp_path / 'report.md').read_text()
  assert report == paper_report.report_markdown(expected)
  assert 'DPO for conciseness' in report and '## Stage wall times' in report
  assert (tmp_path / 'plots' / 'table2_language_mismatch.png').is_file()
  with pytest.raises(SystemExit, match='config.json: not found'):
    paper_report.main([f'--workdir={tmp_path / "nowhere"}'])

