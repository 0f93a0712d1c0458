"""CHAMP competition math problems (270, English, with final answers), read from the `champ-dataset`
package (docs/data.md): real problems for the eval stage's math suite.

    pip install champ-dataset

We only locate its data file (`champ_dataset/dataset_files/v0.json`) and never import the package
(its `__init__` needs `natsort`). Each problem becomes a held-out math Example whose gold is the
package's `_answer`; answers math-verify cannot parse (prose such as "no such m") score as unscorable.
"""

import importlib.util
import pathlib

from luckystar import files
from luckystar.data.examples import Example

PACKAGE = 'champ_dataset'
INSTALL_HINT = 'pip install champ-dataset'


def data_file() -> pathlib.Path:
  """The package's problem file, found without importing the package."""
  spec = importlib.util.find_spec(PACKAGE)
  if spec is None:
    raise FileNotFoundError(f'CHAMP problems need the `champ-dataset` package: `{INSTALL_HINT}`')
  path = pathlib.Path(list(spec.submodule_search_locations)[0]) / 'dataset_files' / 'v0.json'
  if not path.is_file():
    raise FileNotFoundError(f'{path}: `champ-dataset` is installed without its data file; reinstall it: '
                            f'`{INSTALL_HINT}`')
  return path


def available() -> bool:
  return importlib.util.find_spec(PACKAGE) is not None


def load(path: str | pathlib.Path | None = None) -> list[Example]:
  """Every problem as a math Example (split 'heldout'), in the file's order."""
  path = data_file() if path is None else pathlib.Path(path)
  try:
    problems = files.read_json(path)['problems']
    if not isinstance(problems, dict):
      raise TypeError('"problems" is not an object')
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f'{path}: not a CHAMP dataset file ({e!r}); expected {{"problems": {{id: ...}}}}') from None
  examples = []
  for key, problem in problems.items():
    if not (isinstance(problem, dict) and isinstance(problem.get('_text'), str)
            and isinstance(problem.get('_answer'), str)):
      raise ValueError(f'{path}: problem {key!r} lacks a "_text" or "_answer" string')
    steps = [s.get('_text', '') for s in (problem.get('solution') or {}).get('steps', [])]
    examples.append(Example(id=f'champ-{key}', task='math', language='en', split='heldout', prompt=problem['_text'],
                            answer=problem['_answer'], thinking=' '.join(steps) or None,
                            meta={'category': problem.get('category')}))
  return examples
