"""SFT conversations: gold traces score full reward under our own verifiers, in both modes."""

import dataclasses

import numpy as np
import pytest

from luckystar import config as config_lib
from luckystar import errors
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import conversations, korean_mc, nl2sql, sources, suites
from luckystar.data.examples import SPLITS
from luckystar.rewards import language, reward
from luckystar.stages import sft

pytestmark = pytest.mark.fast

TASKS = ('math', 'function_calling', 'korean_mc', 'chat', 'nl2sql')


@pytest.fixture(scope='module')
def tok():
  return tokenizer_lib.default()


def _rollout(tok, example, mode):
  """Render the gold conversation, then read it back the way a rollout is read: (assistant turns,
  actions, tool results, ids, loss mask)."""
  messages = conversations.messages(example, mode)
  ids, mask = tok.render(messages, mode)
  assistant = tok.special_ids['<|ASSISTANT|>']
  starts = [i for i, t in enumerate(ids) if t == assistant]
  turns = [tok.parse_assistant(ids[s + 1:]) for s in starts]
  tool_results = [m['content'] for m in messages if m['role'] == 'tool']
  return turns, [t.action for t in turns if t.action is not None], tool_results, ids, mask


def _verdict(tok, example, mode):
  turns, actions, tool_results, _, _ = _rollout(tok, example, mode)
  return reward.score(example, turns[-1], actions, tool_results=tool_results)


