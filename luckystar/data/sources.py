"""Data sources named in configs: `config.<stage>.sources`, comma-separated `FORMAT:PATH[@WEIGHT]` items.

    sft.sources = 'bundled:conversations/reasoning@0.8,bundled:conversations/concise@0.2,chat_jsonl:my.jsonl@0.1'
    rlvr.sources = 'bundled:math,math_jsonl:/data/gsm8k.jsonl,bird:/data/bird/dev.json'

Formats (docs/data.md has a record of each):

    bundled           data luckystar generates: a task's suite (`bundled:math`) for prompts, a conversation data set
                      (`bundled:conversations`, one of its sources `bundled:conversations/reasoning`) for SFT, or a
                      name an experiment registered (`register_sft`, `register_prompts`)
    chat_jsonl        {"messages": [{"role", "content"}, ...], "mode"?}: assistant messages may carry `thinking`
                      and OpenAI `tool_calls`; every assistant turn is trained
    rs_traces         the rejection_sampling stage's rs_traces.jsonl (token ids of the same tokenizer)
    math_jsonl        {"problem" | "question", "answer"}
    spider, bird      DIR/<split>.json with databases in DIR/database/ (Spider) or DIR/<split>_databases/ (BIRD)
    bfcl              bfcl:<category> from the installed bfcl-eval package
    kobalt_jsonl      {"question", "answer": a letter, "options"?}
    preference_jsonl  TRL's layout: {"prompt", "chosen", "rejected"}, strings or message lists
    dpo_pairs         the dpo stage's dpo_pairs.jsonl (token ids of the same tokenizer)

A weight is the source's share of sampled examples (normalised over the stage's sources; default 1).
A file source's records all belong to the split its stage reads (a training stage's: train; the eval stage's:
held-out); a bundled suite keeps its own split. Every record is read and checked before a stage's first step:
a malformed one is a `DataError` naming file:line and the field; records dropped for a reason (NL2SQL curation,
duplicates, too long) are counted in the stage's `Report`.
"""

import collections
import dataclasses
import hashlib
import json
import math
import pathlib
import re
import sys
import unicodedata
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from luckystar import errors, files
from luckystar.data import bfcl, loaders, nl2sql
from luckystar.data.examples import Example, dedupe
from luckystar.data.loaders import DataError
from luckystar.rewards import language as rewards_language
from luckystar.tokenizer import MODES, Tokenizer

FORMATS = ('bundled', 'chat_jsonl', 'rs_traces', 'math_jsonl', 'spider', 'bird', 'bfcl', 'kobalt_jsonl',
           'preference_jsonl', 'dpo_pairs')
CONVERSATION_FORMATS = ('bundled', 'chat_jsonl', 'rs_traces')   # SFT
PROMPT_FORMATS = ('bundled', 'math_jsonl', 'spider', 'bird', 'bfcl', 'kobalt_jsonl')   # RS, RLVR, eval
PREFERENCE_FORMATS = ('preference_jsonl', 'dpo_pairs')   # DPO
FILE_FORMATS = ('chat_jsonl', 'rs_traces', 'math_jsonl', 'kobalt_jsonl', 'preference_jsonl', 'dpo_pairs')
# grain scales a mixture's weights to integers by 100 / the smallest: a larger ratio overflows long before
# 1e300, and a source drawn once in 10^9 examples is never drawn in a run at all.
MAX_WEIGHT_RATIO = 1e9
# Spider and BIRD: the questions file and the directory of its databases beside it.
DATABASE_DIRS = {'spider': lambda questions: questions.parent / 'database',
                 'bird': lambda questions: questions.parent / f'{questions.stem}_databases'}


@dataclasses.dataclass(frozen=True)
class Source:
  """One item of a `sources` string: `format:location@weight`, from config key `key`."""
  format: str
  location: str        # a path, a bundled name, or a BFCL category
  weight: float
  key: str             # e.g. 'config.sft.sources', for messages

  @property
  def label(self) -> str:
    return f'{self.format}:{self.location}'

  @property
  def path(self) -> pathlib.Path:
    return pathlib.Path(self.location)


