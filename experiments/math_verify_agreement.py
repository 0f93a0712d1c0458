"""How often `luckystar.rewards.math.is_correct` gives the verdict math-verify's own tests expect.

    pip download math-verify==0.9.0 --no-binary :all: --no-deps -d /tmp/mv
    PYTHONPATH=. python experiments/math_verify_agreement.py /tmp/mv/math_verify-0.9.0.tar.gz

The argument is the sdist tarball or its unpacked directory; nothing is fetched. The script reads the
sdist's tests/*.py with `ast` (the test modules are never imported: their helpers and fixtures are not
ours) and collects every (gold, prediction, expected verdict) case: the rows of
`@pytest.mark.parametrize` tables whose test calls `compare_strings(gold, pred, ...)` or
`verify(parse(gold), parse(pred))`, and literal `compare_strings("...", "...") == 1` calls.

Our interface has one configuration: LaTeX and plain-expression extraction, six-digit float rounding,
strict variable comparison, no set/relation comparison. A case that names other settings (LaTeX or
expression extraction alone, another `precision`, `strict=False`, `allow_set_relation_comp=True`) is
kept when math-verify itself gives the expected verdict under our settings too, and otherwise
skipped as needing its own configuration; the skips are counted per reason. Rows that are not
literals are skipped as well. Each kept case goes through `is_correct(prediction, gold)`; the report
prints the agreement rate, math-verify's own rate on the same cases (in this process, with the test
helper's configuration), and every disagreement. A few seconds on 2 CPU cores.
"""

import argparse
import ast
import collections
import dataclasses
import pathlib
import sys
import tarfile
import tempfile

from luckystar.rewards import math as math_reward

# compare_strings' defaults (tests/test_all.py), which are also the settings our verifier runs with.
OUR_SETTINGS = {'match_types': ('latex', 'expr'), 'precision': 6, 'strict': True,
                'allow_set_relation_comp': False}


@dataclasses.dataclass
class Case:
  where: str            # file::test[row]
  gold: str
  prediction: str
  expected: bool
  settings: dict        # the case's own: OUR_SETTINGS keys, plus boxed_first
  upstream: bool | None = None   # math-verify's verdict under the case's settings
  upstream_ours: bool | None = None   # math-verify's verdict under OUR_SETTINGS
  ours: bool | None = None


def tests_dir(source: pathlib.Path, scratch: pathlib.Path) -> pathlib.Path:
  if source.is_dir():
    found = sorted(source.glob('**/tests/test_*.py'))
  else:
    with tarfile.open(source) as archive:
      archive.extractall(scratch, filter='data')
    found = sorted(scratch.glob('**/tests/test_*.py'))
  if not found:
    sys.exit(f'{source}: no tests/test_*.py inside; pass the math-verify sdist (.tar.gz) or its unpacked directory')
  return found[0].parent


def _call_name(node: ast.AST) -> str | None:
  if isinstance(node, ast.Call):
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
  return None


def _parametrize(function: ast.FunctionDef) -> tuple[list[str], ast.AST] | None:
  for decorator in function.decorator_list:
    if _call_name(decorator) == 'parametrize' and len(decorator.args) >= 2:
      names = ast.literal_eval(decorator.args[0])
      names = [n.strip() for n in (names.split(',') if isinstance(names, str) else names)]
      return names, decorator.args[1]
  return None


def _verdict_calls(function: ast.FunctionDef):
  """(call, expected node) for each `compare_strings(...) == X` or `int(verify(parse(g), parse(p))) == X`."""
  for node in ast.walk(function):
    if isinstance(node, ast.Compare) and len(node.comparators) == 1 and isinstance(node.ops[0], ast.Eq):
      left = node.left
      if _call_name(left) == 'int' and left.args:
        left = left.args[0]
      if _call_name(left) in ('compare_strings', 'verify'):
        yield left, node.comparators[0]


def _arguments(call: ast.Call) -> tuple[ast.AST, ast.AST, dict[str, ast.AST], bool]:
  """gold node, prediction node, keyword nodes, whether boxed is matched first (compare_strings does)."""
  if _call_name(call) == 'verify':   # verify(parse(gold), parse(pred)): parse's defaults
    gold, prediction = (argument.args[0] for argument in call.args[:2])
    return gold, prediction, {k.arg: k.value for k in call.keywords}, False
  return call.args[0], call.args[1], {k.arg: k.value for k in call.keywords}, True


def _value(node: ast.AST, row: dict):
  return row[node.id] if isinstance(node, ast.Name) and node.id in row else ast.literal_eval(node)


