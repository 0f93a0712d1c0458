"""The one record every task suite yields, and the split rule they share."""

import dataclasses
import hashlib
from typing import Any

from luckystar.rewards.language import LANGUAGES  # the languages the one language rule tells apart

# train: SFT / RL prompts; heldout: evaluation only; teacher: the rejection-sampling teacher's own
# training data, disjoint from everything the student sees (docs/rl.md).
SPLITS = ('train', 'heldout', 'teacher')


@dataclasses.dataclass(frozen=True)
class Example:
  """One prompt with its gold answer. `answer` is what the task's verifier compares against:
  the final answer (math), gold SQL (nl2sql), ground-truth calls as JSON (function_calling),
  a letter (korean_mc) or a short reference (chat). `task` names a registered task (`luckystar.tasks`, which
  imports the suites that make examples, so it is checked where a task is looked up, not here)."""
  id: str
  task: str
  language: str
  split: str
  prompt: str
  answer: str
  system: str = ''                  # task context for the system turn (schema, tool docs, options)
  thinking: str | None = None       # programmatic step-by-step trace, English
  thinking_ko: str | None = None    # the same trace in Korean (English-vs-Korean thinking ablation)
  response: str | None = None       # a reference final response in the prompt's language
  difficulty: int = 1               # 1 easy … 3 hard
  meta: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

  def __post_init__(self):
    if not self.task or self.language not in LANGUAGES or self.split not in SPLITS:
      raise ValueError(f'example {self.id}: bad task/language/split {self.task}/{self.language}/{self.split}')


def split_of(text: str, seed: int, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> str:
  """A stable split from the prompt text: equal texts always land in the same split, so splits
  can never share a question."""
  digest = hashlib.sha256(f'{seed}:{text}'.encode()).digest()
  u = int.from_bytes(digest[:8], 'big') / 2**64
  cumulative = 0.0
  for split, fraction in zip(SPLITS, fractions):
    cumulative += fraction
    if u < cumulative:
      return split
  return SPLITS[-1]


RS_ONLY_FRACTION = 0.25


def rs_only(example: Example, seed: int, fraction: float = RS_ONLY_FRACTION) -> bool:
  """Whether a train prompt is reserved for rejection sampling and held out of RLVR (docs/rl.md: the
  paper keeps starting entropy this way). A stable hash of the prompt, independent of `split_of`'s."""
  digest = hashlib.sha256(f'rs:{seed}:{example.task}:{example.prompt}'.encode()).digest()
  return int.from_bytes(digest[:8], 'big') / 2**64 < fraction


def dedupe(examples) -> list[Example]:
  """First occurrence of each (task, prompt, system) wins; generators may draw repeats."""
  seen, out = set(), []
  for example in examples:
    key = (example.task, example.prompt, example.system)
    if key not in seen:
      seen.add(key)
      out.append(example)
  return out