def parse(spec: str | Sequence[str], *, key: str, formats: Sequence[str] = FORMATS) -> list[Source]:
  """The items of a sources string (or a list of items); a UserError naming `key` for a bad item: an unknown
  format or one this stage does not take, an empty location, a weight that is not a number > 0, a repeat.
  Paths are checked to exist here too, before anything is loaded."""
  items = [item.strip() for item in (spec.split(',') if isinstance(spec, str) else spec)]
  sources = []
  for item in items:
    if not item:
      if isinstance(spec, str) and spec.strip():
        raise errors.UserError(f'{key}={spec!r} has an empty item (a doubled or trailing comma)')
      continue
    form, colon, rest = item.partition(':')
    if not colon or form not in FORMATS:
      raise errors.UserError(f'{key}: {item!r} is not FORMAT:PATH[@WEIGHT]; formats: {FORMATS}')
    if form not in formats:
      raise errors.UserError(f'{key}: {item!r}: this stage takes {formats}, not {form}')
    location, weight = rest, 1.0
    if '@' in rest:
      head, _, tail = rest.rpartition('@')
      try:
        location, weight = head, float(tail)
      except ValueError:
        pass   # an '@' inside a path (or a pipeline reference '@stage/...'), not a weight
    if not location:
      raise errors.UserError(f'{key}: {item!r} names no {"name" if form in ("bundled", "bfcl") else "path"}')
    if not sys.float_info.min <= weight < math.inf:   # NaN too; a subnormal weight overflows when normalised
      raise errors.UserError(f'{key}: {item!r}: the weight must be a number > 0 (a finite float of at least '
                             f'{sys.float_info.min:.3g})')
    source = Source(form, location, weight, key)
    if source.label in {s.label for s in sources}:
      raise errors.UserError(f'{key} names {source.label} twice')
    _check_exists(source)
    sources.append(source)
  if sources and (ratio := max(s.weight for s in sources) / min(s.weight for s in sources)) > MAX_WEIGHT_RATIO:
    raise errors.UserError(f'{key}={spec!r}: the largest weight is {ratio:.3g} times the smallest (at most '
                           f'{MAX_WEIGHT_RATIO:g}); a source drawn that rarely is never seen')
  return sources


def _check_exists(source: Source) -> None:
  if source.format in FILE_FORMATS:
    _check_file(source, f'{source.location}: no such file ({source.key}, {source.format})')
  if source.format in DATABASE_DIRS:
    _check_file(source, f'{source.location}: no such {source.format} questions file ({source.key}; expected '
                        f'DIR/<split>.json)')
    if not (databases := DATABASE_DIRS[source.format](source.path)).is_dir():
      raise errors.MissingFile(f'{databases}: no such directory: the databases of {source.location} '
                               f'({source.key}, {source.format} layout)')


def _check_file(source: Source, missing: str) -> None:
  """A FIFO would block the read and a device never end it: only a regular file (or a link to one) is data."""
  try:
    files.regular_file(source.path)
  except errors.MissingFile:
    raise errors.MissingFile(missing) from None
  except errors.InvalidFile:
    raise errors.InvalidFile(f'{source.location}: not a regular file (a FIFO, device or directory) ({source.key}, '
                             f'{source.format})') from None


def weights(sources: Iterable[Source]) -> dict[str, float]:
  return {source.label: source.weight for source in sources}


