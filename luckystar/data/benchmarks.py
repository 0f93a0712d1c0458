"""The paper's public benchmarks, shipped inside the package (docs/evaluation.md#the-papers-benchmarks): GSM8K's
test set, MATH-500, AIME 2024 and AIME 2025 as held-out math Examples, and MT-Bench's 80 two-turn questions with
its four single-answer judge prompts.

`assets/benchmarks/SOURCES.json` records each file's source repository, path, commit, licence and sha256, and every
read checks the digest: an edited or truncated copy would score a different benchmark under the same name, so it
fails naming the file instead. Nothing here reaches the network.

    from luckystar.data import benchmarks
    benchmarks.load('aime24')[0].answer        # '204'
    benchmarks.mtbench()[0]['turns']           # [first question, follow-up]
"""

import copy
import functools
import gzip
import hashlib
import pathlib
from typing import Any

from luckystar import errors, files
from luckystar.data.examples import Example

DIRECTORY = pathlib.Path(__file__).parents[1] / 'assets' / 'benchmarks'
SOURCES_FILE = 'SOURCES.json'
MATH_SETS = ('gsm8k', 'math500', 'aime24', 'aime25')
MTBENCH, JUDGE_PROMPTS = 'mtbench', 'mtbench_judge_prompts'
REINSTALL = 'the installed package is damaged: reinstall luckystar (`pip install -e .` in a fresh clone)'


def records(directory: str | pathlib.Path = DIRECTORY) -> list[dict[str, Any]]:
  """The SOURCES.json entries (name, file, records, repository, paths, commit, licence, sha256 ...), one per
  shipped file, for docs and reports."""
  return copy.deepcopy(list(_sources(pathlib.Path(directory)).values()))


def load(name: str, directory: str | pathlib.Path = DIRECTORY) -> list[Example]:
  """Every problem of a math set (one of MATH_SETS) as an English held-out math Example, in file order; `answer`
  is the gold final answer as text, `meta` its source and, for MATH-500, subject and level."""
  if name not in MATH_SETS:
    raise errors.UserError(f'{name!r} is not a shipped math benchmark; these are: {", ".join(MATH_SETS)}')
  return list(_examples(name, pathlib.Path(directory)))


def mtbench(directory: str | pathlib.Path = DIRECTORY) -> list[dict[str, Any]]:
  """MT-Bench's 80 questions: {'id', 'category', 'turns': [q1, q2], 'reference': [r1, r2] or None}; the
  reference (GPT-4's, as FastChat's judge reads it) is there for the math, reasoning and coding categories."""
  return copy.deepcopy(list(_rows(MTBENCH, pathlib.Path(directory))))


def judge_prompts(directory: str | pathlib.Path = DIRECTORY) -> dict[str, dict[str, Any]]:
  """FastChat's single-answer judge prompts by name (single-v1, single-math-v1 and their -multi-turn forms):
  system_prompt, prompt_template (str.format fields such as {question}, {answer}, {ref_answer_1}),
  output_format '[[rating]]'."""
  return {p['name']: p for p in copy.deepcopy(_rows(JUDGE_PROMPTS, pathlib.Path(directory)))}


@functools.cache
def _examples(name: str, directory: pathlib.Path) -> tuple[Example, ...]:
  entry = _sources(directory)[name]
  source = f'{entry["repository"]}:{entry["paths"][0]}'
  examples = []
  for row in _rows(name, directory):
    meta = {'source': source, **{key: row[key] for key in ('subject', 'level') if key in row}}
    examples.append(Example(id=f'{name}-{row["id"]}', task='math', language='en', split='heldout',
                            prompt=row['problem'], answer=row['answer'], meta=meta))
  return tuple(examples)


@functools.cache
def _sources(directory: pathlib.Path) -> dict[str, dict[str, Any]]:
  path = directory / SOURCES_FILE
  try:
    entries = files.read_json(path, what='benchmark list')
  except errors.UserError as e:
    raise type(e)(f'{e}; {REINSTALL}') from None
  if not (isinstance(entries, list) and all(isinstance(e, dict) and {'name', 'file', 'records', 'sha256'} <= e.keys()
                                             for e in entries)):
    raise errors.InvalidFile(f'{path}: not a list of {{"name", "file", "records", "sha256", ...}} entries; '
                             f'{REINSTALL}')
  return {e['name']: e for e in entries}


@functools.cache
def _rows(name: str, directory: pathlib.Path) -> tuple[dict[str, Any], ...]:
  """The records of one shipped file, its sha256 and record count checked against SOURCES.json."""
  sources = _sources(directory)
  if name not in sources:
    raise errors.InvalidFile(f'{directory / SOURCES_FILE}: lists no {name!r}; {REINSTALL}')
  entry = sources[name]
  path = directory / entry['file']
  try:
    data = files.read_bytes(path, what=f'{name} benchmark file')
  except errors.UserError as e:
    raise type(e)(f'{e}; {REINSTALL}') from None
  if (digest := hashlib.sha256(data).hexdigest()) != entry['sha256']:
    raise errors.InvalidFile(f'{path}: sha256 {digest}, not the {entry["sha256"]} that {SOURCES_FILE} records '
                             f'(the file was changed or truncated); {REINSTALL}')
  if path.suffix == '.gz':
    data = gzip.decompress(data)   # the digest matched: this is the file we shipped
  rows = tuple(row for _, row in files.parse_jsonl(data.decode('utf-8'), path))
  if len(rows) != entry['records']:
    raise errors.InvalidFile(f'{path}: {len(rows)} records, not the {entry["records"]} that {SOURCES_FILE} '
                             f'records; {REINSTALL}')
  return rows
