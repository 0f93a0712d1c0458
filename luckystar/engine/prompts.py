"""Prompt sets: which task examples a stage samples, trains or evaluates on, chosen in one way everywhere."""

import collections
from typing import Callable, Iterable, Sequence

from luckystar import errors
from luckystar.data import sources, suites
from luckystar.data.examples import Example
from luckystar.engine import rollouts
from luckystar.tasks import TASKS
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


def from_sources(spec: str, *, key: str, split: str, seed: int, tokenizer: Tokenizer | None,
                 where: Callable[[Example], bool] | None = None, per_source: int = 0, per_language: int = 0,
                 max_prompt_tokens: int = 0, modes: Sequence[str] = ('reasoning',)
                 ) -> tuple[list[Example], list[sources.Report]]:
  """(examples, a report per source) of the verifiable prompt sources `spec` (`luckystar.data.sources`, read
  from config key `key`), source by source: a bundled suite's `split` (a registered prompt set: train only)
  filtered by `where`, or every record of a file as `split`; then the first `per_language` of each (task,
  language) and the first `per_source` of each source (0: all), and only prompts that fit `max_prompt_tokens`
  in every one of `modes` (the rest counted as dropped 'too_long')."""
  def bundled(name: str) -> list[Example]:
    if name in TASKS:
      return [e for e in suites.load(name, split, seed=seed, tokenizer=tokenizer) if where is None or where(e)]
    if name in sources.prompt_names():
      return sources.prompts(name, seed=seed) if split == 'train' else []
    raise errors.UserError(f'{key}: bundled:{name} is neither a task {tuple(TASKS)} (luckystar.tasks) nor a '
                           f'registered prompt set {sources.prompt_names()} (luckystar.data.sources)')

  chosen, reports = [], []
  for source in sources.parse(spec, key=key, formats=sources.PROMPT_FORMATS):
    examples, report = sources.prompt_examples(source, split=split, seed=seed, tokenizer=tokenizer, bundled=bundled)
    if per_language:
      examples = [e for task in dict.fromkeys(e.task for e in examples)
                  for e in first_per_language((e for e in examples if e.task == task), per_language)]
    examples = examples[:per_source or None]
    if max_prompt_tokens:
      fitting = [e for e in examples if fits(tokenizer, e, max_prompt_tokens, modes)]
      if too_long := len(examples) - len(fitting):
        report.dropped['too_long'] += too_long
      examples = fitting
    report.kept, report.questions = len(examples), [e.prompt for e in examples]
    chosen += examples
    reports.append(report)
  return chosen, reports
