"""Every fenced code block in README.md and docs/*.md runs as a reader would paste it, or says why not.

The rules:
- ```python: the block runs as a script in a fresh interpreter (its own process, so its own namespace
  and its own JAX devices), from the repository root, in the environment of a plain shell (the 8 fake
  devices tests/conftest.py sets are removed). A ```text block right after it (only blank lines
  between) is its expected stdout, compared line by line, trailing spaces ignored.
- ```bash / ```sh: every command line runs on its own through `bash -c` from the repository root (a
  line ending in `\\` continues on the next; blank lines and `#` comments are skipped) and must exit 0.
  Lines share no shell state (a `cd` or `export` does not carry to the next line). ```console: only
  its `$ ` lines run.
- `<!-- not run: <reason> -->` on the line just before the opening fence skips a block: long jobs,
  cluster launches, installs, the test suite itself. The reason is required.
- Commands run exactly as written: no smoke rewriting. A long stage command is marked not run, and
  its smoke variant, where one is quick enough, is a block of its own.
- `/tmp/` inside a block that runs becomes a fresh temporary directory, so a documented workdir never
  resumes an older run and nothing is left in the real /tmp.
- A not-run block still parses: each `python -m luckystar.main` command in it (also one inside a launcher
  line: `srun ...`, `gcloud ... --command="..."`, a `for` loop) runs with `--dry_run` appended, each
  `python -m luckystar.aot_plan` with `--dry_run`, and each `python -m luckystar.serve` has its flags parsed
  (absl, nothing served), so a documented command that no longer parses fails. Such a check sees the 8 fake
  devices of tests/conftest.py, keeps the block's `NAME=value` lines (and a `for` variable's first value),
  and stands in for the user's files: `/tmp/`, `/mnt/shared/` and `/shared/` become a fresh directory,
  `/data/...` paths named as `FORMAT:/data/...` become small files of that format (tests/data_files.py),
  `$R7B` a Cohere checkpoint built offline (tests/cohere_checkpoint.py), and an `init_from` that an earlier
  line of the block makes (its --workdir, a path it names) or on a shared cluster path is the block's first
  explicit `init_from` (else tiny-sft): its model, as the earlier stage would leave it.
- ```text blocks (layouts, formats, expected output) never run. Any other fence language, or none,
  fails `test_fences_have_known_languages`, so no block is skipped without saying so.

A failure names the markdown file and line: `README.md:57: python block exited 1 ...`; a traceback's
lines are the markdown file's lines (the script is padded so they match).
"""

import dataclasses
import difflib
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
RUN_LANGUAGES = ('python', 'bash', 'sh', 'console')
KNOWN_LANGUAGES = (*RUN_LANGUAGES, 'text')
TIMEOUT_S = 600
README_MAX_LINES = 300

_FENCE = re.compile(r'^( {0,3})```([\w+-]*)\s*$')
_CLOSE = re.compile(r'^ {0,3}```\s*$')
_NOT_RUN = re.compile(r'^\s*<!--\s*not run:(.*?)-->\s*$')


@dataclasses.dataclass(frozen=True)
class Block:
  path: str                 # as reported: relative to the repository root
  line: int                 # 1-based line of the opening fence
  lang: str
  code: str
  not_run: str | None       # the reason, from `<!-- not run: reason -->`
  expected: str | None = None   # a ```text block right after a python block: its stdout

  @property
  def where(self) -> str:
    return f'{self.path}:{self.line}'


def parse(text: str, path: str) -> list[Block]:
  """The fenced blocks of a markdown text, each with its marker and expected output."""
  lines = text.split('\n')
  raw = []   # (block, closing line index)
  i = 0
  while i < len(lines):
    match = _FENCE.match(lines[i])
    if not match:
      i += 1
      continue
    indent, lang = len(match.group(1)), match.group(2)
    start = i
    i += 1
    while i < len(lines) and not _CLOSE.match(lines[i]):
      i += 1
    if i == len(lines):
      raise ValueError(f'{path}:{start + 1}: code fence is never closed')
    code = '\n'.join(line[indent:] if line[:indent].strip() == '' else line.lstrip() for line in lines[start + 1:i])
    not_run = None
    if start > 0 and (marker := _NOT_RUN.match(lines[start - 1])):
      not_run = marker.group(1).strip()
      if not not_run:
        raise ValueError(f'{path}:{start}: `<!-- not run: ... -->` needs a reason')
    raw.append((Block(path, start + 1, lang, code + '\n', not_run), i))
    i += 1
  blocks, skip = [], set()
  for n, (block, close) in enumerate(raw):
    if n in skip:
      continue
    if block.lang == 'python' and n + 1 < len(raw):
      following, _ = raw[n + 1]
      between = lines[close + 1:following.line - 1]
      if following.lang == 'text' and all(not line.strip() for line in between):
        block = dataclasses.replace(block, expected=following.code)
        skip.add(n + 1)
    blocks.append(block)
  return blocks


