"""The `eval` stage: every suite on one model, in both modes; report.md, results.json, plots/*.png.

    python -m luckystar.main --config=configs/eval.py --workdir=DIR --config.init_from=tiny-sft

Suites (`config.eval.suites`), each answered in every mode of `config.eval.modes`, greedy:

    math                   bundled held-out word problems, en + ko: pass@1, and pass@k from sampled replies
    champ                  CHAMP competition problems (`champ-dataset` package, en): pass@1 and pass@k
    nl2sql                 held-out databases, the agent runs its SQL in the sandbox: execution accuracy
    bfcl                   real BFCL v4 simple / multiple / parallel (`bfcl-eval` package): AST match
    korean_mc              KoBALT-format 10-option multiple choice: accuracy
    chat                   concise chat questions: correctness
    instruction_following  generated, rule-verified constraints (data.instruction_following)

and one suite per item of `config.eval.sources` (`luckystar.data.sources`: math_jsonl, spider, bird, bfcl,
kobalt_jsonl, bundled), named `<format>:<file stem>` (`kobalt_jsonl:kobalt`), its first `per_suite_language`
prompts per language; a math_jsonl suite also gets pass@k.

Per suite and mode: `correctness` (correct among scorable), `correctness/<language>` (and `/<category>` for
BFCL), `response_length` (generated tokens), `language_mismatch` (paper Table 2: Korean prompts whose
response is not Korean), `format_ok`, `overlong`, `unscorable`, `examples`; `pass_at_<k>` in reasoning mode
for math and champ. `overall/<mode>` pools language mismatch and length over the suites (instruction
following aside: it asks for the other language on purpose). A suite whose data package is missing is
skipped with its install command in the report, never scored 0.

A "model" here is anything `evals.Respond`: `evals.model_respond` (a loaded luckystar model, with the SQL tool
loop) or `evals.text_respond(fn)` for any callable `fn(messages, mode) -> text` that spells our sections
(`<|START_ACTION|>{json}<|END_ACTION|>`, ...), e.g. a BFCL gold-answer oracle or an HTTP endpoint.
"""

import collections
import dataclasses
import json
import math
import pathlib
from typing import Any, Sequence

import jax
import numpy as np
import tqdm

from luckystar import distributed
from luckystar import errors
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import bfcl, champ, instruction_following, sources
from luckystar.data.examples import Example
from luckystar.engine import artifacts, evals, judging, prompts
from luckystar.engine import metrics as metrics_lib
from luckystar.engine import state as state_lib
from luckystar.model import sharding
from luckystar.rewards import reward

SUITES = ('math', 'champ', 'nl2sql', 'bfcl', 'korean_mc', 'chat', 'instruction_following')
PASS_K_SUITES = ('math', 'champ')
HEADLINE = {'math': 'pass@1', 'champ': 'pass@1', 'nl2sql': 'execution accuracy', 'bfcl': 'AST match',
            'korean_mc': 'accuracy', 'chat': 'correctness', 'instruction_following': 'instructions followed'}
NO_LANGUAGE_FIGURE = ('instruction_following',)  # asks for the other language on purpose
SOURCE_HEADLINE = {'math_jsonl': 'pass@1', 'spider': 'execution accuracy', 'bird': 'execution accuracy',
                   'bfcl': 'AST match', 'kobalt_jsonl': 'accuracy'}


def headline(suite: str) -> str:
  """The figure a suite reports: a built-in suite's, or for a source's suite (`format:name`) its format's."""
  form, _, name = suite.partition(':')
  return HEADLINE.get(suite) or SOURCE_HEADLINE.get(form) or HEADLINE.get(name, 'correctness')


