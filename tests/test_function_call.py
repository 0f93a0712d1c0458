"""Function-call verifier: every BFCL gold answer scores correct and every perturbed one wrong;
the action format; BFCL loading errors that name file and line."""

import collections
import copy
import functools
import json
import random

import pytest

from luckystar.data import bfcl
from luckystar.rewards import function_call as fc
from luckystar.tools import calls as tool_calls

pytestmark = pytest.mark.fast

# bfcl-eval==2026.3.23 (pinned in the CI install); a changed count means lost or extra examples.
EXPECTED_COUNTS = {'simple_python': 400, 'multiple': 200, 'parallel': 200, 'parallel_multiple': 200}


@functools.cache
def _examples(category: str) -> list[bfcl.BfclExample]:
  return bfcl.load(category)


def _bfcl_examples(category: str) -> list[bfcl.BfclExample]:
  try:
    bfcl.data_dir()
  except FileNotFoundError as e:
    pytest.skip(f'BFCL data absent ({e})')
  return _examples(category)


def _gold(example: bfcl.BfclExample) -> list[dict]:
  return [fc.gold_call(entry, example.functions) for entry in example.ground_truth]


def _doc(example: bfcl.BfclExample, name: str) -> dict:
  return next(doc for doc in example.functions if doc['name'] == name)


# ---- BFCL acceptance -------------------------------------------------------------------------

@pytest.mark.parametrize('category', EXPECTED_COUNTS)
def test_every_bfcl_gold_answer_scores_correct(category):
  examples = _bfcl_examples(category)
  assert len(examples) == EXPECTED_COUNTS[category]
  rng = random.Random(0)
  failures, orders_checked = [], 0
  for example in examples:
    gold = _gold(example)
    orders = [gold, gold[::-1], rng.sample(gold, len(gold))]
    # Optional arguments filled with an allowed value (where the doc defines them) are fine too.
    filled = []
    for call, entry in zip(gold, example.ground_truth):
      (name, allowed_by_name), = entry.items()
      properties = _doc(example, name)['parameters']['properties']
      parameters = dict(call['parameters'])
      for arg, allowed in allowed_by_name.items():
        values = [v for v in allowed if v != fc.OMITTED]
        if arg not in parameters and arg in properties and values:  # gold_call resolves nested alternatives
          parameters[arg] = fc.gold_call({name: {arg: [values[0]]}})['parameters'][arg]
      filled.append({'tool_name': name, 'parameters': parameters})
    for calls in orders + [filled]:
      orders_checked += 1
      if not fc.is_correct(calls, example.ground_truth, example.functions):
        failures.append((example.id, [fc.call_error(c, e, example.functions)
                                      for c, e in zip(calls, example.ground_truth)]))
  print(f'{category}: {len(examples)} gold answers checked, {orders_checked} orderings/variants')
  assert not failures, failures[:10]


def _allowed_anywhere(example: bfcl.BfclExample, name: str, arg: str) -> list:
  """Allowed values of `arg` in every entry for `name`: a wrong value must miss them all."""
  return [v for entry in example.ground_truth for n, args in entry.items() if n == name
          for v in args.get(arg, []) if v != fc.OMITTED]


def _wrong_value(value, allowed: list):
  """A value of the same type as `value` that no allowed value accepts, or None."""
  if isinstance(value, bool):
    candidate = not value
    return candidate if not any(type(a) is bool and a == candidate for a in allowed) else None
  if isinstance(value, (int, float)):
    step = 1 if isinstance(value, int) else 0.5
    candidate = value + step
    while any(type(a) in (int, float) and a == candidate for a in allowed):
      candidate += step
    return candidate
  if isinstance(value, str):
    normalized = {fc.normalize_string(a) for a in allowed if isinstance(a, str)}
    candidate = value + ' zq'
    while fc.normalize_string(candidate) in normalized:
      candidate += 'zq'
    return candidate
  if isinstance(value, list) and value:
    candidate = value + value[-1:]
    return candidate if not any(isinstance(a, list) and len(a) == len(candidate) for a in allowed) else None
  return None