@pytest.mark.parametrize('task', TASKS)
@pytest.mark.parametrize('mode', ['reasoning', 'concise'])
def test_gold_conversations_earn_full_reward(tok, task, mode, tmp_path_factory):
  examples = suites.load(task, 'train')
  # Math across the split (suites draw template by template): every template's answer form must verify.
  examples = examples[::len(examples) // 40] if task == 'math' else examples[:40:3]
  assert examples
  for example in examples:
    turns, _, _, _, mask = _rollout(tok, example, mode)
    assert (turns[0].thinking is not None) == (mode == 'reasoning'), example.id
    # Reasoning-mode math, like NL2SQL, calls its tool first and answers in the turn after the result.
    assert len(turns) == (2 if task == 'nl2sql' or conversations.uses_calculator(example, mode) else 1), example.id
    verdict = _verdict(tok, example, mode)
    assert verdict.correct and not verdict.language_mismatch, (example.id, mode, turns, verdict)   # full reward
    assert sum(mask) > 0


def test_english_nl2sql_answers_may_quote_korean_values(tok):
  """"The result is 사무용 의자." names a product the tool returned: English, full reward. Every
  English NL2SQL example of the split, since ~10% of their answers quote a Korean value."""
  examples = [e for e in suites.load('nl2sql', 'train') if e.language == 'en']
  quoting = [e for e in examples if language.detect(_rollout(tok, e, 'concise')[0][-1].response) != 'en']
  assert len(quoting) >= 10
  for example in examples:
    verdict = _verdict(tok, example, 'concise')
    assert verdict.correct and not verdict.language_mismatch, (example.id, verdict)


def test_chat_arithmetic_calls_the_calculator_in_a_fraction_of_reasoning_traces(tok):
  """Sums and hour-to-minute questions: every expression computes the answer; about
  `CHAT_TOOL_FRACTION` of the reasoning traces call the calculator (a stable choice per example),
  the rest and all concise traces answer directly, and either way the gold earns full reward."""
  examples = [e for e in suites.load('chat', 'train') if e.meta['kind'] in ('sum', 'minutes')]
  assert len(examples) > 100 and all(e.meta.get('expression') for e in examples)
  calling = [e for e in examples if conversations.uses_calculator(e, 'reasoning')]
  assert 0.2 < len(calling) / len(examples) < 0.45
  assert not any(conversations.uses_calculator(e, 'concise') for e in examples)
  assert not any(conversations.uses_calculator(e, 'reasoning', chat_tool_fraction=0.0) for e in examples)
  assert all(conversations.uses_calculator(e, 'reasoning', chat_tool_fraction=1.0) for e in examples)
  knowledge = [e for e in suites.load('chat', 'train') if 'expression' not in e.meta]
  assert knowledge and not any(conversations.uses_calculator(e, 'reasoning', chat_tool_fraction=1.0)
                               for e in knowledge)
  for example in calling[:6] + [e for e in examples if e not in calling][:6]:
    turns, actions, tool_results, _, _ = _rollout(tok, example, 'reasoning')
    assert len(turns) == (2 if example in calling else 1), example.id
    if example in calling:
      assert tool_results == [example.answer] and example.meta['expression'] in actions[0], example.id
    verdict = _verdict(tok, example, 'reasoning')
    assert verdict.correct and not verdict.language_mismatch, (example.id, verdict)


def test_tool_results_are_not_trained_on(tok):
  example = suites.load('nl2sql', 'teacher')[0]
  ids, mask = tok.render(conversations.messages(example, 'reasoning'), 'reasoning')
  tool = tok.special_ids['<|TOOL|>']
  start = ids.index(tool)
  end = ids.index(tok.end_of_turn_id, start)
  assert not any(mask[start - 1:end + 1])


def test_korean_thinking_for_the_table1_ablation(tok):
  example = next(e for e in suites.load('math', 'train') if e.language == 'ko')
  assistant = conversations.messages(example, 'reasoning', thinking_language='ko')[1]
  assert assistant['thinking'] == example.thinking_ko != example.thinking
  english = next(e for e in suites.load('math', 'train') if e.language == 'en')
  assert conversations.messages(english, 'reasoning', thinking_language='ko')[1]['thinking'] == english.thinking
  sources, _ = conversations.sft_sources(tok, reasoning_tasks=('math',), concise_tasks=(), thinking_language='ko')
  korean_trace = conversations.render_example(tok, example, 'reasoning', thinking_language='ko')['tokens']
  assert any(np.array_equal(s['tokens'], korean_trace) for s in sources['reasoning'])


def test_sft_sources_follow_the_hybrid_mixture(tok):
  sources, weights = conversations.sft_sources(tok, reasoning_tasks=('function_calling',),
                                               concise_tasks=('chat',))
  assert weights == {'reasoning': 0.8, 'concise': 0.2}
  assert len(sources['reasoning']) == len(suites.load('function_calling', 'train'))
  assert all(set(e) == {'tokens', 'loss_mask'} and len(e['tokens']) == len(e['loss_mask'])
             for e in sources['concise'])


def test_base_sources_are_concise_conversations_and_plain_text(tok):
  sources, weights = conversations.base_sources(tok, text_lines=400)
  assert set(sources) == set(weights) == {'chat', 'korean_mc', 'math', 'text'}
  # Korean MC: the suite's train questions plus more option orders of the same train sentences.
  suite = suites.load('korean_mc', 'train')
  assert len(sources['korean_mc']) > 2 * len(suite)
  base_mc = [e for e in korean_mc.suite(0, count=conversations.BASE_KOREAN_MC_DRAWS) if e.split == 'train']
  assert base_mc[:len(suite)] == suite
  sentence = lambda e: e.prompt.split('문장: ')[1].split('\n')[0]
  assert not {sentence(e) for e in base_mc} & {sentence(e) for e in suites.load('korean_mc', 'heldout')}
  reasoning_preamble = tok.encode(tokenizer_lib.PREAMBLES['reasoning'])
  thinking = tok.special_ids['<|START_THINKING|>']
  for item in sources['chat'] + sources['math']:
    ids = item['tokens'].tolist()
    assert thinking not in ids and ids[3:3 + len(reasoning_preamble)] != reasoning_preamble
  heldout, _ = conversations.base_sources(tok, text_lines=400, split='heldout')
  train_text = {tuple(d['tokens']) for d in sources['text']}
  assert heldout['text'] and not train_text & {tuple(d['tokens']) for d in heldout['text']}
  document = sources['text'][0]
  assert document['tokens'][0] == tok.bos_id and document['tokens'][-1] == tok.eos_id
  assert document['loss_mask'].tolist() == [0] + [1] * (len(document['tokens']) - 1)


@pytest.mark.parametrize('split', ['train', 'heldout'])
@pytest.mark.parametrize('variant', ['teacher', None])   # the teacher's data and the student's conversations
def test_registered_data_is_a_bundled_sft_source(tok, monkeypatch, split, variant):
  """`luckystar.data.sources`: an experiment's SFT data by name, `bundled:<name>` (each of its sources at the item's
  weight × its own) or `bundled:<name>/<source>`, beside the bundled conversations and built only when named;
  unknown names and sources are config errors that say so."""
  own = ({'reasoning': [{'tokens': np.ones(3, np.int32)}], 'concise': []}, dict(conversations.DEFAULT_WEIGHTS))
  monkeypatch.setattr(conversations, 'teacher_sources', lambda *a, **k: (dict(own[0]), dict(own[1])))
  monkeypatch.setattr(conversations, 'sft_sources', lambda *a, **k: (dict(own[0]), dict(own[1])))
  monkeypatch.setattr(sources, '_SFT', dict(sources._SFT))   # registrations end with the test
  built = []

  def drill(tokenizer, *, seed, split):
    built.append((tokenizer, seed, split))
    return ({'a': [{'tokens': np.full(2, SPLITS.index(split), np.int32)}], 'b': [{'tokens': np.zeros(1, np.int32)}]},
            {'a': 0.5, 'b': 0.5})

  sources.register_sft('drill', drill)
  assert 'drill' in sources.sft_names()
  with pytest.raises(ValueError, match='identifier'):
    sources.register_sft('a drill', drill)
  config = config_lib.from_file('configs/sft.py', variant)
  data = 'teacher' if variant else 'conversations'
  raw, weights, _ = sft.sources(config, split, tokenizer=tok, vocab_size=tok.vocab_size)
  assert weights == {f'bundled:{data}/reasoning': 0.8, f'bundled:{data}/concise': 0.2} and not built
  config.sft.sources += ',bundled:drill/a@0.1'
  raw, weights, reports = sft.sources(config, split, tokenizer=tok, vocab_size=tok.vocab_size)
  assert weights[f'bundled:drill/a'] == 0.1 and built == [(tok, 0, split)] and 'bundled:drill/b' not in raw
  assert [item['tokens'].tolist() for item in raw['bundled:drill/a']] == [[SPLITS.index(split)] * 2]
  assert [r.label for r in reports][-1] == 'bundled:drill/a'
  config.sft.sources = 'bundled:drill@2'   # the data itself: each source at 2 × its own weight
  raw, weights, _ = sft.sources(config, split, tokenizer=tok, vocab_size=tok.vocab_size)
  assert weights == {'bundled:drill/a': 1.0, 'bundled:drill/b': 1.0}
  config.sft.sources = 'bundled:drill/c'
  with pytest.raises(errors.UserError, match=r"bundled:drill/c: bundled:drill has sources \['a', 'b'\]"):
    sft.sources(config, split, tokenizer=tok, vocab_size=tok.vocab_size)
  config.sft.sources = 'bundled:drills'
  with pytest.raises(errors.UserError, match=r"bundled:drills is no SFT data; bundled: .*'conversations'.*'drill'"):
    sft.sources(config, split, tokenizer=tok, vocab_size=tok.vocab_size)


@pytest.mark.parametrize('data', ['conversations', 'teacher'])
def test_chat_tool_fraction_outside_zero_one_is_a_config_error(tok, data):
  config = config_lib.from_file('configs/sft.py')
  config.sft.sources, config.sft.chat_tool_fraction = f'bundled:{data}', 1.5
  with pytest.raises(errors.UserError, match='config.sft.chat_tool_fraction=1.5'):
    sft.sources(config, 'train', tokenizer=tok, vocab_size=tok.vocab_size)


def test_nl2sql_thinking_restates_the_question_values():
  """The query copies a question's values (a city, a name): the thinking names them first, a short copy away."""
  example = next(e for e in suites.load('nl2sql', 'teacher') if e.meta['values'])
  thinking = conversations.messages(example, 'reasoning')[2]['thinking']
  assert all(value in example.prompt and value in example.answer and value in thinking for value in example.meta['values'])
  assert all(nl2sql.spell(value) in thinking for value in example.meta['values'])
  bare = dataclasses.replace(example, meta={**example.meta, 'values': []})   # Spider/BIRD examples carry none
  assert conversations.messages(bare, 'reasoning')[2]['thinking'] == (
      'I will query the database with SQL, then answer from the result.')
