"""Held-out evaluation, the one engine every stage's `eval/*` figures and the eval stage use (docs/evaluation.md).

A `Respond` turns examples into replies: `model_respond` (a luckystar model: greedy, or sampled at a
temperature, with the tool loop: NL2SQL runs its SQL in the sandbox, math may call the calculator) or
`text_respond` (any callable writing our section markers). `rewards.reward.score` scores each reply and
`summarize` names the figures. For mode m in (reasoning, concise), `evaluate` logs

    eval/<m>/correctness, eval/<m>/correctness/<task>, eval/<m>/correctness/<language>,
    eval/<m>/correctness/<task>/<language>, eval/<m>/language_mismatch, eval/<m>/response_length,
    eval/<m>/response_length/<task>,
    eval/<m>/thinking_rate, eval/<m>/format_ok, eval/<m>/unscorable,
    eval/reasoning/hybrid_format, eval/reasoning/hybrid_format/<language>

and the reasoning-mode headline figures again as eval/correctness, eval/language_mismatch,
eval/response_length (plus eval/correctness/<task>, eval/correctness/<language>). Sampled
(`Settings.samples` draws per prompt at `Settings.temperature`), correctness is pass@1 at that temperature.
`language_mismatch` is the paper's Table 2 figure: among Korean prompts with a parsable
response, the fraction whose response is not Korean. `hybrid_format` is the reasoning mode's
contract (paper §2.2): among prompts answered in text (tasks with `hybrid_format` in `luckystar.tasks`), the
fraction with an English thinking section and then a non-empty response in the prompt's language.
"""

import collections
import dataclasses
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

import grain
import jax
import numpy as np
import tqdm

from luckystar import distributed
from luckystar import sampling
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import conversations, pipeline
from luckystar.data.examples import Example
from luckystar.engine import logprobs, prompts
from luckystar.engine import rollouts as rollouts_lib
from luckystar.engine import step as step_lib
from luckystar.model import ModelConfig
from luckystar.rewards import language, reward
from luckystar.tasks import TASKS
from luckystar.tokenizer import MODES, Tokenizer


