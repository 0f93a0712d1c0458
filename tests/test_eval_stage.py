"""The eval stage: BFCL gold answers score 100%, rule-verified instructions, pass@k, the stage end to end."""

import itertools
import json
import math

import pytest

from luckystar import errors
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import bfcl, champ
from luckystar.data import instruction_following
from luckystar.engine import evals
from luckystar.engine import metrics as metrics_lib
from luckystar.stages import eval as eval_run
from luckystar.rewards import function_call

START_ACTION, END_ACTION = tokenizer_lib.SECTION_TOKENS['action']
needs_bfcl = pytest.mark.skipif(not bfcl.importlib.util.find_spec(bfcl.PACKAGE),
                                reason=f'BFCL data not installed: {bfcl.INSTALL_HINT}')


def _bfcl_oracle(examples, *, wrong=False):
  """A text "model" that answers each BFCL question with its gold calls as our action JSON."""
  answers = {}
  for e in examples:
    calls = [function_call.gold_call(entry, e.meta['functions']) for entry in e.meta['ground_truth']]
    if wrong:  # one call short, or a call with no arguments: both must fail the AST check
      calls = calls[:-1] if len(calls) > 1 else [{'tool_name': calls[0]['tool_name'], 'parameters': {}}]
    answers[e.system, e.prompt] = START_ACTION + json.dumps(calls[0] if len(calls) == 1 else calls) + END_ACTION
  return lambda messages, mode: answers[messages[0]['content'], messages[-1]['content']]  # system, user


@needs_bfcl
@pytest.mark.parametrize('wrong', [False, True])
def test_bfcl_gold_answers_as_model_output_score_100_percent(wrong):
  settings = eval_run.Settings(suites=('bfcl',), modes=('concise',), bfcl_per_category=10**6,
                               max_prompt_tokens=10**6)
  examples = eval_run.suite_examples('bfcl', settings)
  assert {e.meta['category'] for e in examples} == {'simple_python', 'multiple', 'parallel'}
  assert len(examples) == sum(len(bfcl.load(c)) for c in settings.bfcl_categories)
  tok = tokenizer_lib.default()
  results = eval_run.evaluate(evals.text_respond(_bfcl_oracle(examples, wrong=wrong), tok), tok, settings,
                              progress=False)
  metrics = results['suites']['bfcl']['concise']
  expected = 0.0 if wrong else 1.0
  assert metrics['unscorable'] == 0 and metrics['examples'] == len(examples)
  for key in ('correctness', 'correctness/simple_python', 'correctness/multiple', 'correctness/parallel'):
    assert metrics[key] == expected, key


@pytest.mark.fast
def test_parse_text_reads_our_section_markers():
  thinking, response = tokenizer_lib.SECTION_TOKENS['thinking'], tokenizer_lib.SECTION_TOKENS['response']
  turn, actions = evals.parse_text(f'{thinking[0]}2+3=5{thinking[1]}{response[0]}5입니다.{response[1]}')
  assert (turn.thinking, turn.response, actions) == ('2+3=5', '5입니다.', [])
  turn, actions = evals.parse_text(f'{START_ACTION}{{"a": 1}}{END_ACTION}{START_ACTION}[]{END_ACTION}')
  assert actions == ['{"a": 1}', '[]'] and turn.response is None
  assert evals.parse_text('plain text') == (tokenizer_lib.AssistantTurn(response='plain text', ended=True), [])


@pytest.mark.fast
def test_pass_at_k_is_the_unbiased_estimator():
  for samples, correct, k in itertools.product(range(1, 7), range(7), range(1, 7)):
    if correct > samples or k > samples:
      continue
    subsets = list(itertools.combinations([1] * correct + [0] * (samples - correct), k))
    brute = sum(any(s) for s in subsets) / len(subsets)
    assert math.isclose(eval_run.pass_at_k(samples, correct, k), brute), (samples, correct, k)


@pytest.mark.fast
def test_instruction_following_rules_accept_and_reject():
  cases = {  # kind → param → (a response that follows, one that does not)
      'max_words': lambda n: ('Berlin', ' '.join(['word'] * (n + 1))),
      'json': lambda _: ('{"answer": "Berlin"}', 'answer: Berlin'),
      'bullets': lambda n: ('\n'.join(['- Berlin'] * n), '- Berlin\nBerlin'),
      'language': lambda target: ('베를린입니다.', 'It is Berlin.')[::1 if target == 'ko' else -1],
      'lowercase': lambda _: ('berlin', 'Berlin'),
      'ends_with': lambda word: (f'Berlin. {word}.', f'{word} Berlin.'),
  }
  examples = instruction_following.generate(seed=0, per_language=12)
  assert examples == instruction_following.generate(seed=0, per_language=12)
  assert {e.meta['constraint'] for e in examples} == set(instruction_following.KINDS)
  for e in examples:
    kind, param = e.meta['constraint'], e.meta['param']
    good, bad = cases[kind](param)
    assert instruction_following.follows(e, good), (e.prompt, good)
    assert not instruction_following.follows(e, bad), (e.prompt, bad)
    assert not instruction_following.follows(e, '')


@pytest.mark.skipif(not champ.available(), reason=f'CHAMP not installed: {champ.INSTALL_HINT}')
def test_champ_problems_load_as_math_examples():
  examples = champ.load()
  assert len(examples) == 270 and len({e.id for e in examples}) == 270
  assert all(e.task == 'math' and e.split == 'heldout' and e.answer for e in examples)


