"""The copy drill: experiments/copy_probe.py's rows mark exactly the copied word's tokens, and
`cold_start_data.copy_sources` (the copy phase before the teacher) trains on replies that hold the prompt's word."""

import random
import re

import numpy as np
import pytest

from luckystar import tokenizer as tokenizer_lib
from luckystar.data import conversations, nl2sql

import cold_start_data
import copy_probe

pytestmark = pytest.mark.fast


def test_rows_mark_the_word_and_its_tokens_are_the_prompts():
  tokenizer = tokenizer_lib.default()
  rng = random.Random(0)
  words = [cold_start_data.made_up_word(rng) for _ in range(32)]
  assert len(set(words)) > 28 and any(w[0] >= '가' for w in words) and any(w[0] < 'z' for w in words)
  rows = copy_probe.batch(tokenizer, words)
  for i, word in enumerate(words):
    marked = rows['tokens'][i][rows['word'][i].astype(bool)]
    assert tokenizer.decode(marked.tolist()).strip() == word
    assert np.all(rows['loss_mask'][i][rows['word'][i].astype(bool)] == 1)  # trained on
    prompt = rows['tokens'][i][(rows['loss_mask'][i] == 0) & (rows['segment_ids'][i] == 1)].tolist()
    assert any(prompt[j:j + len(marked)] == marked.tolist() for j in range(len(prompt)))  # same tokens as the prompt's


def test_copy_sources_are_the_probes_drill_with_new_words_per_split():
  tokenizer = tokenizer_lib.default()
  sources, weights = cold_start_data.copy_sources(tokenizer, seed=0, split='heldout', count=64)
  assert weights == {'copy': 1.0} and len(sources['copy']) == 64
  words = []
  for item in sources['copy']:
    tokens, mask = item['tokens'].tolist(), item['loss_mask'].astype(bool)
    response = tokenizer.parse_assistant([t for t, m in zip(tokens, mask) if m]).response
    words.append(response.removeprefix('It is '))
    assert tokens == tokenizer.render(cold_start_data.copy_messages(words[-1]), 'concise')[0]
  assert len(set(words)) > 60
  again, _ = cold_start_data.copy_sources(tokenizer, seed=0, split='heldout', count=64)
  other, _ = cold_start_data.copy_sources(tokenizer, seed=0, split='train', count=64)
  assert all(np.array_equal(a['tokens'], b['tokens']) for a, b in zip(sources['copy'], again['copy']))
  assert sum(np.array_equal(a['tokens'], b['tokens']) for a, b in zip(sources['copy'], other['copy'])) < 4


def test_the_quoted_drill_spells_words_as_nl2sql_and_never_copies_a_student_value():
  """The teacher's drill: quoted as questions and queries quote values, in both prompt forms, half its words
  database-like values, none of them a value a student question names."""
  tokenizer = tokenizer_lib.default()
  sources, _ = cold_start_data.copy_sources(tokenizer, seed=0, split='train', count=400, drill='quoted')
  student, forms, words = cold_start_data.student_values(0), set(), []
  for item in sources['copy']:
    tokens, mask = item['tokens'].tolist(), item['loss_mask'].astype(bool)
    shown = tokenizer.parse_assistant([t for t, m in zip(tokens, mask) if m]).response.removeprefix('It is ')
    assert shown.startswith("'") and shown.endswith("'")
    words.append(word := shown[1:-1])
    form = next(f for f in (0, 1)
                if tokens == tokenizer.render(cold_start_data.copy_messages(word, f, True), 'concise')[0])
    forms.add(form)
  assert forms == {0, 1} and len(set(words)) > 390 and not student & set(words)
  made_up = lambda w: set(w) <= set(cold_start_data.HANGUL_SYLLABLES) or w.isascii() and w.isalpha()
  assert 150 < sum(not made_up(w) for w in words) < 250   # people and companies: not made of the drill's syllables
  with pytest.raises(ValueError, match="copy drill 'fancy'"):
    cold_start_data.copy_sources(tokenizer, count=1, drill='fancy')


