"""Sampled, scored rollouts of task prompts: what RLVR trains on and rejection sampling filters.

One place renders a task prompt for generation, runs the policy with the tool loop (NL2SQL rows
execute their SQL in the sandbox; every row has the calculator), and scores each rollout with the
task's verifier.
"""

import dataclasses
from typing import Any, Sequence

import jax
import tqdm

from luckystar import distributed
from luckystar import model
from luckystar import sampling
from luckystar import tasks
from luckystar.data import conversations
from luckystar.data.examples import Example
from luckystar.rewards import reward as reward_lib
from luckystar.rewards import terms
from luckystar.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Scored:
  """One rollout of one prompt with its verdict and the built reward's value of it (`rewards.terms.Reward`)."""
  example: Example
  rollout: sampling.Rollout
  verdict: reward_lib.Verdict
  reward: float | None   # None: unscorable, or a dropped overlong rollout

  @property
  def survived(self) -> bool:
    """In the baseline and loss: scorable, and not a dropped overlong rollout (reward None)."""
    return self.reward is not None


def render_prompt(tokenizer: Tokenizer, example: Example, mode: str = 'reasoning') -> list[int]:
  """The example's context and question, ending with the assistant's turn header."""
  return tokenizer.render(conversations.prompt(example), mode, add_generation_prompt=True)[0]


def task_tools(examples: Sequence[Example]) -> sampling.ToolFn:
  """The tool_fn of rollouts of `examples`, row i for examples[i]: every row has the calculator, and a row whose
  task has a database (NL2SQL, `luckystar.tasks`) runs its SQL against it in the sandbox (`sampling.agent_tools`)."""
  return sampling.agent_tools([tasks.database(e) for e in examples])


def rollout_settings(config: Any, section: str) -> sampling.RolloutSettings:
  """The rollouts of the stage whose config section is `config.<section>`: sampling at `config.sampling`
  (temperature, top_k, top_p, max_new_tokens) with the section's tool limits (max_tool_turns,
  max_tool_result_tokens). The one place a stage's rollout settings come from its config."""
  stage, drawn = config[section], config.sampling
  return sampling.RolloutSettings(
      max_new_tokens=drawn.max_new_tokens, temperature=drawn.temperature, top_k=drawn.top_k, top_p=drawn.top_p,
      max_tool_turns=stage.max_tool_turns, max_tool_result_tokens=stage.max_tool_result_tokens)


def generate_and_score(model_config: model.ModelConfig, params: Any, tokenizer: Tokenizer, examples: Sequence[Example],
                       prompts: Sequence[Sequence[int]], rng: jax.Array, *, samples_per_prompt: int,
                       settings: sampling.RolloutSettings, reward: terms.Reward, judge: Any = None,
                       progress: Any = None) -> list[list[Scored]]:
  """`samples_per_prompt` rollouts of each prompt, scored by the verifiers: [prompts][k].

  Rollout j of prompt i is row i·k + j, the global id that keys its draws (`sampling`);
  settings: `sampling.rollout`'s (`rollout_settings`; slots None: a slot per rollout), progress its hooks'.
  reward: the built reward (`rewards.terms.build`) that gives each rollout its `reward` (None: out of the
  baseline and loss). judge: the stage's LLM judge (`engine.judging.make`), asked where the rules cannot
  decide; None: rules only.
  Several processes: each calls this with every prompt; a rollout is scored by its row's owner
  (`distributed.run_owned`) and every process gets every verdict."""
  rows = [i for i in range(len(examples)) for _ in range(samples_per_prompt)]
  results = sampling.rollout(
      model_config, params, tokenizer, [prompts[i] for i in rows], rng=rng, settings=settings,
      tool_fn=task_tools([examples[i] for i in rows]), hooks=sampling.RolloutHooks(progress=progress))
  def score(n):
    rollout = results[n]
    verdict = reward_lib.score(examples[rows[n]], rollout.final_turn, rollout.actions,
                               tool_results=rollout.tool_results, judge=judge)
    return verdict, reward(examples[rows[n]], rollout, verdict)

  groups = [[] for _ in examples]
  verdicts = distributed.run_owned(score, range(len(rows)), len(rows))   # each process scores its rows
  for i, rollout, (verdict, value) in zip(rows, results, verdicts):
    groups[i].append(Scored(examples[i], rollout, verdict, value))
  return groups


def sample_groups(model_config: model.ModelConfig, params: Any, tokenizer: Tokenizer, examples: Sequence[Example],
                  rng: jax.Array, *, batch_rows: int, samples_per_prompt: int, settings: sampling.RolloutSettings,
                  mode: str = 'reasoning', desc: str = 'sampling', **options
                  ) -> list[tuple[Example, list[int], list[Scored]]]:
  """(example, prompt, its `samples_per_prompt` scored rollouts) for each of `examples` in `mode`
  (`options`: `generate_and_score`'s other keyword arguments): one continuously batched call in `batch_rows`
  decode slots, each refilled with the next rollout as one ends. Rollout j of example n is row n·k + j
  under `rng`, so its tokens do not depend on `batch_rows`. A progress bar of rollouts on process 0."""
  prompts = [render_prompt(tokenizer, e, mode) for e in examples]
  with tqdm.tqdm(total=len(examples) * samples_per_prompt, desc=desc, unit='rollout', dynamic_ncols=True,
                 disable=jax.process_index() != 0) as bar:
    groups = generate_and_score(model_config, params, tokenizer, examples, prompts, rng,
                                samples_per_prompt=samples_per_prompt, progress=bar.update,
                                settings=dataclasses.replace(settings, slots=batch_rows), **options)
  return list(zip(examples, prompts, groups))