def collect(directory: pathlib.Path) -> tuple[list[Case], collections.Counter]:
  cases, skipped = [], collections.Counter()
  for path in sorted(directory.glob('test_*.py')):
    tree = ast.parse(path.read_text(), filename=str(path))
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith('test')):
      calls = list(_verdict_calls(function))
      table = _parametrize(function)
      if not calls:
        if table:
          skipped['not a (gold, prediction) verdict test: ' + path.name] += len(getattr(table[1], 'elts', []))
        continue
      rows = [{}] if table is None else None
      if table is not None:
        names, values = table
        rows = []
        for index, element in enumerate(values.elts):
          try:
            rows.append(dict(zip(names, ast.literal_eval(element)), _row=index))
          except ValueError:   # e.g. an f-string computed at import time
            skipped['row is not a literal'] += 1
      for row in rows:
        for call, expected_node in calls:
          gold_node, prediction_node, keywords, boxed_first = _arguments(call)
          try:
            gold, prediction = _value(gold_node, row), _value(prediction_node, row)
            expected = _value(expected_node, row)
            settings = dict(OUR_SETTINGS, boxed_first=boxed_first)
            settings.update({key: _value(node, row) for key, node in keywords.items() if key in OUR_SETTINGS})
          except (ValueError, KeyError):
            skipped['arguments are not literals'] += 1
            continue
          settings['match_types'] = tuple(settings['match_types'])
          where = f'{path.name}::{function.name}' + (f'[{row["_row"]}]' if '_row' in row else '')
          cases.append(Case(where, gold, prediction, bool(expected), settings))
  return cases, skipped


def upstream_verdict(gold: str, prediction: str, settings: dict) -> bool:
  """math-verify in this process, configured as the test helper configures it."""
  import math_verify
  extraction = []
  for match_type in settings['match_types']:
    if match_type == 'latex':
      extraction.append(math_verify.LatexExtractionConfig(boxed_match_priority=0) if settings['boxed_first']
                        else math_verify.LatexExtractionConfig())
    elif match_type == 'expr':
      extraction.append(math_verify.ExprExtractionConfig())
  return bool(math_verify.verify(math_verify.parse(gold, extraction), math_verify.parse(prediction, extraction),
                                 float_rounding=settings['precision'], strict=settings['strict'],
                                 allow_set_relation_comp=settings['allow_set_relation_comp']))


def _differences(settings: dict) -> str:
  return ', '.join(f'{key}={settings[key]!r}' for key in OUR_SETTINGS if settings[key] != OUR_SETTINGS[key])


def _short(text: str, width: int = 110) -> str:
  text = text.replace('\n', '\\n')
  return text if len(text) <= width else text[:width - 20] + ' … ' + text[-17:]


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('sdist', type=pathlib.Path, help='math_verify-0.9.0.tar.gz or its unpacked directory')
  parser.add_argument('--timeout_s', type=float, default=10.0, help='per case, for our verifier')
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as scratch:
    cases, skipped = collect(tests_dir(args.sdist, pathlib.Path(scratch)))
  kept = []
  for case in cases:
    case.upstream = upstream_verdict(case.gold, case.prediction, case.settings)
    own_settings = {key: case.settings[key] for key in OUR_SETTINGS} != OUR_SETTINGS
    if own_settings:
      case.upstream_ours = upstream_verdict(case.gold, case.prediction, dict(case.settings, **OUR_SETTINGS))
      if case.upstream_ours != case.expected:
        skipped[f'needs its own settings ({_differences(case.settings)})'] += 1
        continue
    kept.append(case)
  verdicts = math_reward.are_correct([(case.prediction, case.gold) for case in kept], timeout_s=args.timeout_s)
  for case, verdict in zip(kept, verdicts):
    case.ours = verdict
  math_reward.close()

  agree = sum(case.ours is case.expected for case in kept)
  upstream_agree = sum(case.upstream is case.expected for case in kept)
  print(f'{len(cases)} (gold, prediction) cases found; {len(kept)} fit is_correct(prediction, gold); skipped:')
  for reason, count in sorted(skipped.items(), key=lambda item: -item[1]):
    print(f'  {count:4d}  {reason}')
  print(f'\nagreement with the expected verdicts: {agree}/{len(kept)} = {100 * agree / len(kept):.1f}%')
  print(f'math-verify 0.9.0 itself, as its tests configure it: {upstream_agree}/{len(kept)} = '
        f'{100 * upstream_agree / len(kept):.1f}%')
  print(f'our verdict None (unscorable): {sum(case.ours is None for case in kept)}')
  disagreements = [case for case in kept if case.ours is not case.expected]
  print(f'\n{len(disagreements)} disagreements (expected / ours / math-verify as its test runs it):')
  for case in disagreements:
    print(f'- {case.where}: expected {case.expected}, ours {case.ours}, math-verify {case.upstream}')
    print(f'    gold:       {_short(case.gold)!s}')
    print(f'    prediction: {_short(case.prediction)!s}')


if __name__ == '__main__':
  main(sys.argv[1:])
