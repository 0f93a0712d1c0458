"""Rejection sampling, the cold start (docs/rl.md, paper §2.3): best-of-N from a teacher with the real
SQL tool, verified against the gold; every verified-correct trace is kept (deduplicated), and for
Korean prompts only those with English thinking and a Korean response. The output is an SFT data
file for the hybrid SFT mixture (`rs_traces:DIR/rs_traces.jsonl` in `config.sft.sources`).

    python -m luckystar.main --config=configs/rejection_sampling.py --workdir=runs/rs

Prompts (`rs_prompts`): the student's train prompts reserved for rejection sampling
(`examples.rs_only`; RLVR leaves exactly these out) of the bundled suites in `config.rejection_sampling.sources`:
every NL2SQL prompt (both languages) and the math prompts of `math_difficulties` in `math_languages` (Korean,
intermediate); and every record of its file sources (`luckystar.data.sources`: math_jsonl, spider, bird, ...);
at most `max_prompts` per source (0: all). The teacher (`config.init_from`) saw none of
them: it is trained on the teacher split's own questions and databases (`configs/sft.py:teacher`).

Each prompt is rendered in reasoning mode and sampled `samples_per_prompt` times at
`config.sampling`, the NL2SQL rows running their SQL in the sandbox. Writes, in `workdir`:

  rs_traces.jsonl  one kept trace per line: example_id, task, language, sample_index, teacher
                   (config.init_from), mode ('reasoning'), tokenizer (its fingerprint: SFT refuses
                   the traces under another tokenizer), tokens and loss_mask — the whole
                   conversation, prompt included, as `Tokenizer.render` lays it out (loss on the
                   teacher's tokens only; prompt and tool results 0)
  rs_stats.json    per task/language and overall: pass@1, pass@N, prompts with ≥ 1 kept trace, kept
                   traces per prompt (mean, max), why samples were dropped (the Korean language filter
                   among them); and the settings it was made with (`fingerprint`)
  rs_stats.md      the same as a table

A re-run on a finished workdir reuses these files (and says so); one made with other settings is an
error, not silently reused.
"""

import collections
import dataclasses
import json
import pathlib
import time
from typing import Any, Sequence

from absl import logging
import jax
import numpy as np

from luckystar import errors
from luckystar import sampling
from luckystar.data import sources
from luckystar.data.examples import Example, rs_only
from luckystar.engine import artifacts, judging, prompts, rollouts
from luckystar.engine import metrics as metrics_lib
from luckystar.engine import state as state_lib
from luckystar.model import sharding
from luckystar.rewards import language
from luckystar.rewards import terms
from luckystar.tokenizer import Tokenizer

TRACES_FILE = 'rs_traces.jsonl'
STATS_FILE = 'rs_stats.json'     # written last: its presence marks a finished run
REPORT_FILE = 'rs_stats.md'
MODE = 'reasoning'               # the rollouts are sampled, and stored, in reasoning mode
KEPT = 'kept'
# Why a sample is not kept: the first check it fails, in this order.
DROP_REASONS = ('unscorable', 'incorrect', 'unfinished', 'thinking_not_english', 'response_not_korean', 'duplicate')
LANGUAGE_FILTER = ('thinking_not_english', 'response_not_korean')   # Korean prompts only


# ---- prompts ---------------------------------------------------------------------------------------


def rs_prompts(config, tokenizer: Tokenizer | None = None) -> tuple[list[Example], list[sources.Report]]:
  """The rejection-sampling prompts of `config.rejection_sampling` (see the module docstring) and a report per
  source: of a bundled suite, train split only and only `rs_only` prompts, so never an RLVR, held-out or
  teacher prompt; of a file, every record. At most `max_prompts` per source (0: all). `tokenizer`: the
  teacher's (NL2SQL curation counts tokens; None: the bundled one)."""
  settings = config.rejection_sampling

  def wanted(example: Example) -> bool:
    return rs_only(example, config.seed) and (example.task != 'math' or (
        example.difficulty in settings.math_difficulties and example.language in settings.math_languages))
  return prompts.from_sources(settings.sources, key='config.rejection_sampling.sources', split='train',
                              seed=config.seed, tokenizer=tokenizer, where=wanted, per_source=settings.max_prompts)


