"""Rejection sampling (docs/rl.md): the keep/drop rule, the prompt sets' disjointness, the teacher's
data, the stage end to end (a scripted perfect teacher and a random one), and its trace file in SFT."""

import collections
import importlib.util
import json
import pathlib
import types

import ml_collections
import numpy as np
import pytest

from luckystar import errors
from luckystar import model
from luckystar import sampling
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import conversations, nl2sql, suites
from luckystar.data.examples import rs_only
from luckystar.rewards import reward
from luckystar.engine import curriculum
from luckystar.stages import rejection_sampling as rs
from luckystar.stages import rlvr
from luckystar.engine import loading, rollouts
from luckystar.engine import state as state_lib
from luckystar.stages import sft
from luckystar.tasks import TASKS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _config(name, arg=None):
  spec = importlib.util.spec_from_file_location(name, ROOT / 'configs' / f'{name}.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@pytest.fixture(scope='module')
def tok():
  return tokenizer_lib.default()


# ---- (a) the keep/drop rule ------------------------------------------------------------------------

EN_THINKING = 'The change is 30000 - 23100 = 6900 won.'
KO_THINKING = '거스름돈은 30000 - 23100 = 6900원입니다.'
KO_RESPONSE = '정답은 6900입니다.'
EN_RESPONSE = 'The answer is 6900.'


def _candidate(ids, thinking=EN_THINKING, response=KO_RESPONSE, correct=True, ended=True):
  return rs.Candidate(tuple(ids), thinking, response, correct, ended)


@pytest.mark.fast
def test_korean_prompts_keep_english_thinking_with_a_korean_response_once():
  candidates = [
      _candidate([1, 2, 3]),                                   # English thinking, Korean response
      _candidate([1, 2, 3]),                                   # the same ids again
      _candidate([1, 2, 4], thinking=KO_THINKING),             # Korean thinking
      _candidate([1, 2, 5], response=EN_RESPONSE),             # English response to a Korean prompt
      _candidate([1, 2, 6], thinking=None),                    # no thinking at all
      _candidate([1, 2, 7], correct=False),
      _candidate([1, 2, 8], correct=None),
      _candidate([1, 2, 9], ended=False),                      # correct, but never closed its turn
      _candidate([1, 2, 10]),                                  # another distinct correct trace
  ]
  assert rs.trace_decisions('ko', candidates) == [
      'kept', 'duplicate', 'thinking_not_english', 'response_not_korean', 'thinking_not_english', 'incorrect',
      'unscorable', 'unfinished', 'kept']


@pytest.mark.fast
def test_a_korean_response_may_list_the_english_values_its_tool_returned():
  listing = 'Wireless Mouse, Office Chair, USB Cable입니다.'
  result = 'product\nWireless Mouse\nOffice Chair\nUSB Cable\n(3 rows)'
  assert rs.trace_decisions('ko', [rs.Candidate((1,), EN_THINKING, listing, True, True),
                                   rs.Candidate((2,), EN_THINKING, listing, True, True, (result,))]) == [
      'response_not_korean', 'kept']


@pytest.mark.fast
def test_english_prompts_have_no_language_filter_but_are_deduplicated():
  candidates = [_candidate([1], thinking=KO_THINKING, response=EN_RESPONSE), _candidate([2], response=EN_RESPONSE),
                _candidate([2], response=EN_RESPONSE), _candidate([3], correct=False)]
  assert rs.trace_decisions('en', candidates) == ['kept', 'kept', 'duplicate', 'incorrect']


def _nl2sql_rollout(tok, example, first_thinking):
  """A hand-built NL2SQL rollout of the gold conversation as the tool loop records it: the action turn's
  END_OF_TURN and the tool turn are spliced in (loss 0). Returns (prompt ids, rollout, rendered ids, mask)."""
  messages = conversations.messages(example, 'reasoning')
  messages[-3] = {**messages[-3], 'thinking': first_thinking}
  ids, mask = tok.render(messages, 'reasoning')
  prompt = rollouts.render_prompt(tok, example)
  assert ids[:len(prompt)] == prompt
  continuation, generated = np.array(ids[len(prompt):]), np.array(mask[len(prompt):])
  generated[np.flatnonzero(continuation == tok.end_of_action_id) + 1] = 0  # the splice starts with END_OF_TURN
  final_start = len(continuation) - 1 - list(continuation[::-1]).index(tok.special_ids['<|ASSISTANT|>'])
  rollout = sampling.Rollout(
      token_ids=continuation.astype(np.int32), loss_mask=generated.astype(np.int32),
      logprobs=np.zeros(len(continuation), np.float32), untruncated_logprobs=np.zeros(len(continuation), np.float32),
      actions=[messages[-3]['action']], final_turn=tok.parse_assistant(continuation[final_start + 1:]),
      stop_reason='end_of_turn', thinking=first_thinking, tool_results=[messages[-2]['content']])
  return prompt, rollout, ids, mask


@pytest.mark.fast
def test_nl2sql_thinking_is_read_from_the_first_turn_and_the_trace_renders_like_sft_data(tok):
  example = next(e for e in suites.load('nl2sql', 'train') if e.language == 'ko')
  for thinking, decision in (('I will count the rows with SQL, then answer.', 'kept'),
                             ('SQL로 행을 센 다음 답하겠습니다.', 'thinking_not_english')):
    prompt, rollout, ids, mask = _nl2sql_rollout(tok, example, thinking)
    verdict = reward.score(example, rollout.final_turn, rollout.actions, tool_results=rollout.tool_results)
    assert verdict.correct, verdict
    scored = rollouts.Scored(example, rollout, verdict, float(verdict.correct))
    assert rs.candidate(scored).tool_results == tuple(rollout.tool_results)
    assert rs.trace_decisions(example.language, [rs.candidate(scored)]) == [decision]
    tokens, loss_mask = rs.trace_features(tok, prompt, rollout)
    assert tokens == ids and loss_mask == mask   # exactly what SFT renders for the same conversation


# ---- (b) the RS prompts are nobody else's ---------------------------------------------------------


def test_rs_prompts_are_disjoint_from_rlvr_heldout_and_teacher_prompts(tok):
  config = _config('rejection_sampling')
  chosen, _ = rs.rs_prompts(config)
  by_task = collections.Counter((e.task, e.language) for e in chosen)
  assert by_task[('nl2sql', 'ko')] and by_task[('nl2sql', 'en')] and by_task[('math', 'ko')]
  assert set(by_task) == {('nl2sql', 'ko'), ('nl2sql', 'en'), ('math', 'ko')}
  assert all(e.split == 'train' and rs_only(e, config.seed) for e in chosen)
  assert all(e.difficulty == 2 for e in chosen if e.task == 'math')
  assert len([e for e in chosen if e.task == 'nl2sql']) == sum(rs_only(e, 0) for e in suites.load('nl2sql', 'train'))
  texts = {e.prompt for e in chosen}
  # RLVR's own prompt pool (train split minus rs_only), every length admitted.
  pool, _ = curriculum.prompt_pool(types.SimpleNamespace(sources=config.rejection_sampling.sources,
                                                   max_prompt_tokens=10**9), 'train', tok, seed=config.seed)
  assert pool and not texts & {e.prompt for e in pool}
  for split in ('heldout', 'teacher'):
    others = {e.prompt for task in ('nl2sql', 'math') for e in suites.load(task, split)}
    assert others and not texts & others, split


# ---- (c) the teacher learns from the teacher split only ------------------------------------------


def _user_text(tok, ids):
  user = list(ids).index(tok.special_ids['<|USER|>'])
  end = list(ids).index(tok.end_of_turn_id, user)
  return tok.decode(ids[user + 1:end])


def test_teacher_sources_use_only_teacher_split_prompts(tok):
  sources, weights = conversations.teacher_sources(tok)
  assert weights == conversations.DEFAULT_WEIGHTS
  extra, _ = nl2sql.curate(nl2sql.teacher_suite(), lambda text: len(tok.encode(text)))   # its extra databases
  splits = {split: {e.prompt for task in TASKS for e in suites.load(task, split)}
            for split in ('teacher', 'train', 'heldout')}
  for mode, tasks, more in (('reasoning', ('nl2sql', 'math', 'function_calling', 'korean_mc', 'chat'), extra),
                            ('concise', conversations.CONCISE_TASKS, [])):
    assert len(sources[mode]) == sum(len(suites.load(task, 'teacher')) for task in tasks) + len(more), mode
    prompts = {_user_text(tok, item['tokens']) for item in sources[mode]}
    assert prompts <= splits['teacher'] | {e.prompt for e in more}, mode
    assert not prompts & (splits['train'] | splits['heldout']), mode
  # The teacher's NL2SQL traces run on the teacher's own databases.
  teacher_dbs = {e.meta['db_id'] for e in suites.load('nl2sql', 'teacher') + extra}
  student_dbs = {e.meta['db_id'] for split in ('train', 'heldout') for e in suites.load('nl2sql', split)}
  assert teacher_dbs and not teacher_dbs & student_dbs


# ---- (d) the stage end to end ---------------------------------------------------------------------

SCRIPTS = ('gold', 'gold', 'korean_thinking', 'wrong', 'swapped_response', 'unfinished')
EXPECTED = {'ko': ['kept', 'duplicate', 'thinking_not_english', 'incorrect', 'response_not_korean', 'unfinished'],
            'en': ['kept', 'duplicate', 'kept', 'incorrect', 'kept', 'unfinished']}
RESPONSES = {('math', 'ko'): '정답은 {}입니다.', ('math', 'en'): 'The answer is {}.',
             ('nl2sql', 'ko'): '결과는 위와 같습니다.', ('nl2sql', 'en'): 'The result is shown above.'}


def _scripted_messages(example, script, tool_fn, row):
  """The conversation a scripted teacher writes for one sample; NL2SQL tool turns come from `tool_fn`
  (the stage's real SQL sandbox), so a wrong query gets its real result."""
  messages = conversations.messages(example, 'reasoning')
  other = 'en' if example.language == 'ko' else 'ko'
  answer = example.answer if script != 'wrong' else '999999'
  if script in ('wrong', 'swapped_response'):
    response = RESPONSES[(example.task, other if script == 'swapped_response' else example.language)]
    messages[-1] = {**messages[-1], 'response': response.format(answer)}
  first = len(conversations.prompt(example))
  if script == 'korean_thinking':
    messages[first] = {**messages[first], 'thinking': '먼저 문제를 읽고 차근차근 계산하겠습니다.'}
  if example.task == 'nl2sql':
    if script == 'wrong':
      messages[first] = {**messages[first], 'action': json.dumps(
          {'tool_name': 'execute_sql', 'parameters': {'query': 'SELECT 999999'}})}
    messages[first + 1] = {'role': 'tool', 'content': '\n\n'.join(tool_fn(row, messages[first]['action']))}
  return messages


def _scripted_rollout_fn(tok, examples):
  """A stand-in for `sampling.rollout`: sample i of each prompt follows SCRIPTS[i], laid out exactly as
  the tool loop records it (generated ids loss 1; the spliced tool round trip, from END_OF_TURN, 0)."""
  by_prompt = {tuple(rollouts.render_prompt(tok, e)): e for e in examples}

  def rollout(model_config, params, tokenizer, prompts, *, tool_fn, **unused):
    del model_config, params, unused
    seen, results = collections.Counter(), []
    for row, prompt in enumerate(prompts):
      example, script = by_prompt[tuple(prompt)], SCRIPTS[seen[tuple(prompt)]]
      seen[tuple(prompt)] += 1
      messages = _scripted_messages(example, script, tool_fn, row)
      ids, mask = tokenizer.render(messages, 'reasoning')
      ids, mask = np.array(ids[len(prompt):], np.int32), np.array(mask[len(prompt):], np.int32)
      mask[np.flatnonzero(ids == tokenizer.end_of_action_id) + 1] = 0
      starts = np.flatnonzero(ids == tokenizer.special_ids['<|ASSISTANT|>'])
      final_start = starts[-1] + 1 if len(starts) else 0
      if script == 'unfinished':  # the budget ran out before END_OF_TURN
        ids, mask = ids[:-1], mask[:-1]
      results.append(sampling.Rollout(
          token_ids=ids, loss_mask=mask, logprobs=np.zeros(len(ids), np.float32),
          untruncated_logprobs=np.zeros(len(ids), np.float32),
          actions=[m['action'] for m in messages if m.get('action')],
          final_turn=tokenizer.parse_assistant(ids[final_start:]),
          stop_reason='overlong' if script == 'unfinished' else 'end_of_turn',
          thinking='\n'.join(m['thinking'] for m in messages if m.get('thinking')) or None))
    return results
  return rollout


def test_stage_keeps_verified_traces_writes_its_files_and_they_join_sft(tok, tmp_path, monkeypatch):
  config = _config('rejection_sampling', 'smoke')
  with config.unlocked():
    config.rejection_sampling.max_prompts = 3      # the first NL2SQL RS prompts are English, English, Korean
    config.rejection_sampling.math_languages = ('ko', 'en')
    config.rejection_sampling.samples_per_prompt = len(SCRIPTS)
    config.rejection_sampling.batch_size = 12   # two prompts per batch: three batches
  examples, _ = rs.rs_prompts(config)
  assert {(e.task, e.language) for e in examples} >= {('nl2sql', 'ko'), ('math', 'ko')}
  monkeypatch.setattr(sampling, 'rollout', _scripted_rollout_fn(tok, examples))
  monkeypatch.setattr(state_lib, 'load_model', lambda config, mesh=None: loading.Model(model.get('tiny'), None, tok))
  rs.run(config, str(tmp_path))

  traces = [json.loads(line) for line in (tmp_path / rs.TRACES_FILE).read_text().splitlines()]
  assert all(tuple(t) == conversations.RS_TRACE_FIELDS for t in traces)
  kept = collections.defaultdict(list)
  for trace in traces:
    kept[trace['example_id']].append(trace['sample_index'])
    assert trace['teacher'] == 'random:tiny' and trace['mode'] == 'reasoning'
  for example in examples:
    assert kept[example.id] == [i for i, d in enumerate(EXPECTED[example.language]) if d == 'kept'], example.id
  gold = {e.id: conversations.messages(e, 'reasoning') for e in examples}
  for trace in traces:
    if trace['sample_index'] == 0:   # the gold script: byte for byte what SFT renders for it
      ids, mask = tok.render(gold[trace['example_id']], 'reasoning')
      assert trace['tokens'] == ids and trace['loss_mask'] == mask

  stats = json.loads((tmp_path / rs.STATS_FILE).read_text())
  overall = stats['groups']['all']
  assert overall['prompts'] == len(examples) and overall['samples'] == len(examples) * len(SCRIPTS)
  assert overall['pass@N'] == 1.0
  assert overall['pass@1'] == pytest.approx(5 / 6)   # every script but 'wrong' is correct
  korean = sum(e.language == 'ko' for e in examples)
  assert overall['dropped_by_language_filter'] == 2 * korean
  assert overall['kept_traces'] == len(traces) and overall['kept_per_prompt_max'] == 3
  assert overall['prompts_with_kept_trace'] == len(examples)
  assert {'nl2sql/ko', 'math/ko', 'nl2sql', 'math'} <= set(stats['groups'])
  assert 'pass@6' in (tmp_path / rs.REPORT_FILE).read_text()

  # The trace file joins the student's SFT mixture (train split only).
  sft_config = _config('sft')
  label = f'rs_traces:{tmp_path / rs.TRACES_FILE}'
  with sft_config.unlocked():
    sft_config.sft.sources = f'bundled:conversations,{label}@0.1'
  monkeypatch.setattr(conversations, 'sft_sources', lambda tokenizer, *, seed, split, **_: (
      {'reasoning': [], 'concise': []}, dict(conversations.DEFAULT_WEIGHTS)))
  train, _, _ = sft.sources(sft_config, 'train', tokenizer=tok, vocab_size=tok.vocab_size)
  assert [t['tokens'].tolist() for t in train[label]] == [t['tokens'] for t in traces]
  heldout, _, _ = sft.sources(sft_config, 'heldout', tokenizer=tok, vocab_size=tok.vocab_size)
  assert label not in heldout


def test_smoke_run_with_a_random_teacher_writes_its_files_and_a_rerun_reuses_them(tmp_path, monkeypatch, capsys):
  config = _config('rejection_sampling', 'smoke')
  rs.run(config, str(tmp_path))
  printed = capsys.readouterr().out
  stats = json.loads((tmp_path / rs.STATS_FILE).read_text())
  overall = stats['groups']['all']
  # The stage ends with pass@1, pass@N, kept traces and where they are.
  title = f'rejection_sampling: {overall["prompts"]} prompts × 2 samples from {config.init_from}'
  summary = printed.splitlines()[printed.splitlines().index(title):]
  assert summary[1].split() == ['pass@1', f'{100 * overall["pass@1"]:.1f}%']
  assert summary[2].split() == ['pass@2', f'{100 * overall["pass@N"]:.1f}%']
  assert summary[3].split()[:3] == ['kept', 'traces', str(overall['kept_traces'])]
  assert ['traces', str(tmp_path / rs.TRACES_FILE)] in [line.split() for line in summary]
  assert stats['fingerprint']['samples_per_prompt'] == 2 and stats['groups']['all']['samples'] == 4
  assert set(stats['groups']['all']) >= {'pass@1', 'pass@N', 'prompts_with_kept_trace', 'kept_per_prompt_mean',
                                         'kept_per_prompt_max', 'dropped_by_language_filter'}
  assert (tmp_path / rs.TRACES_FILE).is_file() and (tmp_path / rs.REPORT_FILE).is_file()
  assert not list(tmp_path.glob('*.tmp'))
  before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

  def no_teacher(config, mesh=None):
    raise AssertionError('a finished run must not load the teacher again')
  monkeypatch.setattr(state_lib, 'load_model', no_teacher)
  rs.run(config, str(tmp_path))
  assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
  assert capsys.readouterr().out.splitlines()[-len(summary):] == summary   # a re-run prints the same summary
  with config.unlocked():
    config.rejection_sampling.samples_per_prompt = 3
  with pytest.raises(errors.UserError, match='samples_per_prompt: 2 there, 3 now'):
    rs.run(config, str(tmp_path))


# ---- (e) trace files: clear errors ------------------------------------------------------------------


@pytest.mark.fast
def test_a_bad_trace_line_is_named_by_file_and_line(tok, tmp_path):
  good = {'example_id': 'x', 'task': 'math', 'language': 'ko', 'sample_index': 0, 'teacher': 't', 'mode': 'reasoning',
          'tokens': [1, 2, 3], 'loss_mask': [0, 1, 1]}
  path = tmp_path / 'rs_traces.jsonl'
  for bad in ('{"tokens": [1, 2', json.dumps({**good, 'loss_mask': [0, 1]}),   # broken JSON; lengths differ
              json.dumps({**good, 'tokens': [1, 2, 9000]}),                       # beyond the tokenizer
              json.dumps({k: v for k, v in good.items() if k != 'tokens'}),
              json.dumps({**good, 'tokenizer': 'another0123456789'})):              # another tokenizer's ids
    path.write_text(json.dumps(good) + '\n' + bad + '\n')
    with pytest.raises(errors.UserError, match=f'{path}:2: '):
      conversations.read_rs_traces(str(path), tok)
  # A file from before traces recorded their tokenizer is the bundled one's.
  path.write_text(json.dumps(good) + '\n\n' + json.dumps({**good, 'tokenizer': tok.fingerprint}) + '\n')
  traces = conversations.read_rs_traces(str(path), tok)
  assert len(traces) == 2 and traces[0]['loss_mask'].tolist() == [0, 1, 1]

  config = _config('sft')
  with config.unlocked():
    config.sft.sources = f'bundled:conversations,rs_traces:{tmp_path / "missing.jsonl"}'
  with pytest.raises(FileNotFoundError, match='missing.jsonl: no such file'):
    sft.sources(config, 'train', tokenizer=tok, vocab_size=tok.vocab_size)


def test_traces_are_a_source_of_the_sft_mixture_with_their_own_weight(tok, tmp_path):
  trace = {'example_id': 'x', 'task': 'nl2sql', 'language': 'en', 'sample_index': 0, 'teacher': 't',
           'mode': 'reasoning', 'tokens': [1, 2, 3, 4], 'loss_mask': [0, 0, 1, 1]}
  path = tmp_path / 'rs_traces.jsonl'
  path.write_text(''.join(json.dumps({**trace, 'sample_index': i}) + '\n' for i in range(3)))
  config = _config('sft')
  with config.unlocked():
    config.sft.sources = f'bundled:conversations/reasoning@0.6,bundled:conversations/concise@0.2,rs_traces:{path}@0.2'
  plain, _ = conversations.sft_sources(tok)
  own, weights, reports = sft.sources(config, 'train', tokenizer=tok, vocab_size=tok.vocab_size)
  label = f'rs_traces:{path}'
  assert weights == {'bundled:conversations/reasoning': 0.6, 'bundled:conversations/concise': 0.2, label: 0.2}
  assert len(own[label]) == 3 and own[label][0]['tokens'].tolist() == [1, 2, 3, 4]
  assert len(own['bundled:conversations/reasoning']) == len(plain['reasoning'])
  assert reports[-1].kept == 3 and len(reports[-1].digest) == 16
  heldout, _, _ = sft.sources(config, 'heldout', tokenizer=tok, vocab_size=tok.vocab_size)
  assert label not in heldout                    # RS prompts are train prompts: never in eval
  path.write_text('')                            # rejection sampling may keep nothing: the source drops out
  own, weights, reports = sft.sources(config, 'train', tokenizer=tok, vocab_size=tok.vocab_size)
  assert label not in own and reports[-1].kept == 0
