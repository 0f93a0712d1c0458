"""The RLVR reward as a weighted sum of named terms, chosen by `config.rlvr.reward` (docs/rl.md#reward-terms).

Each term is a pure function `(example, rollout, verdict, settings) -> float` of one finished rollout
(`sampling.Rollout`), its verdict (`rewards.reward.Verdict`) and the rollout budget (`Settings`). The default,
`correct:1,language_mismatch:-1`, is the paper's r = correctness − penalty · mismatch (eq. 1). A new term is
one function here and one line in TERMS.
"""

import dataclasses
import math
from typing import Any, Callable

from luckystar import errors

DEFAULT_REWARD = 'correct:1,language_mismatch:-1'
REWARD_KEY = 'config.rlvr.reward'
PENALTY_KEY = 'config.rlvr.language_penalty'


@dataclasses.dataclass(frozen=True)
class Settings:
  budget: int           # L_max: the most tokens of a continuation, tool turns included (config.sampling.max_new_tokens)
  overlong_cache: int   # L_cache: overlong_soft's ramp is the last this many tokens of the budget


def correct(example, rollout, verdict, settings: Settings) -> float:
  """1 when the task's verifier accepts the answer (after the format check), else 0."""
  del example, rollout, settings
  return float(verdict.correct)


def language_mismatch(example, rollout, verdict, settings: Settings) -> float:
  """1 when the response's language is not the prompt's (a Korean prompt answered in English), else 0."""
  del example, rollout, settings
  return float(verdict.language_mismatch)


def overlong_soft(example, rollout, verdict, settings: Settings) -> float:
  """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), |y| the continuation's tokens:
  0 for |y| ≤ L_max − L_cache, then ((L_max − L_cache) − |y|) / L_cache down to −1 at |y| = L_max."""
  del example, verdict
  free = settings.budget - settings.overlong_cache
  return max(-1.0, min(0.0, (free - len(rollout.token_ids)) / settings.overlong_cache))


def format_term(example, rollout, verdict, settings: Settings) -> float:
  """1 when the answer section (or, for function calling, every action's JSON) is well formed (`format_ok`)."""
  del example, rollout, settings
  return float(verdict.format_ok)


def length(example, rollout, verdict, settings: Settings) -> float:
  """Model-generated tokens (tool results excluded) / the budget, in [0, 1]: for conciseness studies."""
  del example, verdict
  return float(rollout.loss_mask.sum()) / settings.budget


TermFn = Callable[[Any, Any, Any, Settings], float]
TERMS: dict[str, TermFn] = {'correct': correct, 'language_mismatch': language_mismatch,
                            'overlong_soft': overlong_soft, 'format': format_term, 'length': length}


@dataclasses.dataclass(frozen=True)
class Reward:
  """The built reward: `weights` (term name, weight) in order; with `drop_overlong` an overlong rollout has
  no reward (out of the baseline and the loss, the paper's rule), whatever its terms say."""
  weights: tuple[tuple[str, float], ...]
  settings: Settings
  drop_overlong: bool = False

  def __call__(self, example, rollout, verdict) -> float | None:
    """None for an unscorable verdict (`correct` None) or a dropped overlong rollout, else Σ weight · term."""
    if verdict.correct is None or (self.drop_overlong and rollout.overlong):
      return None
    total = 0.0
    for name, weight in self.weights:
      total += weight * TERMS[name](example, rollout, verdict, self.settings)
    return total


def _weight(text: str) -> float | None:
  """The weight of 'term:weight', or None unless it is one finite number."""
  try:
    weight = float(text)
  except ValueError:
    return None
  return weight if math.isfinite(weight) else None


def parse(spec: str, key: str = REWARD_KEY) -> tuple[tuple[str, float], ...]:
  """'correct:1,language_mismatch:-0.5' → (('correct', 1.0), ('language_mismatch', -0.5)), or a UserError
  naming `key`, the bad item and the known terms."""
  weights = []
  for item in str(spec).split(','):
    name, _, text = (part.strip() for part in item.partition(':'))
    weight = _weight(text)
    if name not in TERMS:
      problem = f'unknown term {name!r}'
    elif name in dict(weights):
      problem = f'term {name!r} named twice'
    elif weight is None:
      problem = f'{item.strip()!r} needs a finite weight, as term:weight'
    else:
      weights.append((name, weight))
      continue
    raise errors.UserError(f'{key}={spec!r}: {problem}; expected term:weight items separated by commas, '
                           f'terms {tuple(TERMS)} (e.g. {DEFAULT_REWARD!r})')
  return tuple(weights)


def weights_of(spec: str, language_penalty: float | None = None) -> tuple[tuple[str, float], ...]:
  """`spec`'s weights with the alias applied: `language_penalty` p, when set, makes the language_mismatch
  weight −p, replacing the default reward's or added to a reward that does not name the term; beside a
  changed reward that names it, it is a conflict (a UserError naming both keys)."""
  weights = parse(spec)
  if language_penalty is None:
    return weights
  named = dict(weights)
  if 'language_mismatch' in named and weights != parse(DEFAULT_REWARD):
    raise errors.UserError(f'{PENALTY_KEY}={language_penalty!r} and {REWARD_KEY}={spec!r} both set the '
                           f'language_mismatch weight; set one of them (language_penalty p means '
                           f'language_mismatch:-p)')
  named['language_mismatch'] = -float(language_penalty)   # keeps the term's place in the sum
  return tuple(named.items())


def build(spec: str = DEFAULT_REWARD, *, budget: int, language_penalty: float | None = None,
          overlong_cache: int | None = None, drop_overlong: bool = False) -> Reward:
  """The Reward of a config (`config.rlvr.reward`, `language_penalty`, `overlong_cache`, `drop_overlong`) for
  rollouts of `budget` tokens; overlong_cache None: a fifth of the budget, DAPO's 4k of 20k. Every config
  error is a UserError before any rollout."""
  cache = max(1, budget // 5) if overlong_cache is None else overlong_cache
  if not (isinstance(cache, int) and 1 <= cache <= budget):
    raise errors.UserError(f'config.rlvr.overlong_cache={overlong_cache!r} must be an integer in [1, '
                           f'config.sampling.max_new_tokens={budget}], or None (a fifth of it)')
  return Reward(weights_of(spec, language_penalty), Settings(budget=budget, overlong_cache=cache), drop_overlong)


def correctness(budget: int) -> Reward:
  """Correctness alone, no overlong drop: what rejection sampling and DPO's pair building read."""
  return build('correct:1', budget=budget)