def _perturbations(example: bfcl.BfclExample):
  """(kind, calls) pairs, each one mistake away from the gold answer."""
  gold = _gold(example)
  for i, call in enumerate(gold):
    name, parameters = call['tool_name'], call['parameters']
    doc = _doc(example, name)

    def with_call(new_call, i=i):
      return gold[:i] + [new_call] + gold[i + 1:]

    yield 'wrong_name', with_call({'tool_name': name + '_v2', 'parameters': parameters})
    for arg, value in parameters.items():
      wrong = _wrong_value(value, _allowed_anywhere(example, name, arg))
      if wrong is not None:
        yield 'wrong_value', with_call({'tool_name': name, 'parameters': {**parameters, arg: wrong}})
        break
    for arg, value in parameters.items():
      if doc['parameters']['properties'][arg]['type'] == 'integer' and type(value) is int:
        yield 'float_for_integer', with_call({'tool_name': name, 'parameters': {**parameters, arg: float(value)}})
        break
    required = [arg for arg in doc['parameters'].get('required', []) if arg in parameters]
    if required:
      trimmed = {arg: value for arg, value in parameters.items() if arg != required[0]}
      yield 'missing_required', with_call({'tool_name': name, 'parameters': trimmed})
    yield 'extra_unknown_arg', with_call({'tool_name': name, 'parameters': {**parameters, 'zz_unknown': 1}})
    yield 'missing_call', gold[:i] + gold[i + 1:]
    yield 'duplicated_call', gold + [copy.deepcopy(call)]


@pytest.mark.parametrize('category', EXPECTED_COUNTS)
def test_every_perturbed_bfcl_answer_scores_wrong(category):
  examples = _bfcl_examples(category)
  counts, examples_with = collections.Counter(), collections.defaultdict(set)
  failures = []
  for example in examples:
    for kind, calls in _perturbations(example):
      counts[kind] += 1
      examples_with[kind].add(example.id)
      if fc.is_correct(calls, example.ground_truth, example.functions):
        failures.append((example.id, kind, calls))
  print(f'{category}: perturbed answers checked per kind (examples covered of {len(examples)}): ' +
        ', '.join(f'{kind}={counts[kind]} ({len(examples_with[kind])})' for kind in counts))
  for kind in ('wrong_name', 'extra_unknown_arg', 'missing_call', 'duplicated_call'):
    assert len(examples_with[kind]) == len(examples), kind
  for kind, share in (('wrong_value', 0.9), ('missing_required', 0.9), ('float_for_integer', 0.25)):
    assert len(examples_with[kind]) >= share * len(examples), (kind, len(examples_with[kind]))
  assert not failures, failures[:5]


# ---- checker semantics on small cases ---------------------------------------------------------

WEATHER = {'name': 'weather.get', 'parameters': {'type': 'dict', 'required': ['city', 'days'], 'properties': {
    'city': {'type': 'string'}, 'days': {'type': 'integer'}, 'scale': {'type': 'float'},
    'metric': {'type': 'boolean'}, 'hours': {'type': 'array', 'items': {'type': 'float'}},
    'where': {'type': 'dict', 'properties': {'lat': {'type': 'float'}, 'zone': {'type': 'string'}}},
}}}
WEATHER_TRUTH = {'weather.get': {'city': ['New York, NY', 'NYC'], 'days': [3], 'scale': ['', 1.5],
                                 'metric': ['', True], 'hours': ['', [1.0, 2.5]],
                                 'where': ['', {'lat': [40.5], 'zone': ['', 'EST']}]}}


def _weather_ok(**parameters) -> bool:
  return fc.is_correct([{'tool_name': 'weather.get', 'parameters': parameters}], [WEATHER_TRUTH], [WEATHER])


@pytest.mark.parametrize('parameters', [
    dict(city='New York, NY', days=3),
    dict(city='new york ny', days=3),            # case, spaces and punctuation ignored, as in BFCL
    dict(city='nyc', days=3, scale=1.5, metric=True),
    dict(city='NYC', days=3, hours=[1, 2.5]),    # ints count as floats
    dict(city='NYC', days=3, where={'lat': 40.5}),
    dict(city='NYC', days=3, where={'lat': 40.5, 'zone': 'est'}),
])
def test_checker_accepts(parameters):
  assert _weather_ok(**parameters)