# ---- which traces to keep (pure) -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One sampled trace, reduced to what the keep/drop decision reads."""
  token_ids: tuple[int, ...]   # the continuation after the prompt: equal ids are the same trace
  thinking: str | None         # the thinking sections of all its assistant turns, joined; None if none
  response: str | None         # the final turn's response section
  correct: bool | None         # the verifier's verdict (None: it could not score)
  ended: bool                  # the final turn closed with END_OF_TURN (not overlong, not a bare action)
  tool_results: tuple[str, ...] = ()   # what its tools returned: values the response quotes are data


def trace_decisions(prompt_language: str, candidates: Sequence[Candidate]) -> list[str]:
  """For one prompt's samples, in order: KEPT, or the first of DROP_REASONS that applies.

  Every verified-correct, finished trace is kept once (the first of equal token ids); for a Korean
  prompt it must also think in English and respond in Korean (docs/rl.md), as `language.thinking_language`
  and `language.detect` read them (mixed or empty text fails)."""
  seen, decisions = set(), []
  for candidate in candidates:
    if candidate.correct is None:
      decision = 'unscorable'
    elif not candidate.correct:
      decision = 'incorrect'
    elif not candidate.ended:
      decision = 'unfinished'
    elif prompt_language == 'ko' and language.thinking_language(candidate.thinking) != 'en':
      decision = 'thinking_not_english'
    elif prompt_language == 'ko' and language.detect(candidate.response, data=candidate.tool_results) != 'ko':
      decision = 'response_not_korean'
    elif candidate.token_ids in seen:
      decision = 'duplicate'
    else:
      decision = KEPT
      seen.add(candidate.token_ids)
    decisions.append(decision)
  return decisions


def candidate(scored: rollouts.Scored) -> Candidate:
  """A scored rollout → Candidate. An agent thinks in the turn that calls its tool, so the thinking of
  every turn counts (`Rollout.thinking`), not only the final one's."""
  return Candidate(token_ids=tuple(scored.rollout.token_ids.tolist()),
                   thinking=scored.rollout.thinking, response=scored.rollout.final_turn.response,
                   tool_results=tuple(scored.rollout.tool_results),
                   correct=scored.verdict.correct, ended=scored.rollout.stop_reason == 'end_of_turn')


def trace_features(tokenizer: Tokenizer, prompt_ids: Sequence[int], rollout: sampling.Rollout
                   ) -> tuple[list[int], list[int]]:
  """(tokens, loss_mask) of prompt + rollout, equal to `Tokenizer.render` of the same conversation:
  the sampled ids as they are (the prompt was rendered in reasoning mode), loss 1 on the teacher's
  tokens and 0 on the prompt and tool results; the END_OF_TURN that closes an action turn, spliced
  in by the tool loop, is trained on as `render` does."""
  tokens = [*map(int, prompt_ids), *rollout.token_ids.tolist()]
  mask = [0] * len(prompt_ids) + rollout.loss_mask.tolist()
  for i in range(len(prompt_ids) + 1, len(tokens)):
    if (tokens[i] == tokenizer.end_of_turn_id and tokens[i - 1] == tokenizer.end_of_action_id
        and mask[i - 1] == 1 and mask[i] == 0):
      mask[i] = 1
  return tokens, mask


# ---- statistics ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PromptResult:
  """One prompt's samples: verdicts (correct: True/False/None) and keep/drop decisions, in sample order."""
  task: str
  language: str
  correct: tuple[bool | None, ...]
  decisions: tuple[str, ...]