def test_the_eval_stage_writes_report_results_and_plots(tmp_path, capsys):
  from luckystar import config as config_lib
  config = config_lib.from_file('configs/eval.py', 'smoke')
  eval_run.run(config, str(tmp_path))
  printed = capsys.readouterr().out.splitlines()
  results = json.loads((tmp_path / 'results.json').read_text())
  report = (tmp_path / 'report.md').read_text()
  expected = set(config.eval.suites) - set(results['skipped'])
  assert set(results['suites']) == expected and expected >= {'math', 'nl2sql', 'korean_mc', 'chat',
                                                             'instruction_following'}
  for name in results['suites']:
    assert f'| {name} |' in report
    assert set(results['suites'][name]) == {'reasoning', 'concise'}
  assert 'pass_at_2' in results['suites']['math']['reasoning']
  assert 0 <= results['overall']['reasoning']['response_length'] <= 24
  for chart in ('correctness', 'response_length', 'language_mismatch', 'pass_at_k'):
    assert (tmp_path / 'plots' / f'{chart}.png').stat().st_size > 0
  row, = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert row['step'] == 0 and 'eval/chat/concise/correctness' in row
  # The printed summary: correctness per suite and mode, then where the report is.
  summary = printed[printed.index(f'eval of {config.init_from}'):]
  for name in results['suites']:
    for mode in ('reasoning', 'concise'):
      key = f'eval/{name}/{mode}/correctness'
      assert any(line.split() == [key, metrics_lib.format_value(key, row[key])] for line in summary), key
  assert any(line.split() == ['report', str(tmp_path / 'report.md')] for line in summary)


def _math_oracle(examples, *, wrong=False):
  """A text "model" answering each math problem with its gold answer (rotated by one problem: `wrong`)."""
  answers = [e.answer for e in examples]
  answers = answers[1:] + answers[:1] if wrong else answers
  by_prompt = {e.prompt: a for e, a in zip(examples, answers)}
  start, end = tokenizer_lib.SECTION_TOKENS['response']
  return lambda messages, mode: f'{start}The answer is {by_prompt[messages[-1]["content"]]}.{end}'


@pytest.mark.fast
def test_a_sampled_benchmark_averages_pass_at_1_over_samples_and_reports_pass_at_k():
  settings = eval_run.Settings(suites=('aime24',), modes=('reasoning',), samples=3, pass_k=(1, 2, 4),
                               max_examples=5)
  examples = eval_run.suite_examples('aime24', settings)
  tok = tokenizer_lib.default()
  for wrong, expected in ((False, 1.0), (True, 0.0)):
    respond = evals.text_respond(_math_oracle(examples, wrong=wrong), tok)
    metrics = eval_run.evaluate(respond, tok, settings, progress=False)['suites']['aime24']['reasoning']
    assert (metrics['examples'], metrics['samples'], metrics['pass_at_k_problems']) == (5, 3, 5)
    assert metrics['correctness'] == metrics['pass_at_1'] == metrics['pass_at_2'] == expected
    assert 'pass_at_4' not in metrics   # more than the samples drawn


@pytest.mark.fast
def test_the_paper_tables_put_each_model_in_a_column_beside_the_papers_figures():
  one = lambda correctness, score: {'suites': {'aime24': {'reasoning': {'correctness': correctness}},
                                               'mtbench': {'reasoning': {'score': score}}}}
  results = {'init_from': 'policy', **one(0.25, 6.5), 'compare': {'base': one(0.125, 5.0)}}
  lines = eval_run.paper_tables(results)
  row = lambda name: next(line for line in lines if line.startswith(f'| {name} |')).split(' | ')
  assert row('English AIME 2024')[1:5] == ['25.0', '12.5', '73.7', '13.3']
  assert row('English MT-Bench')[1:5] == ['6.50', '5.00', '8.45', '8.34']
  assert row('English MATH 500')[1:3] == ['–', '–'] and 'math500 not in config.eval.suites' in row('English MATH 500')[5]
  assert 'not public' in row('LG Agentic Eval')[5] and 'kmmlu.jsonl' in row('Korean KMMLU')[5]
  assert '`policy`' in lines[3] and '`base`' in lines[3] and 'LuckyStar 111B (paper)' in lines[3]


def test_the_paper_variant_writes_the_tables_for_two_models(tmp_path):
  """configs/eval.py:paper end to end on a problem, tiny-sft and tiny-base in one report (MT-Bench end to end:
  tests/test_mtbench.py, judged by a served model)."""
  from luckystar import config as config_lib
  config = config_lib.from_file('configs/eval.py', 'paper')
  assert {'gsm8k', 'math500', 'aime24', 'aime25', 'mtbench'} <= set(config.eval.suites)
  assert config.judge.backend == 'model' and config.judge.init_from == config.init_from
  config.eval.update(dict(suites=('gsm8k',), max_examples=1, samples=2, pass_k=(1, 2), max_new_tokens=16,
                          compare=('tiny-base',)))
  config.judge.backend = 'none'
  eval_run.run(config, str(tmp_path))
  results = json.loads((tmp_path / 'results.json').read_text())
  report = (tmp_path / 'report.md').read_text()
  assert results['suites']['gsm8k']['reasoning']['examples'] == 1
  assert set(results['compare']) == {'tiny-base'} and 'gsm8k' in results['compare']['tiny-base']['suites']
  assert 0 <= results['suites']['gsm8k']['reasoning']['correctness'] <= 1
  assert '## Paper Table 3' in report and '## Paper Table 4' in report and '`tiny-base`' in report
  gsm8k_row = next(line for line in report.splitlines() if line.startswith('| English GSM8K |')).split(' | ')
  assert all(float(cell) >= 0 for cell in gsm8k_row[1:3]) and gsm8k_row[3:5] == ['–', '–']   # not in the paper
  config.eval.suites = ('mtbench',)
  with pytest.raises(errors.UserError, match='config.judge'):   # before any model work
    eval_run.run(config, str(tmp_path / 'no-judge'))
