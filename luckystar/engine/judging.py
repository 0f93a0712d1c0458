"""A stage's LLM judge (rewards.judge, docs/rl.md), built from `config.judge`, its verdicts kept in the workdir.

    judge = judging.make(config, workdir)       # None when config.judge.backend == 'none' (the default)
    groups = rollouts.generate_and_score(..., judge=judge)    # evals.evaluate / run_examples: judge= too
    judging.save(judge, workdir)                # e.g. after each step; process 0 writes, only if it changed
    metrics.update(judging.metrics(judge))      # judge/calls, judge/cache_hits, judge/requests, judge/failures

The verdict cache is an artifact, workdir/judge_cache.json, fingerprinted by the judge's identity: the
backend, the server's chat-completions URL and served model name (http) or init_from and its latest
checkpoint step (model), and the digest of the prompt and criteria. A re-run of the same judge answers
from it (cache hits, no requests); a cache another judge made is ignored and replaced, never an error. A
failed verdict (server down, timeout, neither YES nor NO) is counted in judge/failures and never cached
or fatal: the sample stays unscorable, or gets no language penalty.
"""

import json
import os
import pathlib
from typing import Any, Mapping
import weakref

from absl import logging
import jax
import numpy as np

from luckystar import errors
from luckystar.engine import artifacts, checkpoint, loading
from luckystar.rewards import judge as judge_lib

CACHE_FILE = 'judge_cache.json'
_saved_versions: 'weakref.WeakKeyDictionary[judge_lib.Judge, int]' = weakref.WeakKeyDictionary()


def settings(config: Any) -> dict[str, Any]:
  """`config.judge` with every key (judge_lib.DEFAULTS fill in what an older config lacks); a UserError
  naming each faulty `config.judge.<key>`."""
  judge_config = config.get('judge') if hasattr(config, 'get') else None
  if judge_config is None:
    return dict(judge_lib.DEFAULTS)
  if problems := judge_lib.config_problems(judge_config):
    raise errors.UserError('; '.join(problems))
  return {**judge_lib.DEFAULTS, **(judge_config.to_dict() if hasattr(judge_config, 'to_dict') else judge_config)}


def identity(judge_settings: Mapping[str, Any]) -> dict[str, Any]:
  """What makes two judges' verdicts interchangeable: the fingerprint of the persisted cache."""
  fingerprint = {'backend': judge_settings['backend'], 'prompt': judge_lib.prompt_digest()}
  if judge_settings['backend'] == 'http':
    fingerprint.update(url=judge_lib.chat_completions_url(judge_settings['base_url']), model=judge_settings['model'])
  else:  # a run directory's verdicts change with its latest checkpoint
    path = pathlib.Path(str(judge_settings['init_from']))
    step = checkpoint.latest_step(path) if (path / 'checkpoints').is_dir() else None
    fingerprint.update(init_from=str(judge_settings['init_from']), step=step)
  return fingerprint


def _model_fns(judge_settings: Mapping[str, Any]):
  """(prompt → the concise, greedy reply of `init_from`, at most max_tokens new tokens, no tool turns;
  (prompt, choices) → its most likely choice as the whole reply, `Model.reply_logprobs`, as luckystar.serve's
  guided choice scores them)."""
  init_from = judge_settings['init_from']
  try:
    model = loading.load(init_from)
  except errors.UserError as e:
    raise errors.UserError(f'config.judge.init_from={init_from!r}: {e}') from None
  if model.tokenizer is None:
    raise errors.UserError(f'config.judge.init_from={init_from!r} has no tokenizer, so it cannot judge text; '
                           f'name a model directory with its tokenizer files')
  max_tokens = judge_settings['max_tokens']
  generate = lambda prompt: model.generate(prompt, 'concise', max_new_tokens=max_tokens, temperature=0.0,
                                           max_tool_turns=0).text
  choose = lambda prompt, choices: choices[int(np.argmax(model.reply_logprobs(
      [{'role': 'user', 'content': prompt}], list(choices), 'concise')))]
  return generate, choose


def _load_cache(judge: judge_lib.Judge, workdir: pathlib.Path) -> None:
  """Preloads the verdicts of workdir/CACHE_FILE if the same judge made it (every process reads it)."""
  workdir.mkdir(parents=True, exist_ok=True)
  try:
    record = artifacts.load_or_build(workdir, CACHE_FILE, judge.identity, lambda: ({'verdicts': {}}, {}),
                                     what='judge verdict cache', stale='rebuild')
  except (OSError, ValueError) as e:  # unreadable or not JSON: a cache, so start empty
    logging.warning('judge: ignoring the verdict cache %s (%s); it is rewritten at the next save',
                    workdir / CACHE_FILE, e)
    return
  verdicts = record.get('verdicts')
  if isinstance(verdicts, dict) and verdicts:
    judge.preload(verdicts)
    logging.info('judge: %d cached verdicts from %s', len(verdicts), workdir / CACHE_FILE)
  _saved_versions[judge] = judge.cache_version


def make(config: Any, workdir: str | os.PathLike | None) -> judge_lib.Judge | None:
  """The stage's judge from `config.judge` (None when its backend is 'none' or the config has no judge),
  with the verdicts an earlier run of the same judge cached in `workdir` (None: no persisted cache).
  Every process calls it (the cache is read through `artifacts.load_or_build`, a barrier across processes).
  A faulty config.judge, or a 'model' init_from that cannot be loaded, is a UserError naming the key."""
  judge_settings = settings(config)
  if judge_settings['backend'] == 'none':
    return None
  if judge_settings['backend'] == 'model' and jax.process_count() > 1:
    # Its rollouts would run on one process under a mesh that spans them all (a verdict is its row owner's).
    raise errors.UserError("config.judge.backend='model' runs in one process only; under several processes "
                           "serve the judge model (python -m luckystar.serve) and use config.judge.backend='http'")
  generate_fn, choose_fn = _model_fns(judge_settings) if judge_settings['backend'] == 'model' else (None, None)
  try:
    judge = judge_lib.make_judge(judge_settings, generate_fn=generate_fn, choose_fn=choose_fn)
  except ValueError as e:
    raise errors.UserError(str(e)) from None
  judge.identity = artifacts.plain(identity(judge_settings))
  logging.info('judge: %s', judge.identity)
  if workdir is not None:
    _load_cache(judge, pathlib.Path(workdir))
  return judge


def save(judge: judge_lib.Judge | None, workdir: str | os.PathLike | None) -> None:
  """workdir/CACHE_FILE: the judge's cached verdicts under its identity, written atomically by process 0 when
  it has cached a verdict since the last save (cheap to call after every step). No-op for no judge."""
  if judge is None or workdir is None or _saved_versions.get(judge) == judge.cache_version:
    return
  if jax.process_index() == 0:
    path = pathlib.Path(workdir) / CACHE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {'fingerprint': judge.identity, 'verdicts': judge.verdicts()}
    artifacts.write_atomically(path, json.dumps(record, ensure_ascii=False) + '\n')
  _saved_versions[judge] = judge.cache_version


def metrics(judge: judge_lib.Judge | None) -> dict[str, int]:
  """The judge's counters since `make` in this process, for metrics.jsonl: judge/calls (verdicts asked for),
  judge/cache_hits (answered from the cache, verdicts loaded from the workdir included), judge/requests
  (backend attempts, retries included) and judge/failures (no verdict: counted, never fatal). {} for no judge."""
  return {} if judge is None else judge.stats.as_metrics()
