"""The generated task suites by name: `suites.load('math', 'train')`."""

import functools
import pathlib

from luckystar import tokenizer as tokenizer_lib
from luckystar.data import chat, function_calling, korean_mc, math_problems, nl2sql
from luckystar.data.examples import SPLITS, TASKS, Example


_TOKENIZERS: dict[str, tokenizer_lib.Tokenizer] = {}   # fingerprint → tokenizer, for `_all`'s cache key


@functools.lru_cache(maxsize=None)
def _all(task: str, seed: int, db_dir: str | None, curate: bool, tokenizer: str) -> tuple[Example, ...]:
  if task == 'nl2sql':
    paths = nl2sql.build_databases(db_dir, seed)
    examples = nl2sql.suite(paths, seed=seed)
    return tuple(_curated(examples, _TOKENIZERS[tokenizer]) if curate else examples)
  generators = {'math': math_problems.suite, 'function_calling': function_calling.suite,
                'korean_mc': korean_mc.suite, 'chat': chat.suite}
  return tuple(generators[task](seed))


def _curated(examples: list[Example], tokenizer: tokenizer_lib.Tokenizer) -> list[Example]:
  return nl2sql.curate(examples, lambda text: len(tokenizer.encode(text)))[0]


def load(task: str, split: str | None = None, *, seed: int = 0, db_dir: str | pathlib.Path | None = None,
         curate: bool = True, tokenizer: tokenizer_lib.Tokenizer | None = None) -> list[Example]:
  """Examples of one task (all splits when `split` is None). NL2SQL databases are built on first use
  under `db_dir` (default `nl2sql.default_dir()`), and NL2SQL questions are curated
  (`nl2sql.curate`, its result-length rule counted in `tokenizer`'s tokens; default the bundled one)
  unless `curate=False`."""
  if task not in TASKS:
    raise ValueError(f'unknown task {task!r}; expected one of {TASKS}')
  if split is not None and split not in SPLITS:
    raise ValueError(f'unknown split {split!r}; expected one of {SPLITS}')
  tokenizer = tokenizer or tokenizer_lib.default()
  key = tokenizer.fingerprint if task == 'nl2sql' and curate else ''
  _TOKENIZERS.setdefault(key, tokenizer)
  examples = _all(task, seed, str(db_dir) if db_dir else None, curate, key)
  return [e for e in examples if split is None or e.split == split]
