"""The shipped benchmarks (docs/evaluation.md#the-papers-benchmarks): each loads offline with its digest checked,
a changed copy fails naming the file, and every math gold, answered as a model would through `text_respond`,
scores 100% under the reward's verifier while the golds rotated by one score near 0."""

import collections
import hashlib
import json
import re
import shutil

import pytest

from luckystar import errors
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import benchmarks
from luckystar.engine import evals
from luckystar.rewards import reward

SIZES = {'gsm8k': 1319, 'math500': 500, 'aime24': 30, 'aime25': 30}
MTBENCH_CATEGORIES = ('writing', 'roleplay', 'reasoning', 'math', 'coding', 'extraction', 'stem', 'humanities')
JUDGE_PROMPTS = ('single-v1', 'single-math-v1', 'single-v1-multi-turn', 'single-math-v1-multi-turn')
# Golds the math verifier cannot read (id → why), listed in docs/evaluation.md; every other gold must score.
UNREADABLE_GOLDS = {}
START_RESPONSE, END_RESPONSE = tokenizer_lib.SECTION_TOKENS['response']


@pytest.mark.fast
@pytest.mark.parametrize('name', benchmarks.MATH_SETS)
def test_each_math_set_loads_offline_in_full(name):
  examples = benchmarks.load(name)
  assert len(examples) == SIZES[name] == len({e.id for e in examples})
  assert all(e.id.startswith(f'{name}-') and e.task == 'math' and e.language == 'en' and e.split == 'heldout'
             for e in examples)
  assert all(e.prompt.strip() and e.answer.strip() and e.meta['source'] for e in examples)
  # No LaTeX lost to a JSON escape ("\frac" read as a form feed, "\triangle" as a tab); MATH has real tabs.
  assert not any(re.search(r'[\x00-\x08\x0b-\x1f]|\t(?:riangle|heta|imes|ext|o\b)', e.prompt) for e in examples)
  if name.startswith('aime'):
    assert [e.id for e in examples] == [f'{name}-{c}-{n}' for c in ('I', 'II') for n in range(1, 16)]
    assert all(re.fullmatch(r'\d{1,3}', e.answer) for e in examples)   # AIME answers are integers 0-999
  if name == 'gsm8k':
    assert all(re.fullmatch(r'-?\d+(\.\d+)?', e.answer) for e in examples)   # the number after '#### '
  if name == 'math500':
    assert {e.meta['level'] for e in examples} == {1, 2, 3, 4, 5} and len({e.meta['subject'] for e in examples}) == 7


@pytest.mark.fast
def test_mtbench_questions_and_judge_prompts():
  questions = benchmarks.mtbench()
  assert len(questions) == 80 == len({q['id'] for q in questions})
  assert collections.Counter(q['category'] for q in questions) == {c: 10 for c in MTBENCH_CATEGORIES}
  assert all(len(q['turns']) == 2 and all(t.strip() for t in q['turns']) for q in questions)
  for q in questions:   # FastChat's judge reads a reference for these three categories only
    has_reference = q['category'] in ('math', 'reasoning', 'coding')
    assert (q['reference'] is not None) == has_reference, q['id']
    assert not has_reference or (len(q['reference']) == 2 and all(q['reference']))
  prompts = benchmarks.judge_prompts()
  assert tuple(prompts) == JUDGE_PROMPTS
  assert all(p['output_format'] == '[[rating]]' and p['type'] == 'single' for p in prompts.values())
  assert '{ref_answer_1}' in prompts['single-math-v1']['prompt_template']
  assert '{answer_2}' in prompts['single-v1-multi-turn']['prompt_template']


