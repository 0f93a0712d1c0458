"""Can a bundled model learn to copy a word out of its prompt? (The cold start's blocker, issue 5.)

    python experiments/copy_probe.py                       # tiny-base, 1200 steps, ~15 min on 2 CPU cores
    python experiments/copy_probe.py --model=tiny-sft --steps=400

(with luckystar installed, `pip install -e .`, or PYTHONPATH=. from the repository root)

Fine-tunes the model on one task, `Repeat: <made-up word>` → `It is <word>`, where the word is new in
every row (Latin or Hangul syllables drawn at random), so only copying lowers the loss. The word
follows a space in both places, so its tokens are the same in the prompt and in the reply: nothing but
attention to the prompt is needed. Every 100 steps it reports, teacher-forced on 128 held-out words,
the share of words whose every token is the argmax (exact) and the share of word tokens that are.
Also reports how often an NL2SQL value is spelled in other tokens in the gold SQL than in the question
(`'X'` after a quote vs ` X` after a space), a second obstacle the copy probe leaves out.
Writes experiments/copy_probe.md.

The probe keeps its own few-line loop (plain AdamW, teacher-forced scores of raw arrays every 100 steps) on
purpose: it is the fixed instrument the reports' numbers come from. The same drill as a training stage, on the
project's optimizer and loop, is `experiments/cold_start_pipeline.py:copy_plain` (its numbers are in
copy_probe.md's later notes).
"""

import argparse
import pathlib
import random
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import luckystar
from luckystar import model
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import suites
from luckystar.engine import logprobs

from cold_start_data import copy_messages, made_up_word   # experiments/cold_start_data.py: the copy drill

ROOT = pathlib.Path(__file__).resolve().parents[1]
REPORT = ROOT / 'experiments' / 'copy_probe.md'
SEQ_LEN, BATCH, HELDOUT = 96, 16, 128


def batch(tokenizer, words: list[str]) -> dict[str, np.ndarray]:
  """Rendered `Repeat: w` → `It is w` rows, [len(words), SEQ_LEN]; 'word' marks the targets that are the
  word's own tokens (between `It is` and the end-of-response tokens)."""
  rows = {k: np.zeros((len(words), SEQ_LEN), np.int32) for k in ('tokens', 'loss_mask', 'segment_ids', 'word')}
  rows['positions'] = np.broadcast_to(np.arange(SEQ_LEN, dtype=np.int32), (len(words), SEQ_LEN)).copy()
  prefix = len(tokenizer.encode('It is'))
  for i, word in enumerate(words):
    ids, mask = tokenizer.render(copy_messages(word), 'concise')
    rows['tokens'][i, :len(ids)], rows['loss_mask'][i, :len(ids)], rows['segment_ids'][i, :len(ids)] = ids, mask, 1
    first = mask.index(1) + 1 + prefix  # past the response's opening token and 'It is'
    rows['word'][i, first:len(ids) - 2] = 1  # the last two are the end-of-response and end-of-turn tokens
  return rows


def scores(config, params, rows) -> tuple[float, float]:
  """(exact, token accuracy) of the word's tokens, teacher-forced."""
  logits = model.apply(config, params, rows['tokens'], rows['positions'], rows['segment_ids'])
  right = np.asarray(jnp.argmax(logits[:, :-1], -1)) == rows['tokens'][:, 1:]
  word = rows['word'][:, 1:].astype(bool)
  return float(np.mean([r[w].all() for r, w in zip(right, word)])), float(right[word].mean())


def spelled_apart(seed: int = 0) -> tuple[int, int]:
  """(values whose tokens in the gold SQL differ from their tokens in the question, text values) over the
  NL2SQL train split."""
  tokenizer = tokenizer_lib.default()
  contains = lambda hay, needle: any(hay[i:i + len(needle)] == needle for i in range(len(hay) - len(needle) + 1))
  apart = total = 0
  for example in suites.load('nl2sql', 'train', seed=seed):
    question, sql = tokenizer.encode(example.prompt), tokenizer.encode(example.answer)
    for value in example.meta['values']:
      if value.isdigit():
        continue
      total += 1
      apart += not any(contains(question, tokenizer.encode(form)) and contains(sql, tokenizer.encode(form))
                       for form in (value, ' ' + value))
  return apart, total


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--model', default='tiny-base')
  parser.add_argument('--steps', type=int, default=1200)
  parser.add_argument('--learning_rate', type=float, default=1e-3)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  start = time.time()
  loaded = luckystar.load(args.model)
  config, params, tokenizer = loaded.config, loaded.params, loaded.tokenizer
  rng = random.Random(args.seed)
  heldout = batch(tokenizer, [made_up_word(rng) for _ in range(HELDOUT)])
  warmup = min(20, args.steps // 2)
  optimizer = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, args.learning_rate, warmup, args.steps),
                          weight_decay=0.1)

  @jax.jit
  def update(params, opt_state, rows):
    grads, aux = jax.grad(lambda p: logprobs.token_cross_entropy(p, rows, None, model_config=config), has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, aux['loss']

  opt_state, curve, loss = optimizer.init(params), [], float('nan')
  for step in range(args.steps + 1):
    if step % 100 == 0 or step == args.steps:
      curve.append((step, loss, *scores(config, params, heldout)))
      print(f'step {step}: train loss {loss:.3f}, exact {curve[-1][2]:.1%}, word tokens {curve[-1][3]:.1%}',
            flush=True)
    if step < args.steps:
      train = batch(tokenizer, [made_up_word(rng) for _ in range(BATCH)])
      params, opt_state, loss = update(params, opt_state, {k: v for k, v in train.items() if k != 'word'})
      loss = float(loss)
  apart, total = spelled_apart(args.seed)
  lines = [
      '# Copy probe: can the bundled model copy a word out of its prompt?', '',
      f'Written by `python experiments/copy_probe.py --model={args.model} --steps={args.steps}`, seed {args.seed}; '
      f'{(time.time() - start) / 60:.1f} min on this machine. Task: `Repeat: <made-up word>` → `It is <word>`, a new '
      f'word every row, batch {BATCH}, AdamW at {args.learning_rate} ({warmup} warmup steps, cosine); the word has the '
      f'same tokens in prompt and reply. Held-out: {HELDOUT} new words, teacher-forced.', '',
      '| step | train loss | exact % | word tokens right % |', '|---|---|---|---|']
  lines += [f'| {s} | {l:.3f} | {100 * e:.1f} | {100 * t:.1f} |' for s, l, e, t in curve]
  lines += ['', f'NL2SQL values (train split, text values) spelled in other tokens in the gold SQL than in the '
            f'question: {apart} of {total} ({100 * apart / total:.0f}%).', '']
  REPORT.write_text('\n'.join(lines))
  print(f'wrote {REPORT}')


if __name__ == '__main__':
  main()