def digest(source: Source) -> str:
  """sha256 (16 hex) of what a file source reads: the file, and a Spider/BIRD directory's databases too; ''
  for bundled data (its seed and code decide it) and BFCL (the installed package's version does)."""
  if source.format in ('bundled', 'bfcl'):
    return ''
  paths = [source.path]
  if source.format in DATABASE_DIRS:
    paths += sorted(DATABASE_DIRS[source.format](source.path).rglob('*.sqlite'))
  hasher = hashlib.sha256()
  for path in paths:
    files.regular_file(path, f'{source.format} data ({source.key})')   # a FIFO or /dev/zero would never end
    hasher.update(str(path.name).encode() + b'\0')
    with open(path, 'rb') as f:
      for block in iter(lambda: f.read(1 << 20), b''):
        hasher.update(block)
  return hasher.hexdigest()[:16]


def fingerprint(sources: Iterable[Source]) -> list[str]:
  """For artifact fingerprints: each item as written, with its content digest where it is a file."""
  return [f'{s.label}@{s.weight:g}' + (f'#{d}' if (d := digest(s)) else '') for s in sources]


# ---- reports ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Report:
  """What a stage read from one source: records kept, and dropped by reason."""
  label: str
  kept: int = 0
  dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  digest: str = ''
  questions: list[str] = dataclasses.field(default_factory=list, repr=False)   # for the overlap check

  def as_dict(self) -> dict[str, Any]:
    return {'kept': self.kept, 'dropped': {k: n for k, n in sorted(self.dropped.items()) if n}, 'digest': self.digest}

  def line(self) -> str:
    dropped = ', '.join(f'{n} {reason}' for reason, n in sorted(self.dropped.items()) if n)
    return f'{self.label}: {self.kept} kept' + (f'; dropped {dropped}' if dropped else '')


def normalise_question(text: str) -> str:
  """The question as the overlap check compares it: NFKC, case-folded, punctuation and spacing dropped."""
  text = unicodedata.normalize('NFKC', text).casefold()
  return ' '.join(re.sub(r'[^\w\s]', ' ', text).split())


def overlap(train: Iterable[str], evaluated: Iterable[str]) -> dict[str, Any]:
  """Questions shared between training data and an eval set: exact text matches, matches after
  `normalise_question`, and up to 5 of the shared questions."""
  train = list(train)
  exact = set(train) & set(evaluated := list(evaluated))
  normalised_train = {normalise_question(t) for t in train}
  normalised = [q for q in evaluated if normalise_question(q) in normalised_train]
  return {'exact': len(exact), 'normalised': len(set(normalised)), 'examples': sorted(set(normalised))[:5]}


# ---- verifiable prompts (rejection sampling, RLVR, eval) ---------------------------------------------


def prompt_examples(source: Source, *, split: str, seed: int, tokenizer: Tokenizer | None,
                    bundled: Callable[[str], list[Example]]) -> tuple[list[Example], Report]:
  """The examples of one prompt source and its report. `bundled(name)` gives a bundled suite's examples (the
  stage picks its split and filters); a file's records all get `split`. NL2SQL from Spider/BIRD is curated
  (`nl2sql.curate`, result lengths in `tokenizer`'s tokens); repeats of a (task, prompt, system) are dropped."""
  report = Report(source.label, digest=digest(source))
  if source.format == 'bundled':
    examples = list(bundled(source.location))
  elif source.format == 'math_jsonl':
    examples = loaders.load_math_jsonl(source.path, split=split)
  elif source.format == 'kobalt_jsonl':
    examples = loaders.load_kobalt_jsonl(source.path, split=split)
  elif source.format == 'bfcl':
    if source.location not in (known := bfcl.categories() if _bfcl_installed() else ()):
      raise errors.UserError(f'{source.key}: {source.label}: ' + (
          f'no BFCL category {source.location!r}; categories: {known}' if known else
          f'the bfcl-eval package is not installed: `{bfcl.INSTALL_HINT}`'))
    examples = [dataclasses.replace(bfcl.to_example(e, source.location), split=split)
                for e in bfcl.load(source.location)]
  elif source.format in DATABASE_DIRS:
    examples = loaders.load_spider(source.path, DATABASE_DIRS[source.format](source.path), split=split)
    count_tokens = (lambda text: len(tokenizer.encode(text))) if tokenizer else (lambda text: len(text.split()))
    examples, curation = nl2sql.curate(examples, count_tokens)
    report.dropped.update({f'nl2sql_{reason}': n for reason, n in curation.items() if reason != 'kept' and n})
  else:
    raise errors.UserError(f'{source.key}: {source.label} is not a prompt source; prompt formats: {PROMPT_FORMATS}')
  if source.format != 'bundled':   # ids unique across sources (two files may share a stem)
    examples = [dataclasses.replace(e, id=f'{source.format}:{e.id}') for e in examples]
  unique = dedupe(examples)
  if repeats := len(examples) - len(unique):
    report.dropped['duplicate'] += repeats
  report.kept, report.questions = len(unique), [e.prompt for e in unique]
  return unique, report


