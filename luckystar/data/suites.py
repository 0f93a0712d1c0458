"""The bundled task suites by name: `suites.load('math', 'train')`, any task registered in `luckystar.tasks`."""

import functools
import pathlib

from luckystar import tokenizer as tokenizer_lib
from luckystar.data.examples import SPLITS, Example
from luckystar.tasks import get


_TOKENIZERS: dict[str, tokenizer_lib.Tokenizer] = {}   # fingerprint → tokenizer, for `_all`'s cache key


@functools.lru_cache(maxsize=None)
def _all(task: str, seed: int, db_dir: str | None, curate: bool, tokenizer: str) -> tuple[Example, ...]:
  count_tokens = (lambda text: len(_TOKENIZERS[tokenizer].encode(text))) if curate else None
  return tuple(get(task).suite(seed, db_dir=db_dir, count_tokens=count_tokens))


def load(task: str, split: str | None = None, *, seed: int = 0, db_dir: str | pathlib.Path | None = None,
         curate: bool = True, tokenizer: tokenizer_lib.Tokenizer | None = None) -> list[Example]:
  """Examples of one task (all splits when `split` is None). A task that builds files (NL2SQL's databases) builds
  them on first use under `db_dir` (default: its own, `nl2sql.default_dir()`), and one curated by length (NL2SQL's
  result-length rule, `nl2sql.curate`) counts `tokenizer`'s tokens (default the bundled one) unless `curate=False`."""
  get(task)   # a ValueError naming the registered tasks
  if split is not None and split not in SPLITS:
    raise ValueError(f'unknown split {split!r}; expected one of {SPLITS}')
  tokenizer = tokenizer or tokenizer_lib.default()
  key = tokenizer.fingerprint if curate else ''
  _TOKENIZERS.setdefault(key, tokenizer)
  examples = _all(task, seed, str(db_dir) if db_dir else None, curate, key)
  return [e for e in examples if split is None or e.split == split]
