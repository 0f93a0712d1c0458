"""DPO's data: which prompts it samples, which replies become chosen and rejected, and the pair files.

The dpo stage (`luckystar.stages.dpo`) is the method (loss, batch, metrics); this is what it trains on.

Pairs (`build_pairs`): `pair_prompts` seeded train prompts of `config.dpo.tasks` (math up to
`math_max_difficulty`: short math) are sampled `samples_per_prompt` times by the starting policy in each of
`config.dpo.modes` (default concise) at `config.sampling`, the policy's normal settings. chosen = a direct
correct answer (`config.dpo.chosen='direct'`, `direct_response`: the answer alone, '를 정답: C' rather than
the filled-in sentence and then the letter; 'reference': the example's reference reply), rendered in that
mode (`conversations.render_example`), kept only if the task's verifier scores it correct and in the
prompt's language. rejected = one of the policy's own samples: kind 'language' when its response is in the
wrong language (`Verdict.language_mismatch`), else kind 'concise' (concise mode only) when its reply is at
least `verbose_min_ratio` × and `verbose_min_extra` tokens longer than the chosen one. At most
`pairs_per_prompt` pairs per prompt, mode and kind: the first qualifying samples, correct ones first (such a
pair differs in length, not in the answer).

Anchors: `pair_prompts` train prompts of `config.dpo.anchor_tasks` are sampled the same way in each of
`config.dpo.anchor_modes` (default reasoning), and each prompt's first sample that is correct, in the
prompt's language and finished becomes an anchor row (kind 'anchor': the reply in both halves). Sampling
runs the tool loop (`max_tool_turns`): reasoning mode calls the calculator.

Files (`load_or_build_pairs`): `workdir/dpo_pairs.jsonl` (one pair per line with its provenance: example id,
task, language, kind, mode, policy, sampling settings, sample index, lengths, whether the rejected reply was
correct, its stop reason and text) and `workdir/dpo_pairs.json` (the config fingerprint and counts; written
last). A re-run reuses them; a changed config fingerprint is an error. `config.dpo.sources` reads preference
data instead (`luckystar.data.sources`: TRL's preference_jsonl, or dpo_pairs files the stage wrote
elsewhere), mixed by their weights.
"""

import collections
import dataclasses
import json
import pathlib
from typing import Any, Mapping, Sequence

from absl import logging
import jax
import numpy as np

from luckystar import errors
from luckystar import files
from luckystar import model
from luckystar.data import conversations, sources
from luckystar.data.examples import Example
from luckystar.engine import artifacts, evals, prompts, rollouts, streams
from luckystar.rewards import choice
from luckystar.rewards import reward as reward_lib
from luckystar.rewards import terms
from luckystar.tokenizer import Tokenizer

CHOSEN_STYLES = ('direct', 'reference')
DIRECT_TASKS = ('korean_mc', 'chat', 'math')
DIRECT_FORMAT = 2                     # direct_response's format: 1 the MC letter alone, 2 the option then the letter
PAIRS_FILE = 'dpo_pairs.jsonl'
PAIRS_SUMMARY = 'dpo_pairs.json'      # fingerprint and counts; written last: the pairs are complete
SOURCES_KEY = 'config.dpo.sources'
SIDES = ('chosen', 'rejected')
ANCHOR = 'anchor'                     # the kind of a row that holds one of the policy's own replies twice


# ---- prompts and chosen replies -----------------------------------------------------------------------


def pair_prompts(settings: Any, tokenizer: Tokenizer, *, seed: int, tasks: Sequence[str] | None = None,
                 modes: Sequence[str] | None = None) -> list[Example]:
  """`settings.pair_prompts` seeded train prompts of `tasks` (default `settings.tasks`; math up to
  `settings.math_max_difficulty`) whose prompt fits `settings.max_prompt_tokens` in every one of `modes`
  (default `settings.modes`)."""
  modes = settings.modes if modes is None else modes
  pool = prompts.prompt_set(settings.tasks if tasks is None else tasks, 'train', seed=seed, tokenizer=tokenizer,
                            where=lambda e: e.task != 'math' or e.difficulty <= settings.math_max_difficulty,
                            max_prompt_tokens=settings.max_prompt_tokens, modes=modes)
  order = np.random.default_rng([seed, streams.DPO_PAIR_PROMPTS]).permutation(len(pool))[:settings.pair_prompts]
  return [pool[i] for i in sorted(order)]


