"""experiments/copy_probe.py: the rows it trains on mark exactly the copied word's tokens."""

import pathlib
import random
import sys

import numpy as np

from luckystar import tokenizer as tokenizer_lib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / 'experiments'))
import copy_probe  # noqa: E402


def test_rows_mark_the_word_and_its_tokens_are_the_prompts():
  tokenizer = tokenizer_lib.default()
  rng = random.Random(0)
  words = [copy_probe.made_up_word(rng) for _ in range(32)]
  assert len(set(words)) > 28 and any(w[0] >= '가' for w in words) and any(w[0] < 'z' for w in words)
  rows = copy_probe.batch(tokenizer, words)
  for i, word in enumerate(words):
    marked = rows['tokens'][i][rows['word'][i].astype(bool)]
    assert tokenizer.decode(marked.tolist()).strip() == word
    assert np.all(rows['loss_mask'][i][rows['word'][i].astype(bool)] == 1)  # trained on
    prompt = rows['tokens'][i][(rows['loss_mask'][i] == 0) & (rows['segment_ids'][i] == 1)].tolist()
    assert any(prompt[j:j + len(marked)] == marked.tolist() for j in range(len(prompt)))  # same tokens as the prompt's