def test_the_named_drill_thinks_the_nl2sql_traces_first_line_about_its_own_words():
  """The student's drill: reasoning mode, the thinking line an NL2SQL trace opens with, naming exactly the
  request's quoted word (and year), in both languages, never a student value."""
  tokenizer = tokenizer_lib.default()
  sources, _ = cold_start_data.copy_sources(tokenizer, seed=0, split='train', count=300, drill='named')
  student, words, languages, years = cold_start_data.student_values(0), [], set(), 0
  for item in sources['copy']:
    tokens, mask = item['tokens'].tolist(), item['loss_mask'].astype(bool)
    reply = tokenizer.parse_assistant([t for t, m in zip(tokens, mask) if m])
    request = tokenizer.decode([t for t, m in zip(tokens, mask) if not m])
    shown = reply.response.removeprefix('It is ')
    words.append(word := shown[1:-1])
    assert 'Reasoning mode' in request and shown in request, request
    year = next((y for y in range(2010, 2026) if f' {y}' in request or f'{y}년' in request), None)
    years += year is not None
    assert reply.thinking == conversations.naming([word, year] if year else [word])
    languages.add('ko' if any('가' <= c <= '힣' for c in request.replace(word, '')) else 'en')
  assert languages == {'en', 'ko'} and 70 < years < 130 and len(set(words)) > 280 and not student & set(words)
  example = next(e for e in nl2sql.suite() if e.meta['values'])
  thinking = conversations.messages(example, 'reasoning')[-3]['thinking']
  assert thinking.startswith(conversations.naming(example.meta['values']) + ' ')


def test_the_schema_drill_names_its_questions_values_behind_a_training_databases_schema():
  """The named drill behind an NL2SQL context: a training database's schema as the system text, a template's
  question naming new (never a student's) values, and the row stops at the thinking's end, trained only on
  the thinking: the trace's own `nl2sql_thinking` of exactly the question's values."""
  tokenizer = tokenizer_lib.default()
  sources, _ = cold_start_data.copy_sources(tokenizer, seed=0, split='train', count=200, drill='schema')
  student = cold_start_data.student_values(0)
  train_systems = {e.system for e in nl2sql.suite() if e.split == 'train'}
  end_thinking = tokenizer.special_ids[tokenizer_lib.SECTION_TOKENS['thinking'][1]]
  systems, languages, words = set(), set(), []
  for item in sources['copy']:
    tokens, mask = item['tokens'].tolist(), item['loss_mask'].astype(bool)
    assert tokens[-1] == end_thinking and mask[-1]
    thinking = tokenizer.parse_assistant([t for t, m in zip(tokens, mask) if m]).thinking
    prompt = tokenizer.decode([t for t, m in zip(tokens, mask) if not m])
    named = thinking.removeprefix('The question names ').split('. I will query')[0]
    assert thinking == conversations.nl2sql_thinking(None).replace('I will', f'The question names {named}. I will')
    system = next(s for s in train_systems if s in prompt)
    systems.add(system)
    question = prompt.split(system)[1]
    texts = re.findall(r"'(.+?)'(?=, |$)", named)   # a company's name may hold a comma
    assert texts and all(f"'{v}'" in question for v in texts) and not student & set(texts)
    words += texts
    languages.add('ko' if any('가' <= c <= '힣' for c in question.replace(named, '')) else 'en')
  assert len(systems) == 12 and languages == {'en', 'ko'} and len(set(words)) > 0.95 * len(words)


def test_nl2sql_questions_spell_text_values_with_the_tokens_of_the_query():
  """A question quotes a text value as the SQL literal does, so the copy into the query is token for token
  (unquoted, `▁Daegu` in the question vs `Daegu` after the query's quote: 419 of 672 values were spelled apart)."""
  apart, total = copy_probe.spelled_apart()
  assert total > 500 and apart / total < 0.02, (apart, total)   # a few values' first piece merges the quote