def direct_response(example: Example) -> str:
  """The answer alone, in the prompt's language: 'chosen = a direct correct answer' (paper §2.5). For
  multiple choice, the chosen option's text and its letter without the filled-in sentence ('를 정답: C';
  the letter alone where the example does not list its options), the short reference of a chat question
  or the final answer of a math problem ('Berlin.', '베를린입니다.', '34.', '34입니다.').

  The option's text stays because the small policy finds the letter through it (experiments/sweeps/dpo_anchors.md)."""
  if example.task == 'korean_mc':
    options = example.meta.get('options')
    if options is None:
      return f'정답: {example.answer}'
    return f'{options[choice.option_letters(len(options)).index(example.answer)]} 정답: {example.answer}'
  if example.task in DIRECT_TASKS:  # chat, math
    return f'{example.answer}입니다.' if example.language == 'ko' else f'{example.answer}.'
  raise errors.UserError(f"config.dpo.chosen='direct' has no direct answer for task {example.task!r}; "
                         f"use tasks from {DIRECT_TASKS} or config.dpo.chosen='reference'")


def chosen_reply(tokenizer: Tokenizer, example: Example, mode: str, style: str = 'direct') -> dict[str, Any] | None:
  """The chosen reply rendered in `mode` ({'tokens', 'loss_mask', 'text'}): the example's reference reply
  ('reference') or its answer alone (`direct_response`, 'direct'), with the reference thinking in
  reasoning mode; None when the task's verifier does not score its response correct and in the
  prompt's language."""
  if style not in CHOSEN_STYLES:
    raise errors.UserError(f'config.dpo.chosen={style!r}; expected one of {CHOSEN_STYLES}')
  if style == 'direct':
    example = dataclasses.replace(example, response=direct_response(example))
  rendered = conversations.render_example(tokenizer, example, mode)
  prompt_length = len(rollouts.render_prompt(tokenizer, example, mode))
  turn = tokenizer.parse_assistant(rendered['tokens'][prompt_length:].tolist())
  verdict = reward_lib.score(example, turn)
  if not verdict.correct or verdict.language_mismatch:
    return None
  return {**rendered, 'text': turn.response}


# ---- pairs from the policy's samples ------------------------------------------------------------------


def pair_kind(mode: str, chosen_length: int, scored: rollouts.Scored, settings: Any) -> str | None:
  """Which pair a sample makes against the chosen reply of `chosen_length` response tokens: 'language'
  (its response is in the wrong language), 'concise' (concise mode, and at least `verbose_min_ratio`
  × and `verbose_min_extra` tokens longer), or None."""
  if scored.verdict.language_mismatch:
    return 'language'
  length = int(scored.rollout.loss_mask.sum())
  if mode == 'concise' and length >= max(settings.verbose_min_ratio * chosen_length,
                                         chosen_length + settings.verbose_min_extra):
    return 'concise'
  return None


def pairs_fingerprint(config, tokenizer: Tokenizer) -> dict[str, Any]:
  """What the built pairs depend on; pairs built under another fingerprint are stale."""
  settings = config.dpo
  return {
      'init_from': config.init_from, 'tokenizer': tokenizer.fingerprint, 'seed': config.seed,
      'sampling': dict(config.sampling),
      'direct_format': DIRECT_FORMAT,
      **({'model_overrides': dict(config.model_overrides)} if config.model_overrides else {}),  # another policy
      **{key: settings[key] for key in ('chosen', 'tasks', 'modes', 'anchor_modes', 'anchor_tasks',
                                        'math_max_difficulty', 'max_prompt_tokens', 'pair_prompts',
                                        'samples_per_prompt', 'pairs_per_prompt', 'verbose_min_ratio',
                                        'verbose_min_extra', 'max_tool_turns', 'max_tool_result_tokens',
                                        'sampling_batch')}}