def _bfcl_installed() -> bool:
  try:
    bfcl.data_dir()
  except FileNotFoundError:
    return False
  return True


# ---- conversations (SFT) -------------------------------------------------------------------------------

_ROLES = ('system', 'user', 'assistant', 'tool')


def chat_messages(record: dict, where: str) -> tuple[list[dict], str]:
  """A chat_jsonl record → (messages as `Tokenizer.render` takes them, mode). `where` is 'file:line'."""
  messages = record.get('messages')
  if not isinstance(messages, list) or not messages:
    raise DataError(f'{where}: field "messages" must be a non-empty list of {{"role", "content"}} objects')
  converted, thinks = [], False
  for index, message in enumerate(messages):
    at = f'{where}: messages[{index}]'
    if not isinstance(message, dict) or message.get('role') not in _ROLES:
      raise DataError(f'{at}: expected an object with "role" one of {_ROLES}')
    role = message['role']
    if role == 'system' and index:
      raise DataError(f'{at}: a system message may only come first')
    if role != 'assistant':
      content = message.get('content')
      if not isinstance(content, str):
        raise DataError(f'{at}: field "content" of a {role} message must be a string')
      converted.append({'role': role, 'content': content})
      continue
    turn = {'role': 'assistant'}
    thinking = message.get('thinking', message.get('reasoning_content'))
    if thinking is not None:
      if not isinstance(thinking, str) or not thinking.strip():
        raise DataError(f'{at}: field "thinking" must be a non-empty string')
      turn['thinking'], thinks = thinking, True
    if message.get('tool_calls'):
      turn['action'] = _action(message['tool_calls'], at)
    content = message.get('content')
    if content is not None and not isinstance(content, str):
      raise DataError(f'{at}: field "content" of an assistant message must be a string or null')
    if content and content.strip():
      turn['response'] = content
    if len(turn) == 1:
      raise DataError(f'{at}: an assistant message needs "content", "thinking" or "tool_calls"')
    converted.append(turn)
  if not any(m['role'] == 'assistant' for m in converted):
    raise DataError(f'{where}: field "messages" has no assistant message, so nothing to train on')
  mode = record.get('mode', 'reasoning' if thinks else 'concise')
  if mode not in MODES:
    raise DataError(f'{where}: field "mode" must be one of {MODES}, got {mode!r}')
  if mode == 'concise' and thinks:
    raise DataError(f'{where}: field "mode" is "concise" but an assistant message has "thinking"')
  return converted, mode


