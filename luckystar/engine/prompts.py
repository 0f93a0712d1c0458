"""Prompt sets: which task examples a stage samples, trains or evaluates on, chosen in one way everywhere."""

import collections
from typing import Callable, Iterable, Sequence

from luckystar.data import suites
from luckystar.data.examples import Example
from luckystar.engine import rollouts
from luckystar.tokenizer import Tokenizer


def first_per_language(examples: Iterable[Example], count: int) -> list[Example]:
  """The first `count` examples of each language, in order (0: all)."""
  if not count:
    return list(examples)
  seen, chosen = collections.Counter(), []
  for example in examples:
    if seen[example.language] < count:
      seen[example.language] += 1
      chosen.append(example)
  return chosen


def fits(tokenizer: Tokenizer, example: Example, max_prompt_tokens: int, modes: Sequence[str] = ('reasoning',)
         ) -> bool:
  """The example's rendered prompt has at most `max_prompt_tokens` tokens in every one of `modes`."""
  return all(len(rollouts.render_prompt(tokenizer, example, mode)) <= max_prompt_tokens for mode in modes)


def prompt_set(tasks: Sequence[str], split: str, *, seed: int, where: Callable[[Example], bool] | None = None,
               per_language: int = 0, tokenizer: Tokenizer | None = None, max_prompt_tokens: int = 0,
               modes: Sequence[str] = ('reasoning',)) -> list[Example]:
  """Examples of `tasks` in `split`, in suite order: those `where` keeps, the first `per_language` of each
  (task, language) (0: all), then those whose prompt fits `max_prompt_tokens` in every mode (0: no limit).
  `tokenizer` (the model's; None: the bundled one) counts the tokens."""
  chosen = []
  for task in tasks:
    chosen += first_per_language((e for e in suites.load(task, split, seed=seed, tokenizer=tokenizer)
                                  if where is None or where(e)), per_language)
  if max_prompt_tokens:
    chosen = [e for e in chosen if fits(tokenizer, e, max_prompt_tokens, modes)]
  return chosen