@dataclasses.dataclass(frozen=True)
class Settings:
  """`config.eval` (configs/eval.py documents each key)."""
  suites: Sequence[str] = SUITES
  modes: Sequence[str] = evals.MODES
  per_suite_language: int = 16
  bfcl_categories: Sequence[str] = ('simple_python', 'multiple', 'parallel')
  bfcl_per_category: int = 16
  champ_problems: int = 16
  sources: str = ''
  pass_k: Sequence[int] = (1, 4)
  pass_k_samples: int = 4
  pass_k_problems: int = 8
  pass_k_temperature: float = 1.0
  max_new_tokens: int = 160
  max_prompt_tokens: int = 768
  max_tool_turns: int = 2
  max_tool_result_tokens: int = 96
  batch_size: int = 32
  seed: int = 0

  @classmethod
  def from_config(cls, config: Any) -> 'Settings':
    fields = {f.name for f in dataclasses.fields(cls)}
    values = dict(config)
    unknown = sorted(set(values) - fields)
    if unknown:
      raise errors.UserError(f'config.eval has unknown keys {unknown}; known: {sorted(fields)}')
    settings = cls(**{k: (tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in values.items()})
    for name in settings.suites:
      if name not in SUITES:
        raise errors.UserError(f'config.eval.suites: unknown suite {name!r}; expected some of {SUITES}')
    for mode in settings.modes:
      if mode not in evals.MODES:
        raise errors.UserError(f'config.eval.modes: unknown mode {mode!r}; expected some of {evals.MODES}')
    if settings.pass_k_samples and max(settings.pass_k) > settings.pass_k_samples:
      raise errors.UserError(f'config.eval.pass_k={settings.pass_k} needs pass_k_samples ≥ {max(settings.pass_k)}')
    return settings


class SuiteUnavailable(Exception):
  """A suite's data is not installed; the message says how to install it."""


# ---- suites ----------------------------------------------------------------------------------

def suite_examples(name: str, settings: Settings, tokenizer: tokenizer_lib.Tokenizer | None = None) -> list[Example]:
  """The fixed eval set of one suite (first N of each held-out source; NL2SQL curation counts `tokenizer`'s
  tokens, None: the bundled one's). Raises SuiteUnavailable."""
  per_language = settings.per_suite_language
  if name in ('math', 'nl2sql', 'korean_mc', 'chat'):
    examples = prompts.prompt_set((name,), 'heldout', seed=settings.seed, per_language=per_language,
                                  tokenizer=tokenizer)
    return examples
  if name == 'champ':
    if not champ.available():
      raise SuiteUnavailable(f'the `champ-dataset` package is not installed: `{champ.INSTALL_HINT}`')
    return champ.load()[:settings.champ_problems]
  if name == 'bfcl':
    try:
      return [bfcl.to_example(e, category) for category in settings.bfcl_categories
              for e in bfcl.load(category)[:settings.bfcl_per_category]]
    except FileNotFoundError as e:
      raise SuiteUnavailable(str(e)) from None
  if name == 'instruction_following':
    return instruction_following.generate(settings.seed, per_language)
  raise ValueError(f'unknown suite {name!r}; expected one of {SUITES}')


SOURCES_KEY = 'config.eval.sources'


def source_suites(settings: Settings, tokenizer: tokenizer_lib.Tokenizer | None
                  ) -> tuple[dict[str, list[Example]], list[sources.Report]]:
  """The suites of `settings.sources`, by name (`<format>:<file stem or bundled name>`), and a report per source."""
  suites, reports = {}, []
  for source in sources.parse(settings.sources, key=SOURCES_KEY, formats=sources.PROMPT_FORMATS):
    is_file = source.format not in ('bundled', 'bfcl')
    name = f'{source.format}:{source.path.stem if is_file else source.location}'
    if name in suites or name in SUITES:
      raise errors.UserError(f'{SOURCES_KEY}: two suites would be named {name!r}; rename one of the files')
    examples, source_reports = prompts.from_sources(
        f'{source.label}@{source.weight:g}', key=SOURCES_KEY, split='heldout', seed=settings.seed,
        tokenizer=tokenizer, per_language=settings.per_suite_language)
    suites[name] = examples
    reports += source_reports
  return suites, reports


def score(suite: str, example: Example, reply, judge=None) -> reward.Verdict:
  """The task's verifier (rewards.reward.score, `judge` deciding what it cannot), or the instruction's rule for
  instruction following."""
  if suite != 'instruction_following':
    return reward.score(example, reply.final_turn, reply.actions, tool_results=reply.tool_results, judge=judge)
  response = reply.final_turn.response
  follows = instruction_following.follows(example, response)
  return reward.Verdict(correct=follows, format_ok=bool((response or '').strip()), language_mismatch=False,
                        reward=float(follows))


def score_all(suite: str, examples: Sequence[Example], replies: Sequence[Any], judge=None) -> list[reward.Verdict]:
  """`score` of every reply; with several processes each scores its share (`distributed.run_owned`) and all
  get every verdict."""
  return distributed.run_owned(lambda n: score(suite, examples[n], replies[n], judge), range(len(examples)),
                               len(examples))


def pass_at_k(samples: int, correct: int, k: int) -> float:
  """Unbiased pass@k from `samples` replies of which `correct` are right (Chen et al. 2021)."""
  if samples - correct < k:
    return 1.0
  return 1.0 - math.comb(samples - correct, k) / math.comb(samples, k)


def suite_metrics(suite: str, results: Sequence[evals.Result]) -> dict[str, float]:
  """`evals.scored_figures` per language (and per category or constraint for BFCL and instruction following),
  with the suite's size and overlong replies."""
  def groups(example):
    if suite in ('bfcl', 'instruction_following'):
      return example.language, example.meta.get('category') or example.meta.get('constraint')
    return (example.language,)
  figures = evals.scored_figures(results, groups, with_language=suite not in NO_LANGUAGE_FIGURE)
  return {**figures, 'unscorable': int(figures['unscorable']), 'examples': len(results),
          'overlong': evals.mean(bool(getattr(r, 'overlong', False)) for _, r, _ in results)}


def sampled_pass_at_k(suite: str, respond: evals.Respond, examples: Sequence[Example], settings: Settings,
                      judge=None) -> dict[str, float]:
  """pass@k in reasoning mode from `pass_k_samples` replies per problem at `pass_k_temperature`."""
  problems = prompts.first_per_language(examples, settings.pass_k_problems)
  repeated = [e for e in problems for _ in range(settings.pass_k_samples)]
  replies = respond(repeated, 'reasoning', settings.pass_k_temperature, settings.seed + 1)
  correct = collections.Counter()
  scorable = set()
  for example, verdict in zip(repeated, score_all(suite, repeated, replies, judge)):
    if verdict.correct is not None:
      scorable.add(example.id)
      correct[example.id] += bool(verdict.correct)
  metrics = {f'pass_at_{k}': evals.mean(pass_at_k(settings.pass_k_samples, correct[i], k) for i in sorted(scorable))
             for k in settings.pass_k}
  metrics['pass_at_k_problems'] = len(scorable)
  return metrics


def evaluate(respond: evals.Respond, tokenizer: tokenizer_lib.Tokenizer, settings: Settings, *,
             progress: bool = True, from_sources: dict[str, list[Example]] | None = None, judge=None
             ) -> dict[str, Any]:
  """Every suite × mode: {'suites': {suite: {mode: metrics}}, 'overall': {mode: metrics}, 'skipped':
  {suite: why}}; a tqdm bar runs across the suites. `from_sources`: `source_suites`' suites, if read already;
  `judge` (`engine.judging.make`) decides what the verifiers cannot."""
  plan, skipped = [], {}
  if from_sources is None:
    from_sources, _ = source_suites(settings, tokenizer)
  for name in (*settings.suites, *from_sources):
    try:
      candidates = from_sources[name] if name in from_sources else suite_examples(name, settings, tokenizer)
    except SuiteUnavailable as e:
      skipped[name] = str(e)
      continue
    # The reasoning preamble is the longer one: a prompt that fits it fits both modes.
    examples = [e for e in candidates if prompts.fits(tokenizer, e, settings.max_prompt_tokens)]
    if too_long := len(candidates) - len(examples):
      skipped[f'{name} (part)'] = f'{too_long} prompts over max_prompt_tokens={settings.max_prompt_tokens} left out'
    plan += [(name, mode, examples) for mode in settings.modes]
    if ((name in PASS_K_SUITES or name.startswith('math_jsonl:')) and 'reasoning' in settings.modes
        and settings.pass_k_samples):
      plan.append((name, 'pass@k', examples))
  out = {'suites': collections.defaultdict(dict), 'overall': {}, 'skipped': skipped}
  pooled = collections.defaultdict(list)
  bar = tqdm.tqdm(plan, desc='eval', unit='suite', disable=not progress or jax.process_index() != 0)
  for name, mode, examples in bar:
    bar.set_postfix_str(f'{name}/{mode} ({len(examples)} prompts)')
    if mode == 'pass@k':
      out['suites'][name]['reasoning'].update(sampled_pass_at_k(name, respond, examples, settings, judge))
      continue
    replies = respond(examples, mode, 0.0, settings.seed)
    results = list(zip(examples, replies, score_all(name, examples, replies, judge)))
    out['suites'][name][mode] = suite_metrics(name, results)
    if name not in NO_LANGUAGE_FIGURE:
      pooled[mode] += results
  for mode, results in pooled.items():
    out['overall'][mode] = {'language_mismatch': evals.korean_mismatch_rate(results),
                            'response_length': evals.mean(evals.response_length(r) for _, r, _ in results),
                            'korean_prompts': sum(reward.prompt_language(e.prompt) == 'ko' for e, _, _ in results),
                            'examples': len(results)}
  out['suites'] = dict(out['suites'])
  return out


def flat_metrics(results: dict[str, Any]) -> dict[str, float]:
  """`eval/<suite>/<mode>/<metric>` and `eval/overall/<mode>/<metric>`, for metrics.jsonl and sweeps."""
  flat = {}
  for name, modes in results['suites'].items():
    for mode, metrics in modes.items():
      flat.update({f'eval/{name}/{mode}/{k}': float(v) for k, v in metrics.items()})
  for mode, metrics in results['overall'].items():
    flat.update({f'eval/overall/{mode}/{k}': float(v) for k, v in metrics.items()})
  return flat


# ---- report ----------------------------------------------------------------------------------

def _pct(value) -> str:
  return '–' if value is None or (isinstance(value, float) and math.isnan(value)) else f'{100 * value:.1f}'


def _num(value) -> str:
  return '–' if value is None or (isinstance(value, float) and math.isnan(value)) else f'{value:.1f}'


def report_markdown(results: dict[str, Any]) -> str:
  suites, modes = results['suites'], results['settings']['modes']
  get = lambda name, mode, key: suites.get(name, {}).get(mode, {}).get(key)
  lines = [f'# Evaluation of `{results["init_from"]}`', '',
           f'Greedy decoding, at most {results["settings"]["max_new_tokens"]} new tokens, SQL tool loop on for NL2SQL; '
           'correctness in % of scorable prompts (`luckystar/stages/eval.py`).', '',
           '## Correctness per suite', '',
           '| suite | metric | ' + ' | '.join(modes) + ' | prompts | unscorable |',
           '|---|---|' + '---|' * len(modes) + '---|---|']
  for name in suites:
    any_mode = next(iter(suites[name].values()))
    lines.append(f'| {name} | {headline(name)} | ' + ' | '.join(_pct(get(name, m, 'correctness')) for m in modes)
                 + f' | {any_mode.get("examples", 0)} | ' + ' / '.join(str(get(name, m, 'unscorable')) for m in modes)
                 + ' |')
  pass_rows = [name for name in suites if 'pass_at_k_problems' in suites[name].get('reasoning', {})]
  if pass_rows:
    ks = results['settings']['pass_k']
    lines += ['', f'## pass@k (reasoning mode, {results["settings"]["pass_k_samples"]} samples per problem at '
              f'temperature {results["settings"]["pass_k_temperature"]})', '',
              '| suite | problems | ' + ' | '.join(f'pass@{k}' for k in ks) + ' |', '|---|---|' + '---|' * len(ks)]
    for name in pass_rows:
      lines.append(f'| {name} | {get(name, "reasoning", "pass_at_k_problems")} | '
                   + ' | '.join(_pct(get(name, 'reasoning', f'pass_at_{k}')) for k in ks) + ' |')
  lines += ['', '## Language and length', '',
            'Korean→English mismatch (paper Table 2): % of Korean prompts with a parsable response whose response is '
            'not Korean. Length: generated tokens per reply (tool results excluded).', '',
            '| suite | ' + ' | '.join(f'{m} mismatch | {m} length' for m in modes) + ' |',
            '|---|' + '---|---|' * len(modes)]
  for name in suites:
    lines.append(f'| {name} | ' + ' | '.join(f'{_pct(get(name, m, "language_mismatch"))} | '
                                            f'{_num(get(name, m, "response_length"))}' for m in modes) + ' |')
  lines.append('| **all but instruction_following** | ' + ' | '.join(
      f'{_pct(results["overall"].get(m, {}).get("language_mismatch"))} | '
      f'{_num(results["overall"].get(m, {}).get("response_length"))}' for m in modes) + ' |')
  lines += ['', '## Breakdown (correctness %, per language and category)', '',
            '| suite | mode | breakdown |', '|---|---|---|']
  for name in suites:
    for mode in modes:
      parts = [f'{k.removeprefix("correctness/")} {_pct(v)}' for k, v in suites[name].get(mode, {}).items()
               if k.startswith('correctness/')]
      lines.append(f'| {name} | {mode} | {", ".join(parts) or "–"} |')
  if results['skipped']:
    lines += ['', '## Skipped', ''] + [f'- **{name}**: {why}' for name, why in results['skipped'].items()]
  return '\n'.join(lines) + '\n'


def plot(workdir: pathlib.Path, results: dict[str, Any]) -> list[pathlib.Path]:
  """Bar charts: correctness, response length and language mismatch per suite and mode; pass@k."""
  plt = metrics_lib.pyplot()
  suites, modes = results['suites'], results['settings']['modes']
  out_dir = workdir / metrics_lib.PLOTS_DIR
  charts = [('correctness', 'correctness (%)', 100), ('response_length', 'generated tokens per reply', 1),
            ('language_mismatch', 'Korean→English mismatch (%)', 100)]
  written = []
  names = list(suites)
  for key, label, scale in charts:
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names)), 3.6), dpi=100)
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
      values = [suites[n].get(mode, {}).get(key, float('nan')) * scale for n in names]
      ax.bar(np.arange(len(names)) + i * width, np.nan_to_num(values), width, label=mode)
    ax.set_xticks(np.arange(len(names)) + width * (len(modes) - 1) / 2, names, rotation=20, ha='right')
    ax.set(ylabel=label, title=f'{results["init_from"]}: {label}')
    ax.legend()
    ax.grid(axis='y', alpha=0.3)
    written.append(metrics_lib.save_figure(fig, out_dir / f'{key}.png'))
  pass_names = [n for n in names if 'pass_at_k_problems' in suites[n].get('reasoning', {})]
  if pass_names:
    ks = results['settings']['pass_k']
    fig, ax = plt.subplots(figsize=(5, 3.6), dpi=100)
    width = 0.8 / len(ks)
    for i, k in enumerate(ks):
      values = [100 * suites[n]['reasoning'].get(f'pass_at_{k}', float('nan')) for n in pass_names]
      ax.bar(np.arange(len(pass_names)) + i * width, np.nan_to_num(values), width, label=f'pass@{k}')
    ax.set_xticks(np.arange(len(pass_names)) + width * (len(ks) - 1) / 2, pass_names)
    ax.set(ylabel='%', title=f'{results["init_from"]}: pass@k (reasoning, sampled)')
    ax.legend()
    written.append(metrics_lib.save_figure(fig, out_dir / 'pass_at_k.png'))
  return written


