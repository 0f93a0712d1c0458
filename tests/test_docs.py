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