def _action(tool_calls, where: str) -> str:
  """OpenAI `tool_calls` → our action text (one call object, or a list of them)."""
  if not isinstance(tool_calls, list):
    raise DataError(f'{where}: field "tool_calls" must be a list')
  calls = []
  for index, call in enumerate(tool_calls):
    function = call.get('function') if isinstance(call, dict) else None
    name = function.get('name') if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
      raise DataError(f'{where}: tool_calls[{index}] needs {{"type": "function", "function": {{"name", "arguments"}}}}')
    arguments = function.get('arguments', {})
    if isinstance(arguments, str):   # OpenAI sends them as a JSON string
      at = f'{where}: tool_calls[{index}].function.arguments'
      try:
        arguments = files.loads(arguments, at) if arguments.strip() else {}
      except errors.InvalidFile as e:
        raise DataError(f'{at} is not JSON: {str(e).removeprefix(f"{at}: ").removeprefix("invalid JSON: ")}'
                        ) from None
    if not isinstance(arguments, dict):
      raise DataError(f'{where}: tool_calls[{index}].function.arguments must be a JSON object')
    calls.append({'tool_name': name, 'parameters': arguments})
  return json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)


def render_chat(tokenizer: Tokenizer, messages: list[dict], mode: str, where: str) -> dict:
  """{'tokens', 'loss_mask'} of a converted conversation; a render failure names `where`."""
  try:
    ids, mask = tokenizer.render(messages, mode)
  except ValueError as e:
    raise DataError(f'{where}: {e}') from None
  return {'tokens': np.asarray(ids, np.int32), 'loss_mask': np.asarray(mask, np.int32)}


def chat_conversations(source: Source, tokenizer: Tokenizer) -> tuple[list[dict], Report]:
  """The rendered conversations of a chat_jsonl source (every record checked first) and its report."""
  report = Report(source.label, digest=digest(source))
  items, seen = [], set()
  for line, record in loaders.read_records(source.path):
    messages, mode = chat_messages(record, f'{source.location}:{line}')
    key = json.dumps([messages, mode], sort_keys=True, ensure_ascii=False)
    if key in seen:
      report.dropped['duplicate'] += 1
      continue
    seen.add(key)
    items.append(render_chat(tokenizer, messages, mode, f'{source.location}:{line}'))
    report.questions += questions_of(messages)
  report.kept = len(items)
  return items, report


def questions_of(messages: Sequence[dict]) -> list[str]:
  """The user turns of a conversation: what the overlap check compares with eval questions."""
  return [m['content'] for m in messages if m['role'] == 'user']


# ---- preferences (DPO) -------------------------------------------------------------------------------


def _turns(value, field: str, where: str, *, reply: bool) -> list[dict]:
  """A TRL field: a plain string (the user's prompt or the assistant's reply) or a list of messages."""
  if isinstance(value, str):
    if not value.strip():
      raise DataError(f'{where}: field {field!r} is empty')
    return [{'role': 'assistant', 'content': value}] if reply else [{'role': 'user', 'content': value}]
  if not isinstance(value, list) or not value:
    raise DataError(f'{where}: field {field!r} must be a string or a non-empty list of messages')
  return value