def write(workdir: str | pathlib.Path, results: dict[str, Any]) -> None:
  """report.md, results.json, metrics.jsonl (one row, step 0) and plots/*.png in `workdir`."""
  workdir = pathlib.Path(workdir)
  (workdir / 'results.json').write_text(json.dumps(results, indent=2, ensure_ascii=False) + '\n')
  (workdir / 'report.md').write_text(report_markdown(results))
  writer = metrics_lib.Writer(workdir)
  writer.write(0, flat_metrics(results) | results.get('judge', {}))
  writer.close()
  plot(workdir, results)


def run(config, workdir: str) -> None:
  settings = Settings.from_config(config.eval)
  mesh = sharding.make_mesh(dict(config.mesh))
  loaded = state_lib.load_model(config, mesh)   # sharded over every process's devices
  tokenizer = loaded.tokenizer
  from_sources, reports = source_suites(settings, tokenizer)   # every record checked before any reply
  artifacts.write_data_report(workdir, reports)
  respond = evals.model_respond(loaded.config, loaded.params, tokenizer, settings)
  judge = judging.make(config, workdir)
  with sharding.activate(mesh):
    results = {'init_from': config.init_from, 'settings': dataclasses.asdict(settings),
               **evaluate(respond, tokenizer, settings, from_sources=from_sources, judge=judge)}
  judging.save(judge, workdir)
  results['judge'] = judging.metrics(judge)
  if jax.process_index() == 0:
    write(workdir, results)
  distributed.barrier('eval results written')   # a pipeline's next stage may read them on any process
  summarize(workdir, results)


def summarize(workdir: str | pathlib.Path, results: dict[str, Any]) -> str:
  """Prints (process 0) and returns the stage's summary: correctness per suite and mode, Korean→English
  mismatch per mode, and where the report and charts are."""
  workdir = pathlib.Path(workdir).absolute()
  modes = results['settings']['modes']
  keys = [f'eval/{name}/{mode}/correctness' for name in results['suites'] for mode in modes]
  keys += [f'eval/overall/{mode}/language_mismatch' for mode in modes]
  skipped = [('skipped', ', '.join(results['skipped']))] if results['skipped'] else []
  return metrics_lib.summarize(workdir, keys, title=f'eval of {results["init_from"]}',
                               outputs=[*skipped, ('report', workdir / 'report.md'),
                                        ('results', workdir / 'results.json'),
                                        ('charts', workdir / metrics_lib.PLOTS_DIR)])
