"""One-way layering of `luckystar`, checked by reading source with `ast` (nothing under test is imported).

Layers, lowest first: core → tasks → engine → stages → entry. A module imports only from its own or earlier
layers, stages never import each other (`config.stage_module` finds one by name at run time), and no imports form
a cycle.
"""

import ast
import os
import pathlib
import subprocess
import sys
import textwrap
import pytest

pytestmark = pytest.mark.fast

LAYER_ORDER = ('core', 'tasks', 'engine', 'stages', 'entry')

# A key ending in '.*' covers that package and all its submodules; any other key is one exact module.
# The most specific (longest) matching key wins; a module no key matches is a fault.
LAYERS = {
    'luckystar.errors': 'core',
    'luckystar.files': 'core',
    'luckystar.workers': 'core',
    'luckystar.model.*': 'core',
    'luckystar.tokenizer.*': 'core',
    'luckystar.tools.*': 'core',
    'luckystar.sampling.*': 'core',
    'luckystar.distributed': 'core',

    'luckystar.data.*': 'tasks',
    'luckystar.rewards.*': 'tasks',
    'luckystar.tasks': 'tasks',

    'luckystar.config': 'engine',
    'luckystar.engine.*': 'engine',
    'luckystar.interop.*': 'engine',
    'luckystar.quant.*': 'engine',

    'luckystar.stages.*': 'stages',

    'luckystar': 'entry',
    'luckystar.main': 'entry',
    'luckystar.api': 'entry',
    'luckystar.aot_plan': 'entry',
    'luckystar.serve': 'entry',
}

RULE_TABLE = 'not in the layer table (rule 1: every module has a layer)'
RULE_UPWARD = 'imports upward (rule 2: only own or earlier layers)'
RULE_STAGE = 'stage imports another stage (rule 3: stages find each other by name, never by import)'
RULE_CYCLE = 'import cycle (rule 4: no cycles among package modules)'


def find_modules(root: pathlib.Path, package: str) -> dict[str, tuple[pathlib.Path, bool]]:
  """Module name → (file, is a package `__init__`), for every .py under root/package."""
  modules = {}
  for path in sorted((root / package).rglob('*.py')):
    parts = path.relative_to(root).with_suffix('').parts
    if '__pycache__' in parts:
      continue
    is_package = parts[-1] == '__init__'
    modules['.'.join(parts[:-1] if is_package else parts)] = (path, is_package)
  return modules


def layer_of(module: str, layers: dict[str, str]) -> str | None:
  """The layer of the most specific table key matching `module`, or None."""
  best, best_len = None, -1
  for key, layer in layers.items():
    if key.endswith('.*'):
      base = key[:-2]
      hit = module == base or module.startswith(base + '.')
      length = len(base)
    else:
      hit, length = module == key, len(key) + 1   # an exact name beats a subtree of the same name
    if hit and length > best_len:
      best, best_len = layer, length
  return best


def _existing(name: str, modules: dict) -> str:
  """The module `name`, or its nearest existing parent (a missing name means an attribute, or a broken import)."""
  while name not in modules and '.' in name:
    name = name.rsplit('.', 1)[0]
  return name


def imports_of(module: str, tree: ast.AST, is_package: bool, package: str, modules: dict) -> list[tuple[int, str, str]]:
  """(line, import as written, resolved package module) for every import of `package` anywhere in `tree`."""
  found = []
  in_package = lambda name: name == package or name.startswith(package + '.')
  for node in ast.walk(tree):   # the whole tree: function- and class-level imports count too
    if isinstance(node, ast.Import):
      for alias in node.names:
        if in_package(alias.name):
          # Python also runs the parent packages' __init__s; only the leaf module counts for the graph.
          found.append((node.lineno, f'import {alias.name}', _existing(alias.name, modules)))
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        here = module.split('.') if is_package else module.split('.')[:-1]
        if node.level - 1 > len(here) - 1:
          continue   # climbs above the top package: not ours
        base_parts = here[:len(here) - (node.level - 1)]
        base = '.'.join(base_parts + ([node.module] if node.module else []))
        written = f"from {'.' * node.level}{node.module or ''} import"
      else:
        base, written = node.module, f'from {node.module} import'
      if not base or not in_package(base):
        continue
      for alias in node.names:
        # `from a import b` imports the module a.b when it exists, else the name b from module a.
        target = f'{base}.{alias.name}' if f'{base}.{alias.name}' in modules else _existing(base, modules)
        found.append((node.lineno, f'{written} {alias.name}', target))
  return found