def _env() -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env['PATH'] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env.get('PATH', '')])
  env['PYTHONUNBUFFERED'] = '1'
  return env


def _tail(text: str, limit: int = 3000) -> str:
  return text if len(text) <= limit else '...' + text[-limit:]


def _lines(text: str) -> list[str]:
  return [line.rstrip() for line in text.strip('\n').split('\n')] if text.strip() else []


def run_python(block: Block, tmp: pathlib.Path) -> str | None:
  """None if the block ran and printed its expected output, else what went wrong."""
  # Padded so the traceback's line numbers are the markdown file's.
  code = '\n' * block.line + block.code.replace('/tmp/', f'{tmp}/')
  script = tmp / (pathlib.Path(block.path).name + '.py')
  script.write_text(code)
  try:
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired:
    return f'{block.where}: python block ran past {TIMEOUT_S} s'
  if proc.returncode != 0:
    return (f'{block.where}: python block exited {proc.returncode} (traceback lines are {block.path} lines)\n'
            f'{_tail(proc.stderr)}')
  if block.expected is not None and _lines(proc.stdout) != _lines(block.expected):
    diff = '\n'.join(difflib.unified_diff(_lines(block.expected), _lines(proc.stdout), 'documented output',
                                          'actual output', lineterm=''))
    return f'{block.where}: python block printed other output than its ```text block shows\n{diff}'
  return None


def commands(block: Block) -> list[tuple[int, str]]:
  """(markdown line, command) for each command a shell block runs."""
  out, pending, first = [], [], 0
  for offset, line in enumerate(block.code.split('\n')):
    lineno = block.line + 1 + offset
    if not pending:
      if block.lang == 'console':
        if not line.startswith('$ '):
          continue
        line = line[2:]
      if not line.strip() or line.lstrip().startswith('#'):
        continue
      first = lineno
    if line.rstrip().endswith('\\'):
      pending.append(line.rstrip()[:-1])
      continue
    out.append((first, ' '.join([*pending, line]).strip()))
    pending = []
  if pending:
    out.append((first, ' '.join(pending).strip()))
  return out


def run_shell(block: Block, tmp: pathlib.Path) -> str | None:
  for lineno, command in commands(block):
    try:
      proc = subprocess.run(['bash', '-c', command.replace('/tmp/', f'{tmp}/')], cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
      return f'{block.path}:{lineno}: `{command}` ran past {TIMEOUT_S} s (block at line {block.line})'
    if proc.returncode != 0:
      return (f'{block.path}:{lineno}: `{command}` exited {proc.returncode} (block at line {block.line})\n'
              f'{_tail(proc.stdout + proc.stderr)}')
  return None


def run_block(block: Block, tmp: pathlib.Path) -> str | None:
  if block.lang == 'python':
    return run_python(block, tmp)
  return run_shell(block, tmp)


_LUCKYSTAR = re.compile(r'python -m luckystar\.(main|serve|aot_plan)\b([^;&|"]*)')
_ASSIGNMENT = re.compile(r'^(?:export\s+)?[A-Za-z_]\w*=')
_LOOP = re.compile(r'\bfor (\w+) in (\S+)')
_CLUSTER_PATHS = ('/mnt/shared/', '/shared/')
_DATA_ITEM = re.compile(r'(\w+):(/data/[^,@\s\'"]+)')
_INIT_FROM = re.compile(r'--config\.init_from=(\S+)')
_WORKDIR = re.compile(r'--workdir=(\S+)')


def _data_file(form: str, path: pathlib.Path) -> None:
  """A small file (or Spider/BIRD directory) of `form` at `path`, standing in for the user's own."""
  import shutil  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(ROOT / 'tests'))
  import data_files  # pylint: disable=g-import-not-at-top
  made = data_files.write_all(path.parent / f'.{path.name}.made')
  path.parent.mkdir(parents=True, exist_ok=True)
  if form in ('spider', 'bird'):   # the questions file and the databases beside it, under the documented names
    for item in made[form].parent.iterdir():
      target = path if item == made[form] else path.parent / (
          item.name.replace(made[form].stem, path.stem) if form == 'bird' else item.name)
      (shutil.copytree if item.is_dir() else shutil.copy)(item, target)
  else:
    shutil.copy(made.get(form, made['chat_jsonl'] if form == 'rs_traces' else made['math_jsonl']), path)


