"""Hybrid SFT (docs/training.md, paper §2.2): next-token cross-entropy on assistant tokens of a weighted
mixture of conversations in both modes (default 80% reasoning, 20% concise).

    python -m luckystar.main --config=configs/sft.py --workdir=runs/sft

Config (`config.sft`): `seq_len` (packed row length), `mixture` (source → weight), `data`
('conversations': `luckystar.data.conversations.sft_sources`, train split for training and the
heldout split for `eval/*`; 'base': `conversations.base_sources`, the concise-only mixture that
makes `tiny-base`; 'teacher': `conversations.teacher_sources`, the rejection-sampling teacher's
mixture from the teacher split; 'synthetic': a tiny learnable token task for smoke tests; any other
name: data an experiment registered, `luckystar.data.sources`; a `mixture` key the data lacks is the
registered data of that name as one source),
`rs_traces` (a `rs_traces.jsonl` of the rejection_sampling stage whose traces join the train split's
'reasoning' source of the 'conversations' data; '' = none),
`eval_examples_per_source` (a fixed sample of held-out conversations per source; 0 = no eval).
"""

import functools
from typing import Mapping, Sequence

from absl import logging
import jax
import numpy as np

from luckystar import errors
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import conversations
from luckystar.data import pipeline
from luckystar.data import sources as sources_lib
from luckystar.data.examples import SPLITS
from luckystar.engine import artifacts
from luckystar.engine import evals
from luckystar.engine import logprobs
from luckystar.engine import loop
from luckystar.engine import optim
from luckystar.engine import state as state_lib
from luckystar.engine import step as step_lib
from luckystar.model import sharding



# ---- data ------------------------------------------------------------------------------------


def synthetic_sources(seed: int, split: str, *, vocab_size: int, per_source: int = 64
                      ) -> dict[str, list[dict[str, np.ndarray]]]:
  """A tiny learnable task in the shape of rendered conversations: a random "prompt" (loss 0)
  followed by its reverse as the "answer" (loss 1); each split draws its own. For smoke tests."""
  rng = np.random.default_rng([seed, SPLITS.index(split)])
  sources = {}
  for name, (low, high) in {'reasoning': (6, 20), 'concise': (3, 8)}.items():
    items = []
    for _ in range(per_source):
      prompt = rng.integers(4, vocab_size, rng.integers(low, high))
      items.append({'tokens': np.concatenate([prompt, prompt[::-1]]),
                    'loss_mask': np.concatenate([np.zeros_like(prompt), np.ones_like(prompt)])})
    sources[name] = items
  return sources


# What the run shows (`loop.run_training`): held-out token loss and accuracy, and task correctness when on.
SUMMARY_KEYS = ('eval/loss', 'eval/accuracy', 'eval/correctness', 'eval/concise/correctness')
BUNDLED = ('conversations', 'teacher', 'base', 'synthetic')   # bundled:<data> built in; others: registered


def _bundled(name: str, config, split: str, *, tokenizer: tokenizer_lib.Tokenizer | None, vocab_size: int
             ) -> tuple[dict[str, list], dict[str, float]]:
  """(sources, weights) of the bundled SFT data `name` in `split`."""
  if not 0 <= (fraction := config.sft.get('chat_tool_fraction', conversations.CHAT_TOOL_FRACTION)) <= 1:
    raise errors.UserError(f'config.sft.chat_tool_fraction={fraction!r}; expected a share in [0, 1]')
  if name == 'synthetic':
    raw = synthetic_sources(config.seed, split, vocab_size=vocab_size)
    return raw, {source: 1.0 for source in raw}
  if name == 'conversations':
    if (thinking := config.sft.get('thinking_language', 'en')) not in ('en', 'ko'):
      raise errors.UserError(f'config.sft.thinking_language={thinking!r}; expected "en" or "ko"')
    return conversations.sft_sources(tokenizer, seed=config.seed, split=split, thinking_language=thinking,
                                     chat_tool_fraction=fraction)
  if name == 'teacher':  # the teacher split; held-out eval on the same tasks
    return (conversations.teacher_sources(tokenizer, seed=config.seed, chat_tool_fraction=fraction)
            if split == 'train' else
            conversations.sft_sources(tokenizer, seed=config.seed, split=split, chat_tool_fraction=fraction,
                                      reasoning_tasks=conversations.TEACHER_REASONING_TASKS))
  if name == 'base':
    return conversations.base_sources(tokenizer, seed=config.seed, split=split)
  if name in sources_lib.sft_names():
    return sources_lib.sft(name, tokenizer, seed=config.seed, split=split)
  raise errors.UserError(f'config.sft.sources: bundled:{name} is no SFT data; bundled: {BUNDLED}, registered: '
                         f'{sources_lib.sft_names()} (luckystar.data.sources)')


