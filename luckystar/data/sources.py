"""Named data sources that code outside the library (an experiment's module) registers at import time.

SFT data: `register_sft(name, builder)`, `builder(tokenizer, seed=, split=)` → (sources, weights) as
`conversations.sft_sources` returns them; `config.sft.data=name` trains on it, and a `config.sft.mixture` key
`name` that the chosen data lacks is all of its sources as one. RL prompts: `register_prompts(name, builder)`,
`builder(seed)` → [Example]; `config.rlvr.extra_prompts` names them to join RL's train pool. Registering a name
again replaces its builder (a module imported twice registers twice).
"""

from typing import Callable

from luckystar.data.examples import Example
from luckystar.tokenizer import Tokenizer

SftBuilder = Callable[..., tuple[dict[str, list], dict[str, float]]]
PromptBuilder = Callable[[int], list[Example]]

_SFT: dict[str, SftBuilder] = {}
_PROMPTS: dict[str, PromptBuilder] = {}


def _check(name: str) -> None:
  if not isinstance(name, str) or not name.isidentifier():  # a config.sft.mixture key must be one
    raise ValueError(f'a data source name must be an identifier, got {name!r}')


def register_sft(name: str, builder: SftBuilder) -> None:
  """SFT data `name`: `builder(tokenizer, seed=seed, split=split)` → (sources, weights)."""
  _check(name)
  _SFT[name] = builder


def register_prompts(name: str, builder: PromptBuilder) -> None:
  """RL prompts `name`: `builder(seed)` → [Example] (split 'train'; cache it if it is slow to build)."""
  _check(name)
  _PROMPTS[name] = builder


def sft_names() -> tuple[str, ...]:
  return tuple(sorted(_SFT))


def prompt_names() -> tuple[str, ...]:
  return tuple(sorted(_PROMPTS))


def sft(name: str, tokenizer: Tokenizer | None, *, seed: int, split: str
        ) -> tuple[dict[str, list], dict[str, float]]:
  """Registered SFT data `name` of `split`; KeyError if none is registered."""
  return _SFT[name](tokenizer, seed=seed, split=split)


def prompts(name: str, *, seed: int) -> list[Example]:
  """Registered RL prompts `name`; KeyError if none is registered."""
  return list(_PROMPTS[name](seed))
