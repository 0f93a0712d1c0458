"""Tool calls in the action section, and whether they are the right calls (docs/models.md).

Format: `luckystar.tools.calls` (`parse_calls`; None is a format error).

Correctness restates the AST checker of BFCL (`bfcl_eval/eval_checker/ast_eval/
ast_checker.py`) for JSON calls. Ground truth is one {name: {arg: [allowed...]}}
per expected call, "" in an allowed list meaning "may be omitted".
- As many calls as entries, paired one-to-one in any order.
- A call fits an entry when: the names are equal; every parameter the doc
  requires is given; every given parameter is defined by the doc and named in
  the entry; every given value is allowed; every entry argument not given is
  optional.
- A value is allowed when it equals one allowed value. The doc's declared type
  must hold (integer: an int, not a bool or float; float: int or float;
  boolean; array/tuple: list; dict: object; any: anything). Strings compare
  after `normalize_string` (case, spaces and `,./-_*^` ignored, ' same as ").
  Lists compare element-wise with the doc's `items` type. An allowed dict maps
  each key to its own allowed list: given keys must appear in it, missing keys
  must be optional, values compare recursively.
- A value that breaks the declared type still counts if it has the allowed
  value's type and equals it: BFCL writes some gold values as variables, e.g.
  "data['sales']" for an array.
Where we differ from BFCL, we are stricter or more consistent: a real
one-to-one matching (BFCL pairs greedily and can reject a correct parallel
answer); "" only marks omission, an explicit "" is not accepted; lists and
dicts compare at any depth (BFCL: one level); ints count as floats inside
lists too; a bool never equals 1 or 0; no model-specific renaming of dotted
names.
"""

import re
from typing import Sequence

OMITTED = ''  # in a ground-truth allowed list: the argument may be left out

_IGNORED_IN_STRINGS = re.compile(r'[ ,./\-_*^]')
_TYPE_HOLDS = {  # declared type → test; types not listed are not checked
    'string': lambda v: isinstance(v, str),
    'integer': lambda v: type(v) is int,
    'float': lambda v: type(v) in (int, float),  # an int is a fine float, as in Python
    'number': lambda v: type(v) in (int, float),
    'boolean': lambda v: type(v) is bool,
    'array': lambda v: isinstance(v, list),
    'tuple': lambda v: isinstance(v, list),
    'dict': lambda v: isinstance(v, dict),
    'object': lambda v: isinstance(v, dict),
    'any': lambda v: True,
}


# ---- correctness -------------------------------------------------------------------------------

def normalize_string(text: str) -> str:
  """BFCL's string equivalence: 'April 1, 2024' == 'april 1 2024' (only ASCII spaces are dropped)."""
  return _IGNORED_IN_STRINGS.sub('', text).lower().replace("'", '"')


def _find_doc(functions: Sequence[dict], name: str) -> dict:
  for doc in functions:
    if doc.get('name') == name:
      return doc
  raise ValueError(f'the ground truth calls {name!r}, which none of the function docs '
                   f'{[doc.get("name") for doc in functions]} defines; the example is broken')


def _alternatives(allowed) -> list:
  """The allowed values of one argument; a few BFCL golds nest a bare value where a list belongs."""
  return allowed if isinstance(allowed, list) else [allowed]


def _value_fits(value, allowed, schema: dict | None) -> bool:
  """value against ONE allowed value; schema is the doc's description of it (None where unknown)."""
  holds = _TYPE_HOLDS.get((schema or {}).get('type'))
  if holds is not None and not holds(value):
    if type(value) is not type(allowed):
      return False
    schema = None  # the gold itself breaks the doc's type (a BFCL "variable"): compare as the gold is typed
  if isinstance(allowed, dict):
    properties = (schema or {}).get('properties') or {}
    return isinstance(value, dict) and _arguments_error(value, allowed, properties) is None
  if isinstance(allowed, list):
    items = (schema or {}).get('items')
    return (isinstance(value, list) and len(value) == len(allowed)
            and all(_value_fits(v, a, items) for v, a in zip(value, allowed)))
  if isinstance(allowed, str):
    return isinstance(value, str) and normalize_string(value) == normalize_string(allowed)
  if isinstance(allowed, bool) or allowed is None:
    return type(value) is type(allowed) and value == allowed
  return type(value) in (int, float) and value == allowed  # 5 == 5.0; the declared type was checked above