@dataclasses.dataclass(frozen=True)
class Settings:
  tasks: Sequence[str] = dataclasses.field(default_factory=lambda: tuple(TASKS))   # every registered task
  modes: Sequence[str] = MODES
  split: str = 'heldout'
  per_task_language: int = 32      # examples per (task, language); the first N of the split
  max_new_tokens: int = 160
  max_tool_turns: int = 2
  max_tool_result_tokens: int = 96
  batch_size: int = 32
  seed: int = 0
  temperature: float = 0.0         # 0: greedy; > 0: sampled at this temperature (pass@1 = mean over samples)
  samples: int = 1                 # rollouts per prompt when sampling

  @classmethod
  def from_config(cls, config: Any) -> 'Settings':
    return cls(**{k: (tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in dict(config).items()})


def select(settings: Settings, tokenizer: Tokenizer | None = None) -> list[Example]:
  """The first `per_task_language` held-out examples of each (task, language): a fixed eval set (NL2SQL
  curation counts `tokenizer`'s tokens; None: the bundled one's)."""
  return prompts.prompt_set(settings.tasks, settings.split, seed=settings.seed, per_language=settings.per_task_language,
                            tokenizer=tokenizer)


# ---- models: anything that turns examples into replies ---------------------------------------------

# (examples, mode, temperature, seed[, max_new_tokens]) → one reply per example: a sampling.Rollout or a TextReply.
Respond = Callable[..., list]
TextModel = Callable[[list[dict], str], str]   # (prompt messages, mode) → assistant text
Result = tuple[Example, Any, reward.Verdict]    # an example, its reply and the reply's verdict


@dataclasses.dataclass(frozen=True)
class TextReply:
  """A text model's reply, with the fields of sampling.Rollout that scoring and `summarize` read."""
  final_turn: tokenizer_lib.AssistantTurn
  actions: list[str]
  loss_mask: np.ndarray      # ones, one per token of the reply (its length in our tokenizer)
  overlong: bool = False
  tool_results: tuple[str, ...] = ()   # no tool loop


_SECTIONS = {name: re.compile(re.escape(start) + r'(.*?)(?:' + re.escape(end) + r'|$)', re.DOTALL)
             for name, (start, end) in tokenizer_lib.SECTION_TOKENS.items()}


def parse_text(text: str) -> tuple[tokenizer_lib.AssistantTurn, list[str]]:
  """An assistant turn written as text with our section markers → (turn, actions). Text without any
  marker is the response."""
  found = {name: pattern.findall(text) for name, pattern in _SECTIONS.items()}
  if not any(found.values()):
    return tokenizer_lib.AssistantTurn(response=text.strip(), ended=True), []
  first = {name: matches[0].strip() if matches else None for name, matches in found.items()}
  return tokenizer_lib.AssistantTurn(**first, ended=True), [a.strip() for a in found['action']]


def text_respond(fn: TextModel, tokenizer: Tokenizer) -> Respond:
  """A Respond over a text callable; no tool loop (an NL2SQL reply is scored on its last SQL action)."""
  def respond(examples, mode, temperature=0.0, seed=0, max_new_tokens=None):
    del temperature, seed, max_new_tokens  # the callable decides how it samples
    replies = []
    for example in examples:
      text = fn(conversations.prompt(example), mode)
      turn, actions = parse_text(text)
      replies.append(TextReply(turn, actions, np.ones(len(tokenizer.encode(text)), np.int32)))
    return replies
  return respond


def model_respond(model_config: ModelConfig, params: Any, tokenizer: Tokenizer, settings: Any) -> Respond:
  """A Respond over a luckystar model: rollouts with the tool loop (the calculator; NL2SQL rows run their
  SQL in the sandbox) in `settings.batch_size` decode slots, each refilled with the next prompt as one ends,
  within its max_new_tokens and tool limits; example n is row n under key(seed) (`sampling`'s per-row draws:
  its tokens do not depend on the batch size). A progress bar ('eval <mode>') counts the prompts on process 0.
  max_new_tokens: a call's own budget (default `settings.max_new_tokens`)."""
  def respond(examples, mode, temperature=0.0, seed=0, max_new_tokens=None):
    rendered = [rollouts_lib.render_prompt(tokenizer, e, mode) for e in examples]
    with tqdm.tqdm(total=len(examples), desc=f'eval {mode}' + (' sampled' if temperature > 0 else ''),
                   unit='prompt', leave=False, dynamic_ncols=True, disable=jax.process_index() != 0) as bar:
      rollout_settings = sampling.RolloutSettings(
          max_new_tokens=max_new_tokens or settings.max_new_tokens, temperature=temperature,
          max_tool_turns=settings.max_tool_turns, max_tool_result_tokens=settings.max_tool_result_tokens,
          slots=settings.batch_size)
      return sampling.rollout(model_config, params, tokenizer, rendered, rng=jax.random.key(seed),
                              settings=rollout_settings, tool_fn=rollouts_lib.task_tools(examples),
                              hooks=sampling.RolloutHooks(progress=bar.update))
  return respond


def run_examples(model_config: ModelConfig, params: Any, tokenizer: Tokenizer, examples: Sequence[Example],
                 mode: str, settings: Settings, *, judge: Any = None) -> list[Result]:
  """Rollouts of `examples` in `mode` (greedy, or `settings.samples` each at `settings.temperature`),
  each with its verdict; `judge` (`engine.judging.make`; None: rules only) decides what the rules cannot."""
  if settings.temperature > 0:
    examples = [e for e in examples for _ in range(settings.samples)]
  replies = model_respond(model_config, params, tokenizer, settings)(examples, mode, settings.temperature,
                                                                      settings.seed)
  verdicts = distributed.run_owned(
      lambda n: reward.score(examples[n], replies[n].final_turn, replies[n].actions,
                             tool_results=replies[n].tool_results, judge=judge), range(len(examples)), len(examples))
  return list(zip(examples, replies, verdicts))


# ---- figures ----------------------------------------------------------------------------------------

def mean(values) -> float:
  """The mean of `values`, NaN for none."""
  values = list(values)
  return float(np.mean(values)) if values else float('nan')


def response_length(reply: Any) -> int:
  """Generated tokens of a reply (tool results excluded)."""
  return int(np.sum(reply.loss_mask))


def scored_figures(results: Sequence[Result], groups: Callable[[Example], Iterable[str]],
                   with_language: bool = True) -> dict[str, float]:
  """The figures every evaluation reports: correctness (among scorable replies) overall and per group
  of `groups(example)`, language_mismatch (unless `with_language` is False), response_length,
  format_ok and unscorable (the count of replies a verifier could not decide)."""
  scored = [(e, v) for e, _, v in results if v.correct is not None]
  figures = {'correctness': mean(v.correct for _, v in scored)}
  by_group = collections.defaultdict(list)
  for example, verdict in scored:
    for key in groups(example):
      by_group[key].append(verdict.correct)
  figures.update({f'correctness/{key}': mean(values) for key, values in sorted(by_group.items())})
  if with_language:
    figures['language_mismatch'] = korean_mismatch_rate(results)
  figures['response_length'] = mean(response_length(r) for _, r, _ in results)
  figures['format_ok'] = mean(v.format_ok for _, _, v in results)
  figures['unscorable'] = float(len(results) - len(scored))
  return figures


def summarize(results: Sequence[Result], mode: str) -> dict[str, float]:
  """`scored_figures` per task and language as eval/<mode>/..., with lengths per task, the thinking rate
  and, in reasoning mode, the hybrid format."""
  figures = scored_figures(results, lambda e: (e.task, e.language, f'{e.task}/{e.language}'))
  lengths = collections.defaultdict(list)
  for example, rollout, _ in results:
    lengths[example.task].append(response_length(rollout))
  figures.update({f'response_length/{task}': mean(values) for task, values in sorted(lengths.items())})
  figures['thinking_rate'] = mean(r.thinking is not None for _, r, _ in results)
  if mode == 'reasoning':
    hybrid = collections.defaultdict(list)
    for example, rollout, verdict in results:
      if TASKS[example.task].hybrid_format:
        hybrid[example.language].append(hybrid_format_ok(rollout.thinking, rollout.final_turn.response, verdict))
    figures['hybrid_format'] = mean(ok for values in hybrid.values() for ok in values)
    figures.update({f'hybrid_format/{lang}': mean(values) for lang, values in sorted(hybrid.items())})
  return {f'eval/{mode}/{name}': value for name, value in figures.items()}


def korean_mismatch_rate(results: Sequence[Result]) -> float:
  """The paper's Table 2 figure: among Korean prompts with a parsable response, the fraction whose
  response is not Korean (NaN when there is none). "Parsable" reads the response as the verdict's
  mismatch did: words copied from the tool results are data; a mixed response counts where the
  judge decided its language."""
  return mean([v.language_mismatch for e, r, v in results
               if reward.prompt_language(e.prompt) == 'ko' and (
                   v.language_judged or language.detect(r.final_turn.response, data=r.tool_results))])


def hybrid_format_ok(thinking: str | None, response: str | None, verdict: reward.Verdict) -> bool:
  """English thinking (`language.thinking_language`: quoted material aside; a rollout's `thinking`
  joins every turn's, as a tool call may come between), then a non-empty response in the prompt's
  language (a bare number counts)."""
  return (language.thinking_language(thinking) == 'en' and bool((response or '').strip())
          and not verdict.language_mismatch)


def evaluate(model_config: ModelConfig, params: Any, tokenizer: Tokenizer, settings: Settings = Settings(),
             examples: Sequence[Example] | None = None, *, judge: Any = None) -> dict[str, float]:
  """Every `eval/*` metric of the module docstring for one set of params, on `examples` (default:
  `select(settings, tokenizer)`), scored with `judge` where the rules cannot decide (None: rules only)."""
  examples = select(settings, tokenizer) if examples is None else examples
  metrics = {}
  for mode in settings.modes:
    metrics.update(summarize(run_examples(model_config, params, tokenizer, examples, mode, settings, judge=judge),
                             mode))
  if 'reasoning' in settings.modes:
    for key, value in list(metrics.items()):
      if key.startswith('eval/reasoning/') and key.count('/') <= 3:
        metrics['eval/' + key.removeprefix('eval/reasoning/')] = value
  return metrics


# ---- held-out token loss (SFT, quantization) ---------------------------------------------------------


def eval_subset(heldout: Mapping[str, Sequence], per_source: int, seed: int) -> list:
  """A fixed sample of `per_source` items from each held-out source (all of a smaller one)."""
  rng = np.random.default_rng(seed)
  return [items[i] for _, items in sorted(heldout.items())
          for i in sorted(rng.permutation(len(items))[:per_source])]


def heldout_batches(heldout: Sequence, *, seq_len: int, batch_size: int) -> list[dict[str, np.ndarray]]:
  """`heldout` packed once into fixed global batches of `batch_size` rows; the last batch is padded
  with empty rows (segment 0, never scored). Every process builds all of them (`make_eval_fn` feeds
  each its own rows), so every process runs the same number of eval steps."""
  packed = pipeline.packed_batches(grain.MapDataset.source(list(heldout)), pipeline.encode,
                                   seq_len=seq_len, batch_size=1, num_packing_bins=batch_size)
  rows = [{k: v[0] for k, v in batch.items()} for batch in packed]
  rows += [{k: np.zeros_like(v) for k, v in rows[0].items()}] * (-len(rows) % batch_size)
  return [logprobs.with_score_columns({k: np.stack([row[k] for row in rows[i:i + batch_size]]) for k in rows[0]})
          for i in range(0, len(rows), batch_size)]


def make_eval_fn(loss: Any, heldout_batches: list[dict[str, np.ndarray]], mesh: jax.sharding.Mesh):
  """eval_fn(params, step) → {'eval/loss', 'eval/accuracy'}: sum over every held-out token / count."""
  evaluate = step_lib.MeshFunction(jax.jit(lambda params, batch: loss(params, batch, None)[1]), mesh,
                                   step_lib.batch_sharding(mesh))
  device_batches = [evaluate.put_batch(evaluate.local_rows(batch)) for batch in heldout_batches]

  def eval_fn(params, step):
    del step
    loss_sum, correct, tokens = 0.0, 0.0, 0.0
    for batch in device_batches:
      aux = jax.device_get(evaluate(params, batch))
      loss_sum, correct = loss_sum + aux['loss'] * aux['tokens'], correct + aux['accuracy'] * aux['tokens']
      tokens += aux['tokens']
    return {'eval/loss': loss_sum / max(tokens, 1.0), 'eval/accuracy': correct / max(tokens, 1.0)}
  return eval_fn