def _group_stats(results: Sequence[PromptResult]) -> dict[str, Any]:
  """pass@1 = mean correctness over scorable samples; pass@N = share of prompts with ≥ 1 correct sample."""
  scorable = [c for r in results for c in r.correct if c is not None]
  kept = [r.decisions.count(KEPT) for r in results]
  dropped = collections.Counter(d for r in results for d in r.decisions if d != KEPT)
  return {
      'prompts': len(results),
      'samples': sum(len(r.correct) for r in results),
      'pass@1': float(np.mean(scorable)) if scorable else float('nan'),
      'pass@N': float(np.mean([any(r.correct) for r in results])) if results else float('nan'),
      'prompts_with_kept_trace': sum(k > 0 for k in kept),
      'kept_traces': sum(kept),
      'kept_per_prompt_mean': float(np.mean(kept)) if kept else float('nan'),
      'kept_per_prompt_max': max(kept, default=0),
      'dropped': {reason: dropped[reason] for reason in DROP_REASONS},
      'dropped_by_language_filter': sum(dropped[reason] for reason in LANGUAGE_FILTER),
  }


def summarize(results: Sequence[PromptResult]) -> dict[str, dict[str, Any]]:
  """{'all': ..., '<task>': ..., '<task>/<language>': ...} → `_group_stats`."""
  groups = collections.defaultdict(list)
  for result in results:
    for key in ('all', result.task, f'{result.task}/{result.language}'):
      groups[key].append(result)
  return {key: _group_stats(groups[key]) for key in sorted(groups, key=lambda k: (k != 'all', k))}


def report(stats: dict[str, Any]) -> str:
  """rs_stats.md: one table row per group of `stats['groups']`."""
  n = stats['fingerprint']['samples_per_prompt']
  lines = [f'# Rejection sampling: teacher `{stats["fingerprint"]["init_from"]}`, N = {n}', '',
           f'| group | prompts | pass@1 | pass@{n} | prompts with a kept trace | kept traces | kept/prompt '
           '(mean, max) | dropped by the Korean language filter | incorrect | unfinished | duplicate |',
           '|' + '---|' * 11]
  for key, group in stats['groups'].items():
    lines.append(f'| {key} | {group["prompts"]} | {group["pass@1"]:.3f} | {group["pass@N"]:.3f} | '
                 f'{group["prompts_with_kept_trace"]} | {group["kept_traces"]} | '
                 f'{group["kept_per_prompt_mean"]:.2f}, {group["kept_per_prompt_max"]} | '
                 f'{group["dropped_by_language_filter"]} | {group["dropped"]["incorrect"]} | '
                 f'{group["dropped"]["unfinished"]} | {group["dropped"]["duplicate"]} |')
  return '\n'.join(lines) + '\n'


# ---- the stage -------------------------------------------------------------------------------------


def settings_of(config) -> dict[str, Any]:
  """Everything the output depends on; a finished workdir made with other settings is not reused."""
  settings = config.rejection_sampling
  return {'init_from': config.init_from, 'chat_format': config.get('chat_format', 'auto'), 'seed': config.seed,
          'sampling': dict(config.sampling),
          'sources': sources.fingerprint(sources.parse(settings.sources, key='config.rejection_sampling.sources')),
          'math_difficulties': list(settings.math_difficulties),
          'math_languages': list(settings.math_languages), 'max_prompts': settings.max_prompts,
          'samples_per_prompt': settings.samples_per_prompt, 'max_tool_turns': settings.max_tool_turns,
          'max_tool_result_tokens': settings.max_tool_result_tokens}


def run(config, workdir: str) -> None:
  workdir = pathlib.Path(workdir)
  settings = config.rejection_sampling
  stats = artifacts.load_or_build(workdir, STATS_FILE, settings_of(config), lambda: sample(config, workdir),
                                  what='rejection-sampled traces')
  print_summary(workdir, stats, samples=settings.samples_per_prompt, teacher=config.init_from)