@pytest.mark.parametrize('parameters', [
    dict(city='Boston', days=3),
    dict(city='NYC', days=3.0),                  # a float is not an integer
    dict(city='NYC', days=True),                 # nor is a bool
    dict(city='NYC', days='3'),
    dict(city='NYC'),                            # required
    dict(city='NYC', days=3, scale=2.0),
    dict(city='NYC', days=3, scale=''),          # "" marks omission; it is not a value
    dict(city='NYC', days=3, metric=1),
    dict(city='NYC', days=3, hours=[2.5, 1.0]),  # lists keep their order
    dict(city='NYC', days=3, hours=[1.0]),
    dict(city='NYC', days=3, where={'lat': 40.5, 'zone': 'PST'}),
    dict(city='NYC', days=3, where={'zone': 'EST'}),
    dict(city='NYC', days=3, where={'lat': 40.5, 'alt': 3}),
    dict(city='NYC', days=3, where='40.5'),
])
def test_checker_rejects(parameters):
  assert not _weather_ok(**parameters)


def test_parallel_pairs_one_to_one_where_greedy_first_fit_fails():
  doc = {'name': 'f', 'parameters': {'type': 'dict', 'required': ['x'], 'properties': {'x': {'type': 'integer'}}}}
  truth = [{'f': {'x': [1, 2]}}, {'f': {'x': [1]}}]
  call = lambda x: {'tool_name': 'f', 'parameters': {'x': x}}
  assert fc.is_correct([call(1), call(2)], truth, [doc])  # x=1 must go to the second entry
  assert not fc.is_correct([call(1), call(1), call(2)], truth, [doc])
  assert not fc.is_correct([call(2), call(2)], truth, [doc])


def test_call_error_says_why():
  call = {'tool_name': 'weather.get', 'parameters': {'city': 'NYC'}}
  assert 'days' in fc.call_error(call, WEATHER_TRUTH, [WEATHER])
  assert 'weather_get' in fc.call_error({**call, 'tool_name': 'weather_get'}, WEATHER_TRUTH, [WEATHER])
  with pytest.raises(ValueError, match='weather.get'):
    fc.is_correct([call], [WEATHER_TRUTH], [])  # a broken example is an error, not a wrong answer


def test_gold_call_takes_first_values_and_leaves_optional_out():
  assert fc.gold_call(WEATHER_TRUTH) == {'tool_name': 'weather.get', 'parameters': {'city': 'New York, NY', 'days': 3}}
  required_yet_optional = {'weather.get': {'city': ['NYC'], 'days': ['', 3]}}
  assert fc.gold_call(required_yet_optional)['parameters'] == {'city': 'NYC'}
  assert fc.gold_call(required_yet_optional, [WEATHER])['parameters'] == {'city': 'NYC', 'days': 3}
  nested = {'f': {'rows': [[{'a': ['x', 'y'], 'b': ['', 2]}]], 'where': [{'lat': [1.5], 'zone': ['', 'EST']}]}}
  assert fc.gold_call(nested)['parameters'] == {'rows': [{'a': 'x'}], 'where': {'lat': 1.5}}


# ---- action format ---------------------------------------------------------------------------

def test_parse_calls_accepts_one_call_or_a_list():
  one = {'tool_name': 'math.factorial', 'parameters': {'number': 5}}
  assert tool_calls.parse_calls(json.dumps(one)) == [one]
  assert tool_calls.parse_calls(f'  \n{json.dumps(one)}\n') == [one]
  assert tool_calls.parse_calls(json.dumps([one, one])) == [one, one]
  assert tool_calls.parse_calls('{"tool_name": "f", "parameters": {}}') == [{'tool_name': 'f', 'parameters': {}}]
  brackets_in_strings = {'tool_name': 'f', 'parameters': {'q': '[{' * 200}}  # not nesting
  assert tool_calls.parse_calls(json.dumps(brackets_in_strings)) == [brackets_in_strings]