def preference_pairs(source: Source, tokenizer: Tokenizer) -> tuple[list[dict], Report]:
  """A TRL preference file → pair records as the dpo stage's trainer reads them (chosen_/rejected_ tokens and
  loss masks, kind 'preference'), and its report. The prompt may hold a system message and earlier turns; each
  of chosen and rejected is the assistant's reply (one or more assistant turns, tool turns between)."""
  report = Report(source.label, digest=digest(source))
  pairs, seen = [], set()
  for line, record in loaders.read_records(source.path):
    where = f'{source.location}:{line}'
    for field in ('prompt', 'chosen', 'rejected'):
      if field not in record:
        raise DataError(f'{where}: missing field {field!r} (TRL preference layout: prompt, chosen, rejected)')
    prompt = _turns(record['prompt'], 'prompt', where, reply=False)
    sides = {}
    for side in ('chosen', 'rejected'):
      reply = _turns(record[side], side, where, reply=True)
      if reply[0].get('role') != 'assistant':
        raise DataError(f'{where}: field {side!r} must start with an assistant message')
      messages, mode = chat_messages({'messages': prompt + reply, **({'mode': record['mode']} if 'mode' in record
                                                                      else {})}, where)
      sides[side] = (render_chat(tokenizer, messages, mode, where), mode, messages)
    if sides['chosen'][1] != sides['rejected'][1]:
      raise DataError(f'{where}: chosen is in {sides["chosen"][1]} mode and rejected in {sides["rejected"][1]} '
                      f'mode (thinking in one only); give both or neither thinking, or set "mode"')
    key = json.dumps([record['prompt'], record['chosen'], record['rejected']], sort_keys=True, ensure_ascii=False)
    if key in seen:
      report.dropped['duplicate'] += 1
      continue
    seen.add(key)
    if sides['chosen'][0]['tokens'].tolist() == sides['rejected'][0]['tokens'].tolist():
      report.dropped['identical_sides'] += 1
      continue
    (chosen, mode, messages), (rejected, _, _) = sides['chosen'], sides['rejected']
    question = ' '.join(questions_of(messages))
    report.questions.append(question)
    pairs.append({
        'example_id': f'{source.format}:{source.path.stem}-{line}', 'task': 'chat', 'language': _language(question),
        'kind': 'preference', 'mode': mode, 'source': source.label, 'tokenizer': tokenizer.fingerprint,
        'question': question,
        'chosen_length': int(chosen['loss_mask'].sum()), 'rejected_length': int(rejected['loss_mask'].sum()),
        'rejected_correct': None,
        'chosen_tokens': chosen['tokens'].tolist(), 'chosen_loss_mask': chosen['loss_mask'].tolist(),
        'rejected_tokens': rejected['tokens'].tolist(), 'rejected_loss_mask': rejected['loss_mask'].tolist()})
  report.kept = len(pairs)
  return pairs, report


def _language(text: str) -> str:
  return rewards_language.classify_prompt(text) or 'en'   # the one prompt-language rule


# ---- registered data (experiments) -------------------------------------------------------------------
#
# SFT data: `register_sft(name, builder)`, `builder(tokenizer, seed=, split=)` → (sources, weights) as
# `conversations.sft_sources` returns them; `bundled:<name>` in `config.sft.sources` trains on all of it and
# `bundled:<name>/<source>` on one of its sources. RL prompts: `register_prompts(name, builder)`, `builder(seed)`
# → [Example] (split 'train'); `bundled:<name>` in `config.rlvr.sources` adds them to RL's train pool.
# Registering a name again replaces its builder (a module imported twice registers twice).

SftBuilder = Callable[..., tuple[dict[str, list], dict[str, float]]]
PromptBuilder = Callable[[int], list[Example]]

_SFT: dict[str, SftBuilder] = {}
_PROMPTS: dict[str, PromptBuilder] = {}


def _check_name(name: str) -> None:
  if not isinstance(name, str) or not name.isidentifier():
    raise ValueError(f'a data source name must be an identifier, got {name!r}')


def register_sft(name: str, builder: SftBuilder) -> None:
  """SFT data `name`: `builder(tokenizer, seed=seed, split=split)` → (sources, weights)."""
  _check_name(name)
  _SFT[name] = builder


def register_prompts(name: str, builder: PromptBuilder) -> None:
  """RL prompts `name`: `builder(seed)` → [Example] (split 'train'; cache it if it is slow to build)."""
  _check_name(name)
  _PROMPTS[name] = builder


def sft_names() -> tuple[str, ...]:
  return tuple(sorted(_SFT))


def prompt_names() -> tuple[str, ...]:
  return tuple(sorted(_PROMPTS))


def sft(name: str, tokenizer: Tokenizer | None, *, seed: int, split: str
        ) -> tuple[dict[str, list], dict[str, float]]:
  """Registered SFT data `name` of `split`; KeyError if none is registered."""
  return _SFT[name](tokenizer, seed=seed, split=split)


def prompts(name: str, *, seed: int) -> list[Example]:
  """Registered RL prompts `name`; KeyError if none is registered."""
  return list(_PROMPTS[name](seed))