def print_summary(workdir: pathlib.Path, stats: dict[str, Any], *, samples: int, teacher: str) -> str:
  """Prints (process 0) and returns the stage's summary: pass@1, pass@N and kept traces overall, and where
  the traces and the per-task report are."""
  overall, workdir = stats['groups']['all'], workdir.absolute()
  figures = [('pass@1', metrics_lib.percent(overall['pass@1'])),
             (f'pass@{samples}', metrics_lib.percent(overall['pass@N'])),
             ('kept traces', f'{overall["kept_traces"]} for {overall["prompts_with_kept_trace"]} of '
                             f'{overall["prompts"]} prompts'),
             ('language filter', f'{overall["dropped_by_language_filter"]} samples dropped')]
  return metrics_lib.print_summary(
      f'rejection_sampling: {overall["prompts"]} prompts × {samples} samples from {teacher}', figures,
      [('workdir', workdir), ('traces', workdir / TRACES_FILE), ('report', workdir / REPORT_FILE),
       ('stats', workdir / STATS_FILE)])


def sample(config, workdir: pathlib.Path) -> tuple[dict[str, Any], artifacts.Files]:
  """(stats, {traces, report}): every prompt sampled and its traces kept or dropped (module docstring)."""
  settings = config.rejection_sampling
  mesh = sharding.make_mesh(dict(config.mesh))
  teacher = state_lib.load_model(config, mesh)   # sharded over every process's devices
  model_config, params, tokenizer = teacher.config, teacher.params, teacher.tokenizer
  examples, reports = rs_prompts(config, tokenizer)
  artifacts.write_data_report(workdir, reports)
  if not examples:
    raise errors.UserError(f'config.rejection_sampling selects no prompts (sources={settings.sources!r}, '
                           f'math_difficulties={list(settings.math_difficulties)}, '
                           f'math_languages={list(settings.math_languages)})')
  samples = settings.samples_per_prompt
  logging.info('rejection sampling: %d prompts × %d samples from %r', len(examples), samples, config.init_from)
  judge = judging.make(config, workdir)   # asked only where the verifier cannot decide; None by default
  traces, results, started = [], [], time.time()
  # Correctness alone, no overlong drop: rejection sampling keeps traces by its own rules.
  with sharding.activate(mesh):
    groups = rollouts.sample_groups(
        model_config, params, tokenizer, examples, jax.random.key(config.seed), batch_rows=settings.batch_size,
        samples_per_prompt=samples, mode=MODE, desc='rejection sampling',
        settings=rollouts.rollout_settings(config, 'rejection_sampling'),
        reward=terms.correctness(config.sampling.max_new_tokens), judge=judge)
  for example, prompt_ids, group in groups:
    decisions = trace_decisions(example.language, [candidate(scored) for scored in group])
    results.append(PromptResult(example.task, example.language, tuple(s.verdict.correct for s in group),
                                tuple(decisions)))
    for index, (scored, decision) in enumerate(zip(group, decisions)):
      if decision == KEPT:
        tokens, mask = trace_features(tokenizer, prompt_ids, scored.rollout)
        traces.append({'example_id': example.id, 'task': example.task, 'language': example.language,
                       'sample_index': index, 'teacher': config.init_from, 'mode': MODE,
                       'tokenizer': tokenizer.fingerprint, 'tokens': tokens, 'loss_mask': mask})
  judging.save(judge, workdir)
  stats = {'groups': summarize(results), 'seconds': round(time.time() - started, 1), **judging.metrics(judge)}
  if judge is not None:
    logging.info('rejection sampling: %s', judging.metrics(judge))
  return stats, {TRACES_FILE: ''.join(json.dumps(t, ensure_ascii=False) + '\n' for t in traces),
                 REPORT_FILE: report({'fingerprint': settings_of(config), **stats})}