@pytest.mark.parametrize('text', [
    '', 'null', '5', '"f"', '[]', '{}', '[5]', '{"tool_name": "f"',
    '{"tool_name": "f", "parameters": {}} trailing',
    '```json\n{"tool_name": "f", "parameters": {}}\n```',
    '{"tool_name": "f"}',
    '{"parameters": {}}',
    '{"tool_name": "f", "parameters": []}',
    '{"tool_name": 7, "parameters": {}}',
    '{"tool_name": " ", "parameters": {}}',
    '{"tool_name": "f", "parameters": {}, "id": 1}',
    '{"name": "f", "arguments": {}}',
    '[{"tool_name": "f", "parameters": {}}, 3]',
    '{"tool_name": "f", "tool_name": "g", "parameters": {}}',
    '{"tool_name": "f", "parameters": {"x": NaN}}',
    '{"tool_name": "f", "parameters": {"x": Infinity}}',
])
def test_parse_calls_rejects_wrong_format(text):
  assert tool_calls.parse_calls(text) is None


def test_parse_calls_bounds_size_and_depth():
  def padded(chars):
    return json.dumps({'tool_name': 'f', 'parameters': {'q': 'x' * chars}})
  assert tool_calls.parse_calls(padded(tool_calls.MAX_ACTION_CHARS - 100)) is not None
  assert tool_calls.parse_calls(padded(tool_calls.MAX_ACTION_CHARS)) is None
  assert tool_calls.parse_calls(padded(10 * tool_calls.MAX_ACTION_CHARS)) is None

  def nested(depth):
    return '{"tool_name": "f", "parameters": {"x": ' + '[' * depth + ']' * depth + '}}'
  assert tool_calls.parse_calls(nested(tool_calls.MAX_DEPTH - 2)) is not None
  assert tool_calls.parse_calls(nested(tool_calls.MAX_DEPTH)) is None
  assert tool_calls.parse_calls(nested(40_000)) is None          # would exhaust json's recursion
  assert tool_calls.parse_calls('[' * (tool_calls.MAX_ACTION_CHARS - 1)) is None


# ---- loading ---------------------------------------------------------------------------------

def _write_category(root, questions: list[str], answers: list[str]):
  (root / 'possible_answer').mkdir(exist_ok=True)
  (root / 'BFCL_v4_toy.json').write_text('\n'.join(questions) + '\n')
  (root / 'possible_answer' / 'BFCL_v4_toy.json').write_text('\n'.join(answers) + '\n')


QUESTION = json.dumps({'id': 'toy_0', 'question': [[{'role': 'user', 'content': 'Weather in NYC for 3 days?'}]],
                       'function': [WEATHER]})
ANSWER = json.dumps({'id': 'toy_0', 'ground_truth': [WEATHER_TRUTH]})


def test_load_joins_questions_and_answers(tmp_path):
  _write_category(tmp_path, [QUESTION], [ANSWER])
  example, = bfcl.load('toy', root=tmp_path)
  assert example == bfcl.BfclExample(id='toy_0', question=[{'role': 'user', 'content': 'Weather in NYC for 3 days?'}],
                                     functions=[WEATHER], ground_truth=[WEATHER_TRUTH])
  assert bfcl.categories(tmp_path) == ['toy']


def test_load_errors_name_files_and_lines(tmp_path):
  _write_category(tmp_path, [QUESTION, '{"id": "toy_1", "question": oops}'], [ANSWER])
  with pytest.raises(ValueError, match=r'BFCL_v4_toy\.json:2: invalid JSON'):
    bfcl.load('toy', root=tmp_path)
  _write_category(tmp_path, [QUESTION, QUESTION.replace('toy_0', 'toy_1')], [ANSWER])
  with pytest.raises(ValueError, match=r'BFCL_v4_toy\.json:2: .*toy_1.* no gold answer in .*possible_answer'):
    bfcl.load('toy', root=tmp_path)
  _write_category(tmp_path, [QUESTION], [json.dumps({'id': 'toy_0', 'ground_truth': [["f(x=1)"]]})])
  with pytest.raises(ValueError, match=r'possible_answer/BFCL_v4_toy\.json:1: ground-truth entry'):
    bfcl.load('toy', root=tmp_path)
  with pytest.raises(FileNotFoundError, match='BFCL_v4_nope.json'):
    bfcl.load('nope', root=tmp_path)


def test_missing_package_says_how_to_install(monkeypatch):
  monkeypatch.setattr(bfcl, 'PACKAGE', 'no_such_package_for_luckystar_tests')
  with pytest.raises(FileNotFoundError, match='pip install --no-deps bfcl-eval'):
    bfcl.data_dir()