def dry_commands(block: Block, tmp: pathlib.Path) -> list[tuple[int, str]]:
  """(markdown line, bash script) checking each luckystar command of a not-run shell block (module docstring)."""
  checks, setup, made, first_init = [], [], set(), None
  for lineno, line in commands(block):
    for placeholder in ('/tmp/', *_CLUSTER_PATHS):
      line = line.replace(placeholder, f'{tmp}/{placeholder.strip("/").replace("/", "_")}/')
    if _ASSIGNMENT.match(line):
      setup.append(line)
      continue
    loop = [f'{m[1]}={m[2]}' for m in _LOOP.finditer(line)]
    for module, args in _LUCKYSTAR.findall(line):
      args = ' '.join(re.split(r'\s#', args)[0].split())   # a trailing comment ends the command
      for form, location in _DATA_ITEM.findall(args):
        data = tmp / 'data' / location[len('/data/'):]
        if not data.exists():
          _data_file(form, data)
        args = args.replace(location, str(data))
      if module == 'main':
        if (init := _INIT_FROM.search(args)) and (init[1] in made or str(tmp) in init[1] and
                                                  any(p.strip('/').replace('/', '_') in init[1] for p in _CLUSTER_PATHS)):
          args = args.replace(init[0], f'--config.init_from={first_init or "tiny-sft"}')
        elif init and first_init is None:
          first_init = init[1]
        made.update(_WORKDIR.findall(args))
        command = f'python -m luckystar.main {args.strip()} --dry_run'
      elif module == 'aot_plan':
        command = f'python -m luckystar.aot_plan {args.strip()} --dry_run'
      else:   # the server's flags, parsed as it parses them; nothing loaded or served
        command = (f'python -c "import sys; from absl import flags; import luckystar.serve; flags.FLAGS(sys.argv)" '
                   f'{args.strip()}')
      checks.append((lineno, '\n'.join([*setup, *loop, command])))
    made.update(re.findall(r'[\w./-]*/[\w./-]+', line))   # paths this line makes, for the next lines
  return checks


def _cohere_checkpoint(tmp: pathlib.Path) -> pathlib.Path:
  sys.path.insert(0, str(ROOT / 'tests'))
  import cohere_checkpoint  # pylint: disable=g-import-not-at-top
  return cohere_checkpoint.build(tmp / 'r7b')