@pytest.mark.fast
def test_sources_record_each_shipped_file_with_its_licence():
  entries = benchmarks.records()
  assert [e['name'] for e in entries] == [*benchmarks.MATH_SETS, benchmarks.MTBENCH, benchmarks.JUDGE_PROMPTS]
  shipped = {path.name for path in benchmarks.DIRECTORY.iterdir()}
  for entry in entries:
    assert hashlib.sha256((benchmarks.DIRECTORY / entry['file']).read_bytes()).hexdigest() == entry['sha256']
    assert re.fullmatch(r'[0-9a-f]{40}', entry['commit']) and entry['repository'] and entry['paths']
    assert entry['licence'].startswith(('MIT', 'Apache-2.0')) and set(entry['licence_files']) <= shipped
  listed = {e['file'] for e in entries} | {f for e in entries for f in e['licence_files']}
  assert shipped - listed == {benchmarks.SOURCES_FILE}


@pytest.fixture
def copy_of_benchmarks(tmp_path):
  directory = tmp_path / 'benchmarks'
  shutil.copytree(benchmarks.DIRECTORY, directory)
  return directory


@pytest.mark.fast
@pytest.mark.parametrize('name', ['aime24', 'gsm8k'])   # plain and gzipped
def test_a_changed_copy_fails_naming_the_file(copy_of_benchmarks, name):
  assert len(benchmarks.load(name, directory=copy_of_benchmarks)) == SIZES[name]   # an intact copy loads
  entry = next(e for e in benchmarks.records() if e['name'] == name)
  tampered = copy_of_benchmarks.parent / 'tampered'
  shutil.copytree(copy_of_benchmarks, tampered)
  path = tampered / entry['file']
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 1
  path.write_bytes(bytes(data))
  with pytest.raises(errors.InvalidFile, match=re.escape(str(path)) + r': sha256 .*reinstall luckystar'):
    benchmarks.load(name, directory=tampered)


@pytest.mark.fast
def test_a_missing_file_or_list_fails_naming_it(copy_of_benchmarks):
  (copy_of_benchmarks / 'mtbench.jsonl').unlink()
  with pytest.raises(errors.MissingFile, match=r'mtbench\.jsonl: no such .*reinstall luckystar'):
    benchmarks.mtbench(directory=copy_of_benchmarks)
  broken = copy_of_benchmarks.parent / 'broken'   # a fresh directory: the first one's list is cached
  shutil.copytree(copy_of_benchmarks, broken)
  (broken / benchmarks.SOURCES_FILE).write_text(json.dumps({'gsm8k': 'x'}))
  with pytest.raises(errors.InvalidFile, match=r'SOURCES\.json: not a list .*reinstall luckystar'):
    benchmarks.records(directory=broken)
  with pytest.raises(errors.UserError, match="'mtbench' is not a shipped math benchmark"):
    benchmarks.load('mtbench')


def _score_replies(examples, replies_by_prompt):
  """Each example answered through `text_respond` with its reply, scored by the reward: {id: correct}."""
  tok = tokenizer_lib.default()
  respond = evals.text_respond(lambda messages, mode: replies_by_prompt[messages[-1]['content']], tok)
  replies = respond(examples, 'concise')
  return {e.id: reward.score(e, r.final_turn, r.actions).correct for e, r in zip(examples, replies)}


def _boxed(answer):
  return f'{START_RESPONSE}The final answer is $\\boxed{{{answer}}}$.{END_RESPONSE}'


def test_every_gold_answer_scores_as_correct():
  examples = [e for name in benchmarks.MATH_SETS for e in benchmarks.load(name)]
  verdicts = _score_replies(examples, {e.prompt: _boxed(e.answer) for e in examples})
  unreadable = {key: value for key, value in verdicts.items() if value is not True}
  assert unreadable.keys() == UNREADABLE_GOLDS.keys(), unreadable


def test_golds_rotated_by_one_score_near_zero():
  for name in benchmarks.MATH_SETS:
    examples = benchmarks.load(name)
    rotated = [e.answer for e in examples[1:] + examples[:1]]   # each problem gets its neighbour's gold
    verdicts = _score_replies(examples, {e.prompt: _boxed(answer) for e, answer in zip(examples, rotated)})
    assert sum(v is True for v in verdicts.values()) <= 0.05 * len(examples), name
