"""BFCL v4 function-calling questions and gold answers, read from the `bfcl-eval` package (docs/data.md).

The package is installed data-only, because its own dependencies conflict with
ours (it pins numpy):

    pip install --no-deps bfcl-eval==2026.3.23

We never import it (its `__init__` may pull in those missing dependencies); we
only locate its files. Each category is two JSON-lines files joined by `id`:
`data/BFCL_v4_<category>.json` (question + function docs) and
`data/possible_answer/BFCL_v4_<category>.json` (ground truth). Only the
single-turn AST categories have ground truth of the shape we check
(`simple_python`, `multiple`, `parallel`, `parallel_multiple`, and the `live_*`
variants); `luckystar.rewards.function_call` scores answers against it.
"""

import dataclasses
import importlib.util
import json
import pathlib

from luckystar.data import function_calling
from luckystar.data.examples import Example
from luckystar.data.loaders import read_records
from luckystar.rewards import language as rewards_language

PACKAGE = 'bfcl_eval'
INSTALL_HINT = 'pip install --no-deps bfcl-eval==2026.3.23'


@dataclasses.dataclass(frozen=True)
class BfclExample:
  """One BFCL question.

  question: chat messages ({'role', 'content'}) of the first turn.
  functions: the function docs offered to the model (JSON-schema-like, `parameters.properties/required`).
  ground_truth: one {function_name: {arg: [allowed values...]}} per expected call; "" in an
    allowed list marks the argument as optional (may be omitted).
  """
  id: str
  question: list[dict]
  functions: list[dict]
  ground_truth: list[dict]


def data_dir() -> pathlib.Path:
  """The `bfcl_eval/data` folder of the installed package (found without importing it)."""
  spec = importlib.util.find_spec(PACKAGE)  # a top-level package: finds it, runs nothing
  if spec is None:
    raise FileNotFoundError(f'BFCL data needs the `bfcl-eval` package; install it data-only: `{INSTALL_HINT}`')
  roots = list(spec.submodule_search_locations or [pathlib.Path(spec.origin).parent])
  path = pathlib.Path(roots[0]) / 'data'
  if not path.is_dir():
    raise FileNotFoundError(f'{path}: `bfcl-eval` is installed without its data folder; '
                            f'reinstall it: `{INSTALL_HINT}`')
  return path


def categories(root: pathlib.Path | None = None) -> list[str]:
  """Categories that have both a question file and a possible-answer file."""
  root = data_dir() if root is None else pathlib.Path(root)
  return sorted(p.name.removeprefix('BFCL_v4_').removesuffix('.json')
                for p in root.glob('BFCL_v4_*.json') if (root / 'possible_answer' / p.name).is_file())


def _first_turn(question, where: str) -> list[dict]:
  """BFCL stores a list of turns, each a list of messages; older files hold the messages directly."""
  if isinstance(question, list) and question and isinstance(question[0], list):
    question = question[0]
  if not (isinstance(question, list) and question
          and all(isinstance(m, dict) and 'role' in m and 'content' in m for m in question)):
    raise ValueError(f'{where}: "question" must hold chat messages with "role" and "content"')
  return question


def _ground_truth(entries, where: str) -> list[dict]:
  if not isinstance(entries, list) or not entries:
    raise ValueError(f'{where}: "ground_truth" must be a non-empty list')
  for entry in entries:
    if not (isinstance(entry, dict) and len(entry) == 1 and isinstance(next(iter(entry.values())), dict)):
      raise ValueError(f'{where}: ground-truth entry {str(entry)[:200]} is not '
                       '{function_name: {arg: [allowed...]}}; '
                       'only the single-turn function-calling categories are supported')
    for arg, allowed in next(iter(entry.values())).items():
      if not isinstance(allowed, list):
        raise ValueError(f'{where}: allowed values of argument {arg!r} must be a list, got {allowed!r}')
  return entries


def load(category: str, root: str | pathlib.Path | None = None) -> list[BfclExample]:
  """Questions of one category joined with their gold answers, in file order.

  root: a folder laid out like `bfcl_eval/data` (default: the installed package's).
  """
  root = data_dir() if root is None else pathlib.Path(root)
  question_path = root / f'BFCL_v4_{category}.json'
  answer_path = root / 'possible_answer' / question_path.name
  for path in (question_path, answer_path):
    if not path.is_file():
      raise FileNotFoundError(f'{path}: no such file; BFCL categories with gold answers: {categories(root)}')

  answers = {}
  for line, record in read_records(answer_path):
    where = f'{answer_path}:{line}'
    if 'id' not in record or 'ground_truth' not in record:
      raise ValueError(f'{where}: a possible answer needs "id" and "ground_truth"')
    if record['id'] in answers:
      raise ValueError(f'{where}: duplicate id {record["id"]!r}')
    answers[record['id']] = _ground_truth(record['ground_truth'], where)

  examples = []
  for line, record in read_records(question_path):
    where = f'{question_path}:{line}'
    if 'id' not in record or 'question' not in record:
      raise ValueError(f'{where}: a question needs "id" and "question"')
    functions = record.get('function')
    functions = [functions] if isinstance(functions, dict) else functions
    if not (isinstance(functions, list) and all(isinstance(f, dict) and 'name' in f for f in functions)):
      raise ValueError(f'{where}: "function" must be a list of function docs with a "name"; '
                       'only the single-turn function-calling categories are supported')
    if record['id'] not in answers:
      raise ValueError(f'{where}: question {record["id"]!r} has no gold answer in {answer_path}')
    examples.append(BfclExample(id=record['id'], question=_first_turn(record['question'], where),
                                functions=functions, ground_truth=answers[record['id']]))
  return examples


def to_example(example: BfclExample, category: str) -> Example:
  """A BFCL question as our function-calling Example: the function docs in the system turn as our
  generated suite shows them, gold in `answer` (BFCL's ground-truth JSON) and `meta['functions']`, so
  `rewards.reward.score` applies the AST checker."""
  prompt = '\n'.join(m['content'] for m in example.question if m['role'] == 'user')
  return Example(id=f'bfcl-{example.id}', task='function_calling',
                 language=rewards_language.classify_prompt(prompt) or 'en', split='heldout', prompt=prompt,
                 answer=json.dumps(example.ground_truth, ensure_ascii=False),
                 system=function_calling.tool_system(example.functions),
                 meta={'category': category, 'functions': example.functions, 'ground_truth': example.ground_truth})
