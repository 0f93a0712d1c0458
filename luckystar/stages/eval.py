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
    gsm8k, math500         the paper's public math sets, shipped with their licences (`data.benchmarks`):
    aime24, aime25         pass@1 averaged over `samples` replies per problem (greedy: samples=0), and pass@k
    mtbench                MT-Bench's 80 two-turn questions, each turn rated 1–10 by `config.judge`
                           (`engine.mtbench`)

and one suite per item of `config.eval.sources` (`luckystar.data.sources`: math_jsonl, spider, bird, bfcl,
kobalt_jsonl, bundled), named `<format>:<file stem>` (`kobalt_jsonl:kobalt`), its first `per_suite_language`
prompts per language; a math_jsonl suite also gets pass@k.

Per suite and mode: `correctness` (correct among scorable), `correctness/<language>` (and `/<category>` for
BFCL), `response_length` (generated tokens), `language_mismatch` (paper Table 2: Korean prompts whose
response is not Korean), `format_ok`, `overlong`, `unscorable`, `examples`; `pass_at_<k>` in reasoning mode
for math and champ (and for the paper's math sets with `samples`); `score` for mtbench. `overall/<mode>` pools language mismatch and length over the suites (instruction
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
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import tqdm

from luckystar import distributed
from luckystar import errors
from luckystar import tasks as task_registry
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import benchmarks, bfcl, champ, instruction_following, sources
from luckystar.data.examples import Example
from luckystar.engine import artifacts, evals, judging, mtbench, prompts
from luckystar.engine import metrics as metrics_lib
from luckystar.engine import state as state_lib
from luckystar.model import sharding
from luckystar.rewards import reward

BENCHMARKS = benchmarks.MATH_SETS   # the paper's public math sets
# The suites of data from outside the task registry; each registered task with a `headline` is a suite as well
# (its held-out split, `luckystar.tasks`), with its headline and pass@k there.
OTHER_SUITES = ('champ', 'bfcl', 'instruction_following', *BENCHMARKS, 'mtbench')
OTHER_PASS_K = ('champ',)
HEADLINE = {'champ': 'pass@1', 'bfcl': 'AST match', 'instruction_following': 'instructions followed',
            **{name: 'pass@1' for name in BENCHMARKS}, 'mtbench': 'judge score (1–10)'}
NO_LANGUAGE_FIGURE = ('instruction_following', 'mtbench')  # the other language on purpose; English only
SOURCE_HEADLINE = {'math_jsonl': 'pass@1', 'spider': 'execution accuracy', 'bird': 'execution accuracy',
                   'bfcl': 'AST match', 'kobalt_jsonl': 'accuracy'}


def suite_names() -> tuple[str, ...]:
  """Every suite `config.eval.suites` may name: the registered tasks' (in registry order), then OTHER_SUITES."""
  return (*task_registry.eval_suites(), *OTHER_SUITES)


def _task(suite: str) -> task_registry.Task | None:
  """The registered task whose held-out split is `suite`, or None."""
  return task_registry.TASKS.get(suite) if suite in task_registry.eval_suites() else None


def _named_headline(suite: str) -> str | None:
  task = _task(suite)
  return HEADLINE.get(suite) or (task.headline if task else None)


def headline(suite: str) -> str:
  """The figure a suite reports: a built-in suite's, or for a source's suite (`format:name`) its format's."""
  form, _, name = suite.partition(':')
  return _named_headline(suite) or SOURCE_HEADLINE.get(form) or _named_headline(name) or 'correctness'


def has_pass_k(suite: str) -> bool:
  """Whether the reasoning mode of `suite` also samples pass@k: champ, a task marked so, any math_jsonl file."""
  task = _task(suite)
  return suite in OTHER_PASS_K or bool(task and task.pass_k) or suite.startswith('math_jsonl:')


@dataclasses.dataclass(frozen=True)
class Settings:
  """`config.eval` (configs/eval.py documents each key)."""
  suites: Sequence[str] = dataclasses.field(default_factory=suite_names)
  modes: Sequence[str] = tokenizer_lib.MODES
  per_suite_language: int = 16
  bfcl_categories: Sequence[str] = ('simple_python', 'multiple', 'parallel')
  bfcl_per_category: int = 16
  champ_problems: int = 16
  sources: str = ''
  pass_k: Sequence[int] = (1, 4)
  pass_k_samples: int = 4
  pass_k_problems: int = 8
  pass_k_temperature: float = 1.0
  samples: int = 0
  max_examples: int = 0
  suite_max_new_tokens: Mapping[str, int] = dataclasses.field(default_factory=dict)
  compare: Sequence[str] = ()
  max_new_tokens: int = 160
  max_prompt_tokens: int = 768
  max_tool_turns: int = 2
  max_tool_result_tokens: int = 96
  batch_size: int = 32
  seed: int = 0

  @classmethod
  def from_config(cls, config: Any) -> 'Settings':
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {key: value.to_dict() if hasattr(value, 'to_dict') else value for key, value in dict(config).items()}
    unknown = sorted(set(values) - fields)
    if unknown:
      raise errors.UserError(f'config.eval has unknown keys {unknown}; known: {sorted(fields)}')
    settings = cls(**{k: (tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in values.items()})
    for name in settings.suites:
      if name not in suite_names():
        raise errors.UserError(f'config.eval.suites: unknown suite {name!r}; expected some of {suite_names()}')
    for mode in settings.modes:
      if mode not in tokenizer_lib.MODES:
        raise errors.UserError(f'config.eval.modes: unknown mode {mode!r}; expected some of {tokenizer_lib.MODES}')
    if settings.pass_k_samples and max(settings.pass_k) > settings.pass_k_samples:
      raise errors.UserError(f'config.eval.pass_k={settings.pass_k} needs pass_k_samples ≥ {max(settings.pass_k)}')
    for key in ('samples', 'max_examples'):
      if not isinstance(getattr(settings, key), int) or getattr(settings, key) < 0:
        raise errors.UserError(f'config.eval.{key}={getattr(settings, key)!r}: a count ≥ 0 (0: {"greedy" if key == "samples" else "all"})')
    for name, budget in settings.suite_max_new_tokens.items():
      if not isinstance(budget, int) or budget < 1:
        raise errors.UserError(f'config.eval.suite_max_new_tokens.{name}={budget!r}: a token budget ≥ 1')
    return settings

  def budget(self, suite: str) -> int:
    """The most tokens a reply of `suite` may generate."""
    return self.suite_max_new_tokens.get(suite, self.max_new_tokens)

  def within(self, context: int) -> 'Settings':
    """These settings with every budget cut to what a model of `context` positions leaves after the longest
    prompt (`max_prompt_tokens`): the paper's 32k budgets run on a model with less."""
    room = context - self.max_prompt_tokens
    if room < 1:
      return self   # prompts alone may fill it: each rollout checks what it is given
    return dataclasses.replace(self, max_new_tokens=min(self.max_new_tokens, room),
                               suite_max_new_tokens={k: min(v, room) for k, v in self.suite_max_new_tokens.items()})


class SuiteUnavailable(Exception):
  """A suite's data is not installed; the message says how to install it."""


# ---- suites ----------------------------------------------------------------------------------

def suite_examples(name: str, settings: Settings, tokenizer: tokenizer_lib.Tokenizer | None = None) -> list[Example]:
  """The fixed eval set of one suite (first N of each held-out source; NL2SQL curation counts `tokenizer`'s
  tokens, None: the bundled one's). Raises SuiteUnavailable."""
  per_language = settings.per_suite_language
  if _task(name):
    return prompts.prompt_set((name,), 'heldout', seed=settings.seed, per_language=per_language, tokenizer=tokenizer)
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
  if name in BENCHMARKS:
    return benchmarks.load(name)[:settings.max_examples or None]
  raise ValueError(f'unknown suite {name!r}; expected one of {suite_names()}')


SOURCES_KEY = 'config.eval.sources'


def source_suites(settings: Settings, tokenizer: tokenizer_lib.Tokenizer | None
                  ) -> tuple[dict[str, list[Example]], list[sources.Report]]:
  """The suites of `settings.sources`, by name (`<format>:<file stem or bundled name>`), and a report per source."""
  suites, reports = {}, []
  for source in sources.parse(settings.sources, key=SOURCES_KEY, formats=sources.PROMPT_FORMATS):
    is_file = source.format not in ('bundled', 'bfcl')
    name = f'{source.format}:{source.path.stem if is_file else source.location}'
    if name in suites or name in suite_names():
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
  return reward.Verdict(correct=follows, format_ok=bool((response or '').strip()), language_mismatch=False)


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


def _pass_at_k(repeated: Sequence[Example], verdicts: Sequence[reward.Verdict], samples: int,
               ks: Sequence[int]) -> dict[str, float]:
  """Unbiased pass@k over problems (`samples` replies each, in order), the scorable problems counted."""
  correct, scorable = collections.Counter(), set()
  for example, verdict in zip(repeated, verdicts):
    if verdict.correct is not None:
      scorable.add(example.id)
      correct[example.id] += bool(verdict.correct)
  metrics = {f'pass_at_{k}': evals.mean(pass_at_k(samples, correct[i], k) for i in sorted(scorable))
             for k in ks if k <= samples}
  return metrics | {'pass_at_k_problems': len(scorable)}


def sampled_pass_at_k(suite: str, respond: evals.Respond, examples: Sequence[Example], settings: Settings,
                      judge=None) -> dict[str, float]:
  """pass@k in reasoning mode from `pass_k_samples` replies per problem at `pass_k_temperature`."""
  problems = prompts.first_per_language(examples, settings.pass_k_problems)
  repeated = [e for e in problems for _ in range(settings.pass_k_samples)]
  replies = respond(repeated, 'reasoning', settings.pass_k_temperature, settings.seed + 1, settings.budget(suite))
  return _pass_at_k(repeated, score_all(suite, repeated, replies, judge), settings.pass_k_samples, settings.pass_k)


def sampled_benchmark(suite: str, respond: evals.Respond, examples: Sequence[Example], mode: str,
                      settings: Settings, judge=None) -> tuple[dict[str, float], list[evals.Result]]:
  """A paper math set as the paper scores it: `samples` replies per problem at `pass_k_temperature`;
  correctness is their mean (pass@1 averaged over samples), with pass@k for each `pass_k` ≤ samples."""
  repeated = [e for e in examples for _ in range(settings.samples)]
  replies = respond(repeated, mode, settings.pass_k_temperature, settings.seed, settings.budget(suite))
  results = list(zip(repeated, replies, score_all(suite, repeated, replies, judge)))
  metrics = suite_metrics(suite, results) | _pass_at_k(repeated, [v for *_, v in results], settings.samples,
                                                       settings.pass_k)
  return metrics | {'examples': len(examples), 'samples': settings.samples}, results


def _check_judge(settings: Settings, judge) -> None:
  if 'mtbench' in settings.suites and judge is None:
    raise errors.UserError(mtbench.NO_JUDGE)


def _plan(settings: Settings, tokenizer: tokenizer_lib.Tokenizer, from_sources: dict[str, list[Example]],
          judge) -> tuple[list[tuple[str, str, list[Example]]], dict[str, str]]:
  """(suite, mode or 'pass@k', examples) in the order they run, and {suite: why} for those left out."""
  plan, skipped = [], {}
  _check_judge(settings, judge)
  for name in (*settings.suites, *from_sources):
    if name == 'mtbench':   # its questions are two turns: engine.mtbench builds and answers them
      plan += [(name, mode, []) for mode in settings.modes]
      continue
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
    if has_pass_k(name) and 'reasoning' in settings.modes and settings.pass_k_samples:
      plan.append((name, 'pass@k', examples))
  return plan, skipped


def evaluate(respond: evals.Respond, tokenizer: tokenizer_lib.Tokenizer, settings: Settings, *,
             progress: bool = True, from_sources: dict[str, list[Example]] | None = None, judge=None
             ) -> dict[str, Any]:
  """Every suite × mode: {'suites': {suite: {mode: metrics}}, 'overall': {mode: metrics}, 'skipped':
  {suite: why}}; a tqdm bar runs across the suites, and each suite's replies have their own. `from_sources`:
  `source_suites`' suites, if read already; `judge` (`engine.judging.make`) decides what the verifiers cannot,
  and rates MT-Bench (which needs one: a UserError naming config.judge otherwise)."""
  if from_sources is None:
    from_sources, _ = source_suites(settings, tokenizer)
  plan, skipped = _plan(settings, tokenizer, from_sources, judge)
  out = {'suites': collections.defaultdict(dict), 'overall': {}, 'skipped': skipped}
  pooled = collections.defaultdict(list)
  bar = tqdm.tqdm(plan, desc='eval', unit='suite', disable=not progress or jax.process_index() != 0)
  for name, mode, examples in bar:
    bar.set_postfix_str(f'{name}/{mode}' + (f' ({len(examples)} prompts)' if examples else ''))
    if mode == 'pass@k':
      out['suites'][name]['reasoning'].update(sampled_pass_at_k(name, respond, examples, settings, judge))
      continue
    if name == 'mtbench':
      budgeted = lambda e, m, t=0.0, seed=0, _=None: respond(e, m, t, seed, settings.budget(name))
      out['suites'][name][mode] = mtbench.evaluate(budgeted, judge, mode, seed=settings.seed,
                                                   max_examples=settings.max_examples or None)
      continue
    if name in BENCHMARKS and settings.samples:
      out['suites'][name][mode], results = sampled_benchmark(name, respond, examples, mode, settings, judge)
    else:
      replies = respond(examples, mode, 0.0, settings.seed, settings.budget(name))
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


# The paper's Tables 3 and 4: (row, our suite or None, the language of its figure or None, the paper's figures for
# LuckyStar 111B and Command A, why a row has no suite of ours). A user's own copy of a set that cannot be shipped
# fills its row when named as below in config.eval.sources (docs/evaluation.md).
TABLE_3 = (
    ('Korean AIME 2024', 'math_jsonl:aime24_ko', None, 69.3, 10.0, 'give a Korean copy as math_jsonl:…/aime24_ko.jsonl'),
    ('Korean MATH 500', 'math_jsonl:math500_ko', None, 93.6, 76.2, 'give a Korean copy as math_jsonl:…/math500_ko.jsonl'),
    ('English AIME 2024', 'aime24', None, 73.7, 13.3, ''),
    ('English MATH 500', 'math500', None, 94.0, 79.6, ''),
    ('English AIME 2025', 'aime25', None, None, None, ''),
    ('English GSM8K', 'gsm8k', None, None, None, ''),
    ('NL2SQL (paper: Cohere-internal; ours: bundled held-out)', 'nl2sql', None, 38.0, 7.3, ''),
    ('BFCL (paper: v3; ours: v4 simple / multiple / parallel)', 'bfcl', None, 70.6, 64.4, ''),
    ('LG Agentic Eval', None, None, 4.85, 2.67, 'internal to LG CNS, not public'),
)
TABLE_4 = (
    ('Korean KMMLU', 'kobalt_jsonl:kmmlu', None, 68.6, 64.9, 'not redistributable: give kobalt_jsonl:…/kmmlu.jsonl'),
    ('Korean ARC-C', 'kobalt_jsonl:arc_c_ko', None, 89.2, 88.8, 'give a Korean copy as kobalt_jsonl:…/arc_c_ko.jsonl'),
    ('Korean instruction following (paper: IFEval)', 'instruction_following', 'ko', 77.8, 77.2, ''),
    ('Korean MT-Bench', None, None, 8.09, 8.18, 'no Korean MT-Bench is shipped or read yet'),
    ('English MMLU', 'kobalt_jsonl:mmlu', None, 82.7, 83.9, 'give kobalt_jsonl:…/mmlu.jsonl'),
    ('English ARC-C', 'kobalt_jsonl:arc_c', None, 93.8, 93.4, 'give kobalt_jsonl:…/arc_c.jsonl'),
    ('English instruction following (paper: IFEval)', 'instruction_following', 'en', 89.4, 90.9, ''),
    ('English MT-Bench', 'mtbench', None, 8.45, 8.34, ''),
)
PAPER_MODELS = ('LuckyStar 111B (paper)', 'Command A (paper)')


def _figure(results: dict[str, Any], suite: str, language: str | None) -> float | None:
  """A suite's headline figure in reasoning mode (else its first mode): MT-Bench's score, else correctness (pass@1
  averaged over samples for a sampled math set) in %; None where it did not run."""
  modes = results['suites'].get(suite, {})
  metrics = modes.get('reasoning') or next(iter(modes.values()), None)
  if metrics is None:
    return None
  value = metrics.get('score') if suite == 'mtbench' else metrics.get(
      'correctness' if language is None else f'correctness/{language}')
  return None if value is None or math.isnan(value) else (value if suite == 'mtbench' else 100 * value)


def paper_tables(results: dict[str, Any]) -> list[str]:
  """The paper's Table 3 and Table 4 layouts: one column per evaluated model (`config.eval.compare`), the
  paper's own figures beside them, and for a blank row the reason."""
  models = {results['init_from']: results, **results.get('compare', {})}
  lines = []
  for title, rows in (('Table 3: reasoning and tool use (pass@1 / accuracy, %)', TABLE_3),
                      ('Table 4: knowledge, instruction following, MT-Bench', TABLE_4)):
    lines += ['', f'## Paper {title}', '', '| | ' + ' | '.join(f'`{m}`' for m in models) + ' | '
              + ' | '.join(PAPER_MODELS) + ' | blank because |', '|---|' + '---|' * (len(models) + 3)]
    for row, suite, language, *paper, why in rows:
      ours = [None if suite is None else _figure(r, suite, language) for r in models.values()]
      reasons = [why or (f'{suite} not in config.eval.suites' if suite in suite_names() else f'no {suite} source')
                 for value in ours if value is None]
      digits = 2 if suite == 'mtbench' or suite is None and paper[0] < 10 else 1   # scores 1–10, not %
      cell = lambda v: '–' if v is None or isinstance(v, float) and math.isnan(v) else f'{v:.{digits}f}'
      lines.append(f'| {row} | ' + ' | '.join(map(cell, [*ours, *paper])) + f' | {reasons[0] if reasons else ""} |')
  lines += ['', 'The paper\'s columns are its Tables 3 and 4 (LuckyStar 111B in FP8; MT-Bench judged by GPT-4), '
            'for reference: a bundled 5M model scores near zero on these sets, as expected.']
  return lines


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
    cell = lambda m: _num(get(name, m, 'score')) if name == 'mtbench' else _pct(get(name, m, 'correctness'))
    lines.append(f'| {name} | {headline(name)} | ' + ' | '.join(cell(m) for m in modes)
                 + f' | {int(any_mode.get("examples", 0))} | '
                 + ' / '.join(str(get(name, m, 'unscorable') if get(name, m, 'unscorable') is not None else '–')
                              for m in modes) + ' |')
  pass_rows = [name for name in suites if 'pass_at_k_problems' in suites[name].get('reasoning', {})]
  if pass_rows:
    ks = results['settings']['pass_k']
    lines += ['', f'## pass@k (reasoning mode, sampled at temperature {results["settings"]["pass_k_temperature"]})',
              '', '| suite | problems | samples each | ' + ' | '.join(f'pass@{k}' for k in ks) + ' |',
              '|---|---|---|' + '---|' * len(ks)]
    for name in pass_rows:
      samples = get(name, 'reasoning', 'samples') or results['settings']['pass_k_samples']
      lines.append(f'| {name} | {get(name, "reasoning", "pass_at_k_problems")} | {samples} | '
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
  lines += paper_tables(results)
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


def _evaluate_model(config, init_from: str, settings: Settings, mesh, judge
                    ) -> tuple[dict[str, Any], list[sources.Report]]:
  """(`evaluate` of one model, its sources' reports): the model as `state.load_model` reads `init_from`,
  sharded over every process's devices; every source record is checked before any reply."""
  config = config.copy_and_resolve_references()
  config.init_from = init_from
  loaded = state_lib.load_model(config, mesh)
  settings = settings.within(loaded.config.max_position_embeddings)
  from_sources, reports = source_suites(settings, loaded.tokenizer)
  respond = evals.model_respond(loaded.config, loaded.params, loaded.tokenizer, settings)
  with sharding.activate(mesh):
    return evaluate(respond, loaded.tokenizer, settings, from_sources=from_sources, judge=judge), reports


def run(config, workdir: str) -> None:
  settings = Settings.from_config(config.eval)
  mesh = sharding.make_mesh(dict(config.mesh))
  judge = judging.make(config, workdir)
  _check_judge(settings, judge)   # before any model is loaded
  evaluated, reports = _evaluate_model(config, config.init_from, settings, mesh, judge)
  artifacts.write_data_report(workdir, reports)
  results = {'init_from': config.init_from, 'settings': dataclasses.asdict(settings), **evaluated}
  # More models on the same suites, one at a time, for the report's columns (the base, the policy, its export).
  results['compare'] = {other: _evaluate_model(config, other, settings, mesh, judge)[0] for other in settings.compare}
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
  keys = [f'eval/{name}/{mode}/{"score" if name == "mtbench" else "correctness"}'
          for name in results['suites'] for mode in modes]
  keys += [f'eval/overall/{mode}/language_mismatch' for mode in modes]
  skipped = [('skipped', ', '.join(results['skipped']))] if results['skipped'] else []
  return metrics_lib.summarize(workdir, keys, title=f'eval of {results["init_from"]}',
                               outputs=[*skipped, ('report', workdir / 'report.md'),
                                        ('results', workdir / 'results.json'),
                                        ('charts', workdir / metrics_lib.PLOTS_DIR)])