def source_items(config, split: str = 'train') -> list[sources_lib.Source]:
  """The items of `config.sft.sources` (train), or for held-out eval those of `config.sft.eval_sources`, by
  default the bundled items of `sources` (their held-out split)."""
  if split == 'train':
    return sources_lib.parse(config.sft.sources, key='config.sft.sources', formats=sources_lib.CONVERSATION_FORMATS)
  if config.sft.get('eval_sources'):
    return sources_lib.parse(config.sft.eval_sources, key='config.sft.eval_sources',
                             formats=sources_lib.CONVERSATION_FORMATS)
  return [s for s in source_items(config) if s.format == 'bundled']


def no_eval_note(config) -> str | None:
  """Why eval/loss would not run although `eval_examples_per_source` asks for it: only bundled items have a
  held-out split, so sources of files alone and no `eval_sources` leave nothing to evaluate."""
  if not config.sft.eval_examples_per_source or config.sft.get('eval_sources'):
    return None
  if any(s.format == 'bundled' for s in source_items(config)):
    return None
  return (f'no held-out eval/loss: config.sft.sources={config.sft.sources!r} has no bundled item (only those '
          f'have a held-out split) and config.sft.eval_sources is empty; set '
          f'--config.sft.eval_sources=chat_jsonl:FILE to held-out conversations')


def dry_run_notes(config) -> list[str]:
  """What `main --dry_run` says of this stage beyond the shared checks."""
  return [note] if (note := no_eval_note(config)) else []


def sources(config, split: str, *, tokenizer: tokenizer_lib.Tokenizer | None, vocab_size: int
            ) -> tuple[dict[str, list], dict[str, float], list[sources_lib.Report]]:
  """(sources, weights, reports) of rendered conversations of `split`, named by `config.sft.sources`
  (`luckystar.data.sources`): `bundled:<data>` is each source of that data at the item's weight × the data's
  own; `bundled:<data>/<source>` one of them; file items are train data, read into held-out eval only when
  named in `config.sft.eval_sources`. Every record is checked here, before the first step."""
  raw, weights, reports = {}, {}, []
  for source in source_items(config, split):
    if source.format == 'bundled':
      name, _, part = source.location.partition('/')
      data, data_weights = _bundled(name, config, split, tokenizer=tokenizer, vocab_size=vocab_size)
      if part and part not in data:
        raise errors.UserError(f'{source.key}: {source.label}: bundled:{name} has sources {sorted(data)}')
      for sub in ([part] if part else sorted(data)):
        label = f'bundled:{name}/{sub}'
        if label in raw:
          raise errors.UserError(f'{source.key} names {label} twice')
        raw[label], weights[label] = data[sub], source.weight * (1.0 if part else data_weights[sub])
        reports.append(sources_lib.Report(label, kept=len(data[sub])))
      continue
    if source.format == 'chat_jsonl':
      items, report = sources_lib.chat_conversations(source, tokenizer)
    else:   # rs_traces
      items = conversations.read_rs_traces(source.location, tokenizer)
      report = sources_lib.Report(source.label, kept=len(items), digest=sources_lib.digest(source))
    reports.append(report)
    if not items and source.format == 'rs_traces':   # rejection sampling may keep nothing; the report says so
      continue
    if not items:
      raise errors.UserError(f'{source.location}: no conversations ({source.key})')
    raw[source.label], weights[source.label] = items, source.weight
  if split == 'train' and not raw:
    raise errors.UserError(f'config.sft.sources={config.sft.sources!r} gives no training conversations')
  return raw, weights, reports