def _cycles(edges: dict[str, dict[str, tuple[int, str]]]) -> list[list[str]]:
  """One cycle path [a, b, ..., a] per strongly connected component of more than one module (Tarjan)."""
  index, low, stack, on_stack, components = {}, {}, [], set(), []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for nxt in edges.get(node, {}):
      if nxt not in index:
        visit(nxt)
        low[node] = min(low[node], low[nxt])
      elif nxt in on_stack:
        low[node] = min(low[node], index[nxt])
    if low[node] == index[node]:
      component = set()
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.add(member)
        if member == node:
          break
      if len(component) > 1:
        components.append(component)

  for node in sorted(edges):
    if node not in index:
      visit(node)
  cycles = []
  for component in components:
    # The shortest way back to the first module, by breadth-first search inside its component.
    start = min(component)
    previous, queue, last = {start: None}, [start], None
    for node in queue:   # the queue grows as we go
      if start in edges[node]:
        last = node
        break
      for nxt in sorted(edges[node]):
        if nxt in component and nxt not in previous:
          previous[nxt] = node
          queue.append(nxt)
    path = [start]
    while last is not None:
      path.append(last)
      last = previous[last]
    cycles.append(path[::-1])   # start → ... → last → start, in import order
  return cycles


def violations(root: pathlib.Path, package: str, layers: dict[str, str], isolated: str = 'stages') -> list[str]:
  """One line per layering fault in root/package: the file, the import, and the rule it breaks."""
  modules = find_modules(root, package)
  faults, edges = [], {name: {} for name in modules}
  rank = {layer: i for i, layer in enumerate(LAYER_ORDER)}
  for name, (path, is_package) in modules.items():
    where = path.relative_to(root)
    layer = layer_of(name, layers)
    if layer is None:
      faults.append(f'{where}: module {name} is {RULE_TABLE}')
    try:
      tree = ast.parse(path.read_text(encoding='utf-8'), filename=str(path))
    except SyntaxError as e:
      faults.append(f'{where}:{e.lineno}: cannot be parsed: {e.msg}')
      continue
    for line, written, target in imports_of(name, tree, is_package, package, modules):
      if target == name or target not in modules:
        continue   # `from . import x` in an __init__ naming its own attribute, or a namespace package
      edges[name].setdefault(target, (line, written))
      target_layer = layer_of(target, layers)
      if layer is None or target_layer is None:
        continue   # rule 1 already names the module without a layer
      if rank[target_layer] > rank[layer]:
        faults.append(f'{where}:{line}: `{written}` — {name} ({layer}) {RULE_UPWARD}: {target} is {target_layer}')
      if layer == target_layer == isolated and not is_package and not modules[target][1]:
        faults.append(f'{where}:{line}: `{written}` — {name} {RULE_STAGE}: {target}')
  for cycle in _cycles(edges):
    steps = '; '.join(
        f'{modules[a][0].relative_to(root)}:{edges[a][b][0]} `{edges[a][b][1]}`' for a, b in zip(cycle, cycle[1:]))
    faults.append(f"{RULE_CYCLE}: {' → '.join(cycle)} (via {steps})")
  return faults


def test_luckystar_imports_only_downward():
  root = pathlib.Path(__file__).resolve().parent.parent
  assert (root / 'luckystar' / '__init__.py').is_file()
  faults = violations(root, 'luckystar', LAYERS)
  print('\n'.join(faults))
  assert not faults, 'layering faults:\n' + '\n'.join(faults)


FAKE_LAYERS = {
    'fakepkg': 'entry',
    'fakepkg.errors': 'core',
    'fakepkg.util.*': 'core',
    'fakepkg.rewards.*': 'tasks',
    'fakepkg.engine.*': 'engine',
    'fakepkg.stages.*': 'stages',
    'fakepkg.main': 'entry',
}