def record(config, example: Example, *, kind: str, mode: str, index: int, prompt: Sequence[int],
           scored: rollouts.Scored, chosen: Mapping[str, Any] | None, tokenizer: Tokenizer) -> dict[str, Any]:
  """One row of the pair file with its provenance: the `chosen` reply ({tokens, loss_mask, length,
  text}) against the sample `scored`, or for an anchor row (chosen None) the sample twice."""
  rollout = scored.rollout
  sample = {'tokens': [*prompt, *rollout.token_ids.tolist()],
            'loss_mask': [0] * len(prompt) + rollout.loss_mask.tolist(), 'length': int(rollout.loss_mask.sum()),
            'text': tokenizer.decode(rollout.token_ids[rollout.loss_mask > 0])}
  chosen = sample if chosen is None else chosen
  return {
      'example_id': example.id, 'task': example.task, 'language': example.language, 'kind': kind, 'mode': mode,
      'policy': config.init_from, 'tokenizer': tokenizer.fingerprint, 'sampling': dict(config.sampling),
      'sample_index': index,
      'prompt_length': len(prompt), 'chosen_length': chosen['length'], 'rejected_length': sample['length'],
      'rejected_correct': scored.verdict.correct, 'rejected_stop_reason': rollout.stop_reason,
      'chosen_text': chosen['text'], 'rejected_text': sample['text'],
      'chosen_tokens': list(chosen['tokens']), 'chosen_loss_mask': list(chosen['loss_mask']),
      'rejected_tokens': sample['tokens'], 'rejected_loss_mask': sample['loss_mask']}


def sampled(config, model_config: model.ModelConfig, params: Any, tokenizer: Tokenizer, examples: Sequence[Example],
            mode: str, rng: jax.Array, desc: str):
  """(example, prompt, [samples_per_prompt scored rollouts]) for each of `examples` in `mode`, sampled by
  the policy `params` at `config.sampling` with the tool loop, `config.dpo.sampling_batch` rows a call."""
  settings = config.dpo
  return rollouts.sample_groups(
      model_config, params, tokenizer, examples, rng, batch_rows=settings.sampling_batch,
      samples_per_prompt=settings.samples_per_prompt, mode=mode, desc=desc,
      settings=rollouts.rollout_settings(config, 'dpo'), reward=terms.correctness(config.sampling.max_new_tokens))