def check_seq_len(raw: Mapping[str, Sequence], seq_len: int, probe: int = 64) -> None:
  """Packing cuts a conversation at `seq_len`; a source whose first `probe` items all lose every trained token
  there would train on nothing (each step skipped as all-zero), so it is an error that names the setting."""
  for name, items in raw.items():
    if items and not any(pipeline.encode(item)['loss_mask'][1:seq_len].any() for item in items[:probe]):
      longest = max(len(pipeline.encode(item)['tokens']) for item in items[:probe])
      raise errors.UserError(f'config.sft.seq_len={seq_len} cuts the {name!r} source\'s conversations '
                             f'(up to {longest} tokens) before their first trained token; raise it')



def check_batch_size(config, mesh: jax.sharding.Mesh) -> None:
  """`config.batch_size` (global rows) must split over the mesh's data × fsdp devices and the processes."""
  batch_devices = mesh.shape['data'] * mesh.shape['fsdp']
  if config.batch_size % batch_devices or config.batch_size % jax.process_count():
    raise ValueError(f'config.batch_size={config.batch_size} does not split over the mesh\'s data×fsdp = '
                     f'{batch_devices} devices and {jax.process_count()} processes')



def with_task_eval(eval_fn, model_config, tokenizer, settings: 'evals.Settings', mesh: jax.sharding.Mesh):
  """Adds held-out task correctness (greedy generation, both modes, per task and language) to `eval_fn`."""
  def combined(params, step):
    metrics = dict(eval_fn(params, step)) if eval_fn is not None else {}
    with sharding.activate(mesh):   # the params stay sharded; the rollouts split over the mesh
      metrics.update(evals.evaluate(model_config, params, tokenizer, settings))
    return metrics
  return combined


def run(config, workdir: str) -> None:
  if loop.is_finished(config, workdir):
    loop.finish_without_training(config, workdir, summary_keys=SUMMARY_KEYS)
    return
  items = source_items(config)
  model_config, mesh, optimizer, state, tokenizer = state_lib.start(
      config, workdir, needs_tokenizer=any(s.label != 'bundled:synthetic' for s in items))
  loss = functools.partial(logprobs.token_cross_entropy, model_config=model_config)
  update_fn = step_lib.make_update_fn(
      loss, optimizer, step_lib.state_shardings_of(state), mesh=mesh,
      learning_rate=optim.learning_rate_schedule(config), grad_accum_steps=config.grad_accum_steps)

  train, weights, reports = sources(config, 'train', tokenizer=tokenizer, vocab_size=model_config.vocab_size)
  check_seq_len(train, config.sft.seq_len)
  check_batch_size(config, mesh)
  # Every process packs the same global stream and keeps its own rows: the batches (and so the loss
  # curve) do not depend on the number of processes, every process's score_columns width agrees, and
  # a run resumes on another process count. The cost, packing rows other processes train on, is
  # small beside a step; each process already renders every source.
  global_stream = pipeline.mixture(train, weights, seed=config.seed, process_index=0, process_count=1)
  batches = iter(pipeline.packed_batches(global_stream, pipeline.encode, seq_len=config.sft.seq_len,
                                         batch_size=config.batch_size
                                         ).map(logprobs.with_score_columns).map(update_fn.local_rows))
  eval_fn, eval_questions = None, []
  if note := no_eval_note(config):
    logging.warning(note)
  if config.sft.eval_examples_per_source:
    heldout, _, heldout_reports = sources(config, 'heldout', tokenizer=tokenizer, vocab_size=model_config.vocab_size)
    eval_questions += [q for report in heldout_reports for q in report.questions]
    if heldout:
      eval_items = evals.eval_subset(heldout, config.sft.eval_examples_per_source, config.seed)
      eval_fn = evals.make_eval_fn(loss, evals.heldout_batches(eval_items, seq_len=config.sft.seq_len,
                                                               batch_size=config.batch_size), mesh)
  if tokenizer is not None and config.sft.task_eval.per_task_language:
    task_eval = evals.Settings.from_config(config.sft.task_eval)
    eval_questions += [e.prompt for e in evals.select(task_eval, tokenizer)]
    eval_fn = with_task_eval(eval_fn, model_config, tokenizer, task_eval, mesh)
  artifacts.write_data_report(workdir, reports, train=[q for r in reports for q in r.questions],
                              evaluated=eval_questions)
  loop.run_training(config, workdir, state=state, update_fn=update_fn, batches=batches, eval_fn=eval_fn,
                    model_config=model_config, summary_keys=SUMMARY_KEYS)