def _arguments_error(given: dict, allowed_by_name: dict, properties: dict) -> str | None:
  """Why `given` does not fit {name: [allowed...]} ("" = may be omitted), or None when it does."""
  for name, value in given.items():
    if name not in allowed_by_name:
      return f'unexpected argument {name!r}'
    alternatives = [a for a in _alternatives(allowed_by_name[name]) if a != OMITTED]
    if not any(_value_fits(value, a, properties.get(name)) for a in alternatives):
      return f'argument {name!r} = {value!r} is not one of {alternatives}'
  for name, alternatives in allowed_by_name.items():
    if name not in given and OMITTED not in _alternatives(alternatives):
      return f'missing argument {name!r}'
  return None


def call_error(call: dict, ground_truth_entry: dict, functions: Sequence[dict]) -> str | None:
  """Why one call does not answer one ground-truth entry, or None when it does (see module docstring)."""
  (name, allowed_by_name), = ground_truth_entry.items()
  if call.get('tool_name') != name:
    return f'calls {call.get("tool_name")!r}, expected {name!r}'
  given = call.get('parameters')
  if not isinstance(given, dict):
    return f'parameters must be an object, got {given!r}'
  parameters = _find_doc(functions, name).get('parameters') or {}
  properties = parameters.get('properties') or {}
  for required in parameters.get('required') or []:
    if required not in given:
      return f'missing required parameter {required!r}'
  for given_name in given:
    if given_name not in properties:
      return f'{name} has no parameter {given_name!r}'
  return _arguments_error(given, allowed_by_name, properties)


def has_perfect_matching(fits: list[list[bool]]) -> bool:
  """fits[call][entry] (a square table); True when every call gets an entry of its own (Kuhn's augmenting
  paths). Also pairs SQL result rows under a float tolerance (`rewards.sql`)."""
  owner = [None] * len(fits)  # entry → call

  def assign(call: int, visited: set[int]) -> bool:
    for entry, fit in enumerate(fits[call]):
      if fit and entry not in visited:
        visited.add(entry)
        if owner[entry] is None or assign(owner[entry], visited):
          owner[entry] = call
          return True
    return False

  return all(assign(call, set()) for call in range(len(fits)))


def is_correct(calls: list[dict], ground_truth: list[dict], functions: list[dict]) -> bool:
  """The calls answer the ground truth exactly: same count, paired one-to-one in any order.

  Raises ValueError when the ground truth names a function that `functions` lacks (a broken example).
  """
  if len(calls) != len(ground_truth):
    return False
  fits = [[call_error(call, entry, functions) is None for entry in ground_truth] for call in calls]
  return has_perfect_matching(fits)


def _gold_value(allowed):
  """A concrete value from one allowed value: allowed dicts hold alternatives per key."""
  if isinstance(allowed, dict):
    return _gold_dict(allowed)
  if isinstance(allowed, list):
    return [_gold_value(item) for item in allowed]
  return allowed


def _gold_dict(allowed_by_name: dict, required: frozenset = frozenset()) -> dict:
  """First allowed value of each argument; optional ones ("" allowed) omitted unless required."""
  chosen = {}
  for name, alternatives in allowed_by_name.items():
    alternatives = _alternatives(alternatives)
    values = [v for v in alternatives if v != OMITTED]
    if values and (OMITTED not in alternatives or name in required):
      chosen[name] = _gold_value(values[0])
  return chosen


def gold_call(ground_truth_entry: dict, functions: Sequence[dict] = ()) -> dict:
  """One canonical correct call for a ground-truth entry (for tests and SFT traces).

  Takes the first allowed value of each argument and leaves optional ones out.
  BFCL marks a few arguments both required by the doc and optional in the gold
  (e.g. `fuel_efficiency: ["", 25.0]`); pass `functions` so those are filled in.
  """
  (name, allowed_by_name), = ground_truth_entry.items()
  required = frozenset()
  if functions:
    required = frozenset((_find_doc(functions, name).get('parameters') or {}).get('required') or [])
  return {'tool_name': name, 'parameters': _gold_dict(allowed_by_name, required)}