CLEAN = {
    '__init__.py': 'def lazy():\n  from fakepkg import main\n  return main\n',
    'errors.py': 'import os\nclass UserError(Exception):\n  pass\n',
    'util/__init__.py': '',
    'util/text.py': 'from fakepkg import errors\nfrom . import helpers\n',
    'util/helpers.py': 'from ..errors import UserError\n',
    'rewards/__init__.py': '',
    'rewards/score.py': 'import fakepkg.util.text\nfrom fakepkg.util import helpers\n',
    'engine/__init__.py': 'def stage_module(stage):\n  import importlib\n'
                          '  return importlib.import_module(f"fakepkg.stages.{stage}")\n',
    'engine/loop.py': 'from fakepkg.rewards import score\nfrom .state import State\n',
    'engine/clock.py': 'import time\n',
    'engine/state.py': 'from fakepkg.util import text\nclass State:\n  pass\n',
    'stages/__init__.py': 'from fakepkg.stages import sft, dpo\n',   # the package __init__ may name its stages
    'stages/sft.py': 'from fakepkg import engine\nfrom fakepkg.engine import loop, stage_module\n',
    'stages/dpo.py': 'from fakepkg.engine import loop\n\ndef next_stage():\n  return stage_module("sft")\n',
    'main.py': 'import fakepkg.stages.sft\nfrom fakepkg.stages import dpo\n',
}


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
  for relative, text in files.items():
    path = root / 'fakepkg' / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_the_checker_catches_each_fault(tmp_path):
  _write(tmp_path / 'clean', CLEAN)
  assert violations(tmp_path / 'clean', 'fakepkg', FAKE_LAYERS) == []

  broken = dict(CLEAN)
  # Upward, inside a function: core reaching into the engine.
  broken['util/helpers.py'] = 'from ..errors import UserError\n\ndef go():\n  from fakepkg.engine import clock\n'
  broken['stages/dpo.py'] = 'from fakepkg.engine import loop\nfrom fakepkg.stages import sft\n'   # stage → stage
  broken['orphan.py'] = 'from fakepkg import errors\n'   # no layer for it
  broken['rewards/a.py'] = 'from . import b\n'   # a cycle inside one layer
  broken['rewards/b.py'] = 'import fakepkg.rewards.a\n'
  _write(tmp_path / 'broken', broken)
  faults = violations(tmp_path / 'broken', 'fakepkg', FAKE_LAYERS)
  print('\n'.join(faults))

  def only(rule):
    hits = [f for f in faults if rule in f]
    assert len(hits) == 1, (rule, faults)
    return hits[0]

  upward = only(RULE_UPWARD)
  assert 'fakepkg/util/helpers.py:4' in upward and 'fakepkg.engine.clock' in upward and '(core)' in upward
  stage = only(RULE_STAGE)
  assert 'fakepkg/stages/dpo.py:2' in stage and 'fakepkg.stages.sft' in stage
  assert 'fakepkg.orphan' in only(RULE_TABLE)
  assert 'fakepkg.rewards.a → fakepkg.rewards.b → fakepkg.rewards.a' in only(RULE_CYCLE)
  assert len(faults) == 4, faults


def test_imports_resolve_to_the_leaf_module(tmp_path):
  _write(tmp_path, CLEAN)
  modules = find_modules(tmp_path, 'fakepkg')
  source = textwrap.dedent('''
      import os
      import fakepkg.util.text as t
      from fakepkg.engine import loop, stage_module
      from . import errors
      from .util import helpers, missing
      class C:
        def f(self):
          from ..fakepkg import errors
      ''')
  found = [target for _, _, target in imports_of('fakepkg.main', ast.parse(source), False, 'fakepkg', modules)]
  assert found == ['fakepkg.util.text', 'fakepkg.engine.loop', 'fakepkg.engine', 'fakepkg.errors',
                   'fakepkg.util.helpers', 'fakepkg.util']
  assert set(LAYERS.values()) <= set(LAYER_ORDER) and set(FAKE_LAYERS.values()) <= set(LAYER_ORDER)
  assert layer_of('luckystar', LAYERS) == 'entry' and layer_of('luckystar.model.cohere2', LAYERS) == 'core'
  assert layer_of('luckystar.stages', LAYERS) == 'stages' and layer_of('luckystar.newthing', LAYERS) is None


# What a bare accelerator image has: jax, flax, optax, torch, transformers, but not these (docs/features.md's stack).
OPTIONAL_PACKAGES = ('grain', 'aqt', 'ml_collections', 'math_verify', 'faker', 'sentencepiece')
# The modules experiments/benchmarks/gpu.py runs with no `pip install` of the rest of the stack.
BARE_MODULES = ('luckystar.model', 'luckystar.sampling', 'luckystar.engine.state', 'luckystar.engine.step',
                'luckystar.engine.logprobs', 'luckystar.engine.optim')


def test_model_step_and_sampler_import_without_the_optional_packages():
  root = pathlib.Path(__file__).resolve().parent.parent
  script = (f'import sys\nimport {", ".join(BARE_MODULES)}\n'
            f'loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({OPTIONAL_PACKAGES!r}))\n'
            f'assert not loaded, f"imported {{loaded}}"\n')
  env = {**os.environ, 'PYTHONPATH': str(root), 'JAX_PLATFORMS': 'cpu'}
  result = subprocess.run([sys.executable, '-c', script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