def dry_run_shell(block: Block, tmp: pathlib.Path) -> str | None:
  """None if every luckystar command of a not-run shell block parses, else the first failure."""
  env = {**_env(), 'XLA_FLAGS': '--xla_force_host_platform_device_count=8', 'JAX_PLATFORMS': 'cpu'}
  checks = dry_commands(block, tmp)
  if any('$R7B' in script for _, script in checks):
    env['R7B'] = str(_cohere_checkpoint(tmp))
  for lineno, script in checks:
    proc = subprocess.run(['bash', '-c', script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    if proc.returncode != 0:
      return (f'{block.path}:{lineno}: `{script.splitlines()[-1]}` (a not-run command, checked) exited '
              f'{proc.returncode} (block at line {block.line})\n{_tail(proc.stdout + proc.stderr)}')
  return None


def dry_runnable(blocks: list[Block]) -> list[Block]:
  return [b for b in blocks if b.lang in ('bash', 'sh', 'console') and b.not_run is not None
          and _LUCKYSTAR.search(b.code.replace('\\\n', ' '))]


def runnable(blocks: list[Block]) -> list[Block]:
  return [b for b in blocks if b.lang in RUN_LANGUAGES and b.not_run is None]


def check(text: str, path: str, tmp: pathlib.Path) -> list[str]:
  """Every failure of a markdown text's runnable blocks."""
  failures = []
  for n, block in enumerate(runnable(parse(text, path))):
    here = tmp / f'block{n}'
    here.mkdir()
    if (failure := run_block(block, here)) is not None:
      failures.append(failure)
  return failures


def _all_blocks() -> list[Block]:
  return [block for doc in DOCS for block in parse(doc.read_text(), str(doc.relative_to(ROOT)))]


BLOCKS = _all_blocks()


@pytest.mark.parametrize('block', runnable(BLOCKS), ids=lambda b: b.where)
def test_block_runs(block, tmp_path):
  failure = run_block(block, tmp_path)
  assert failure is None, failure


@pytest.mark.parametrize('block', dry_runnable(BLOCKS), ids=lambda b: b.where)
def test_not_run_commands_parse(block, tmp_path):
  failure = dry_run_shell(block, tmp_path)
  assert failure is None, failure


@pytest.mark.fast
def test_fences_have_known_languages():
  bad = [f'{b.where}: ```{b.lang or "(none)"}' for b in BLOCKS if b.lang not in KNOWN_LANGUAGES]
  assert not bad, f'fences must be one of {KNOWN_LANGUAGES} (text never runs):\n' + '\n'.join(bad)
  marked_text = [b.where for b in BLOCKS if b.lang == 'text' and b.not_run is not None]
  assert not marked_text, f'text blocks never run; drop their not-run marker: {marked_text}'
  assert runnable(BLOCKS), 'no runnable block found: is the parser broken?'


@pytest.mark.fast
def test_readme_is_short():
  count = len((ROOT / 'README.md').read_text().splitlines())
  assert count <= README_MAX_LINES, f'README.md has {count} lines; move detail to docs/ (at most {README_MAX_LINES})'


@pytest.mark.fast
def test_relative_links_resolve():
  missing = []
  for doc in DOCS:
    for lineno, line in enumerate(doc.read_text().split('\n'), 1):
      for target in re.findall(r'\]\(([^)\s]+)\)', line):
        if re.match(r'[a-z]+:', target) or target.startswith('#'):
          continue
        if not (doc.parent / target.split('#')[0]).exists():
          missing.append(f'{doc.relative_to(ROOT)}:{lineno}: {target}')
  assert not missing, 'links to missing files:\n' + '\n'.join(missing)


BROKEN = """# A broken page
<!-- not run: broken on purpose, and skipped -->
```python
raise SystemExit(3)
```

```python
print('hello')
```

```text
goodbye
```

```python
x = 1
raise ValueError('boom')
```

```bash
true
false
```

<!-- not run: skipped -->
```bash
false
```
"""


@pytest.mark.fast
def test_broken_blocks_are_reported(tmp_path):
  blocks = parse(BROKEN, 'broken.md')
  assert [(b.line, b.lang, b.not_run is not None, b.expected) for b in blocks] == [
      (3, 'python', True, None), (7, 'python', False, 'goodbye\n'), (15, 'python', False, None),
      (20, 'bash', False, None), (26, 'bash', True, None)]
  failures = check(BROKEN, 'broken.md', tmp_path)
  assert len(failures) == 3, failures
  mismatch, error, shell = failures
  assert mismatch.startswith('broken.md:7: ') and '-goodbye' in mismatch and '+hello' in mismatch, mismatch
  assert error.startswith('broken.md:15: ') and 'ValueError: boom' in error, error
  assert 'line 17' in error, error   # the traceback points at the markdown line of the raise
  assert shell.startswith('broken.md:22: `false` exited 1'), shell
  with pytest.raises(ValueError, match=r'broken.md:2: code fence is never closed'):
    parse('text\n```bash\necho\n', 'broken.md')
  with pytest.raises(ValueError, match=r'needs a reason'):
    parse('<!-- not run: -->\n```bash\necho\n```\n', 'broken.md')


NOT_RUN_BROKEN = """# A page whose skipped commands no longer parse
<!-- not run: long -->
```bash
python -m luckystar.main --config=configs/sft.py:smoke --workdir=/tmp/x \\
  --config.totl_steps=3
```

<!-- not run: a server -->
```bash
python -m luckystar.serve --init_from=tiny-sft --prot=8000 &
```
"""


def test_broken_not_run_commands_are_reported(tmp_path):
  main, serve = dry_runnable(parse(NOT_RUN_BROKEN, 'broken.md'))
  assert [script.splitlines()[-1] for _, script in dry_commands(main, tmp_path)] == [
      f'python -m luckystar.main --config=configs/sft.py:smoke --workdir={tmp_path}/tmp/x --config.totl_steps=3 '
      '--dry_run']
  failure = dry_run_shell(main, tmp_path)
  assert failure.startswith('broken.md:4: ') and "unknown config key 'totl_steps'" in failure, failure
  failure = dry_run_shell(serve, tmp_path)
  assert failure.startswith('broken.md:10: ') and 'prot' in failure, failure
