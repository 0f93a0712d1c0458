"""The copy drill: experiments/copy_probe.py's rows mark exactly the copied word's tokens, and
`conversations.copy_sources` (the copy phase before the teacher) trains on replies that hold the prompt's word."""

import pathlib
import random
import sys

import numpy as np

from luckystar import tokenizer as tokenizer_lib
from luckystar.data import conversations

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / 'experiments'))
import copy_probe  # noqa: E402


def test_rows_mark_the_word_and_its_tokens_are_the_prompts():
  tokenizer = tokenizer_lib.default()
  rng = random.Random(0)
  words = [conversations.made_up_word(rng) for _ in range(32)]
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
  sources, weights = conversations.copy_sources(tokenizer, seed=0, split='heldout', count=64)
  assert weights == {'copy': 1.0} and len(sources['copy']) == 64
  words = []
  for item in sources['copy']:
    tokens, mask = item['tokens'].tolist(), item['loss_mask'].astype(bool)
    response = tokenizer.parse_assistant([t for t, m in zip(tokens, mask) if m]).response
    words.append(response.removeprefix('It is '))
    assert tokens == tokenizer.render(conversations.copy_messages(words[-1]), 'concise')[0]
  assert len(set(words)) > 60
  again, _ = conversations.copy_sources(tokenizer, seed=0, split='heldout', count=64)
  other, _ = conversations.copy_sources(tokenizer, seed=0, split='train', count=64)
  assert all(np.array_equal(a['tokens'], b['tokens']) for a, b in zip(sources['copy'], again['copy']))
  assert sum(np.array_equal(a['tokens'], b['tokens']) for a, b in zip(sources['copy'], other['copy'])) < 4