def build_pairs(config, model_config: model.ModelConfig, params: Any, tokenizer: Tokenizer,
                examples: Sequence[Example], anchor_examples: Sequence[Example] = ()
                ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """(pair records, counts) from samples of the policy `params` (module docstring): preference
  pairs on `examples`, anchor rows on `anchor_examples`."""
  settings = config.dpo
  pairs, counts = [], collections.Counter()
  rng = jax.random.key(config.seed)
  for mode_index, mode in enumerate(settings.modes):
    chosen = {e.id: chosen_reply(tokenizer, e, mode, settings.chosen) for e in examples}
    counts[f'{mode}/chosen_unverified'] += sum(c is None for c in chosen.values())
    usable = [e for e in examples if chosen[e.id] is not None]
    mode_rng = jax.random.fold_in(rng, streams.DPO_PAIRS + mode_index)
    for example, prompt, group in sampled(config, model_config, params, tokenizer, usable, mode, mode_rng,
                                          f'DPO pairs ({mode})'):
      counts[f'{mode}/samples'] += len(group)
      reply = chosen[example.id]
      if reply['tokens'][:len(prompt)].tolist() != prompt:  # one chat template for both replies
        raise ValueError(f'example {example.id}: the rendered reference reply does not start with its prompt')
      reply = {'tokens': reply['tokens'].tolist(), 'loss_mask': reply['loss_mask'].tolist(),
               'length': int(reply['loss_mask'].sum()), 'text': reply['text']}
      made = collections.Counter()
      # A correct verbose reply first: then the pair differs in length and not in the answer.
      for index in sorted(range(len(group)), key=lambda i: not group[i].verdict.correct):
        kind = pair_kind(mode, reply['length'], group[index], settings)
        if kind is None or made[kind] >= settings.pairs_per_prompt:
          continue
        made[kind] += 1
        counts[f'{mode}/{kind}'] += 1
        pairs.append(record(config, example, kind=kind, mode=mode, index=index, prompt=prompt, scored=group[index],
                            chosen=reply, tokenizer=tokenizer))
  for mode_index, mode in enumerate(settings.anchor_modes):
    mode_rng = jax.random.fold_in(rng, streams.DPO_ANCHORS + mode_index)
    for example, prompt, group in sampled(config, model_config, params, tokenizer, anchor_examples, mode, mode_rng,
                                          f'DPO anchors ({mode})'):
      counts[f'{mode}/anchor_samples'] += len(group)
      # The first correct, finished reply in the prompt's language.
      index = next((i for i, s in enumerate(group) if s.verdict.correct and not s.verdict.language_mismatch
                    and s.rollout.finished), None)
      if index is not None:
        counts[f'{mode}/{ANCHOR}'] += 1
        pairs.append(record(config, example, kind=ANCHOR, mode=mode, index=index, prompt=prompt, scored=group[index],
                            chosen=None, tokenizer=tokenizer))
  return pairs, summarize_pairs(pairs, counts, len(examples))


def summarize_pairs(pairs: Sequence[Mapping[str, Any]], counts: Mapping[str, int], prompts: int) -> dict[str, Any]:
  """Counts per kind, task and language, mean lengths, and how often the rejected reply was correct;
  'all' counts the preference pairs (anchor rows are kind 'anchor')."""
  groups = collections.defaultdict(list)
  for pair in pairs:
    keys = [pair['kind'], f'{pair["kind"]}/{pair["task"]}/{pair["language"]}'] + ['all'] * (pair['kind'] != ANCHOR)
    for key in keys:
      groups[key].append(pair)
  return {'prompts': prompts, 'sampling': dict(counts), 'pairs': {key: {
      'pairs': len(members),
      'chosen_length': evals.mean(p['chosen_length'] for p in members),
      'rejected_length': evals.mean(p['rejected_length'] for p in members),
      'rejected_correct': evals.mean(bool(p['rejected_correct']) for p in members)}
      for key, members in sorted(groups.items())}}


# ---- pair files ---------------------------------------------------------------------------------------


def read_pairs(path: pathlib.Path, tokenizer: Tokenizer) -> list[dict[str, Any]]:
  """A pair file (one JSON object per line with chosen_/rejected_ tokens and loss_mask); a malformed
  line, or one of another tokenizer (its `tokenizer` fingerprint, `Tokenizer.made`), is a UserError
  naming file:line."""
  try:
    records = files.read_jsonl(path, what='DPO pair file')
  except errors.MissingFile:
    raise errors.MissingFile(f'{path}: no such DPO pair file ({SOURCES_KEY}); set it to "" to build '
                             'pairs from the policy') from None
  pairs = []
  for number, record in records:
    try:
      for side in SIDES:
        tokens, mask = record[f'{side}_tokens'], record[f'{side}_loss_mask']
        if (not isinstance(tokens, list) or not isinstance(mask, list) or len(tokens) != len(mask) or len(tokens) < 2
            or not all(type(t) is int and t >= 0 for t in tokens) or not all(m in (0, 1) for m in mask)
            or not any(mask[1:])):
          raise ValueError(f'{side}_tokens must be token ids and {side}_loss_mask as many 0/1 values with a 1 '
                           'after the first token')
        if max(tokens) >= tokenizer.vocab_size:
          raise ValueError(f'{side}_tokens holds ids at or above the tokenizer\'s {tokenizer.vocab_size}')
      if not tokenizer.made(record.get('tokenizer')):
        raise ValueError(f'its tokens are of tokenizer {record.get("tokenizer")}, not of config.init_from\'s '
                         f'({tokenizer.fingerprint}); build the pairs again with this tokenizer')
    except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
      reason = f'missing field {e}' if isinstance(e, KeyError) else str(e)
      raise errors.UserError(f'{path}:{number}: not a DPO pair ({reason}); expected a line of '
                             f'{PAIRS_FILE} as the dpo stage writes it') from None
    pairs.append(record)
  if not pairs:
    raise errors.UserError(f'{path}: no DPO pairs in this file')
  return pairs



def read_sources(config, tokenizer: Tokenizer) -> tuple[list[dict[str, Any]], list[sources.Report]]:
  """The pairs of `config.dpo.sources` (TRL preference files, or pair files this stage wrote), each tagged
  with its `source`, and a report per source; every record checked before the first step."""
  pairs, reports = [], []
  for source in sources.parse(config.dpo.sources, key=SOURCES_KEY, formats=sources.PREFERENCE_FORMATS):
    if source.format == 'dpo_pairs':
      read = read_pairs(source.path, tokenizer)
      report = sources.Report(source.label, kept=len(read), digest=sources.digest(source),
                              questions=[p['question'] for p in read if p.get('question')])
    else:
      read, report = sources.preference_pairs(source, tokenizer)
    if not read:
      raise errors.UserError(f'{source.location}: no preference pairs ({SOURCES_KEY}, {source.format})')
    pairs += [{**pair, 'source': source.label} for pair in read]
    reports.append(report)
  return pairs, reports


def load_or_build_pairs(config, workdir: pathlib.Path, model_config: model.ModelConfig, params: Any,
                        tokenizer: Tokenizer) -> list[dict[str, Any]]:
  """The pairs of `config.dpo.sources` if set; else the workdir's pairs (`artifacts.load_or_build` under
  `pairs_fingerprint`), built now on the first run."""
  if config.dpo.get('sources'):
    pairs, reports = read_sources(config, tokenizer)
    eval_settings = evals.Settings.from_config(config.dpo.task_eval)
    evaluated = [e.prompt for e in evals.select(eval_settings, tokenizer)] if eval_settings.per_task_language else []
    artifacts.write_data_report(workdir, reports, train=[q for r in reports for q in r.questions], evaluated=evaluated)
    return pairs
  built = []

  def build():
    examples = pair_prompts(config.dpo, tokenizer, seed=config.seed)
    anchor_examples = (pair_prompts(config.dpo, tokenizer, seed=config.seed, tasks=config.dpo.anchor_tasks,
                                    modes=config.dpo.anchor_modes) if config.dpo.anchor_modes else [])
    pairs, summary = build_pairs(config, model_config, params, tokenizer, examples, anchor_examples)
    if not pairs:
      raise errors.UserError(
          f'no DPO pair from {len(examples)} prompts × {config.dpo.samples_per_prompt} samples of '
          f'{config.init_from!r} ({summary["sampling"]}); sample more (config.dpo.pair_prompts, samples_per_prompt) '
          'or loosen config.dpo.verbose_min_ratio / verbose_min_extra')
    logging.info('DPO pairs: built %d from %d prompts → %s: %s', len(pairs), len(examples), workdir / PAIRS_FILE,
                 {k: v['pairs'] for k, v in summary['pairs'].items() if '/' not in k})
    built.extend(pairs)
    return summary, {PAIRS_FILE: ''.join(json.dumps(p, ensure_ascii=False) + '\n' for p in pairs)}

  artifacts.load_or_build(workdir, PAIRS_SUMMARY, pairs_fingerprint(config, tokenizer), build, what='DPO pairs')
  return built or read_pairs(workdir / PAIRS_FILE, tokenizer)


def source_weights(settings: Any) -> dict[str, float] | None:
  """Source label → weight of `config.dpo.sources`, the proportions the stage draws its batches in; None for
  pairs built from the policy."""
  return sources.weights(sources.parse(settings.sources, key=SOURCES_KEY)) if settings.get('sources') else None
