"""Math answer verifier: math-verify in a worker process we can kill (DESIGN §1, §5).

Model output is untrusted, and an RL policy pushes on every hole it finds.
math-verify runs on sympy, which hangs on `9**9**9**9`, eats memory on
`100000!` and overflows the stack on deeply nested input; math-verify's own
timeouts use `signal.alarm`, which works only on the main thread. So all
parsing and comparison happens in a separate worker process:

- The worker is a fresh interpreter (`python -P this_file`, started with
  fork+exec by `subprocess`), never a `fork` of the trainer, whose JAX threads
  would not survive it. It is not a `multiprocessing` spawn child either: that
  would re-import the trainer's `__main__` and `luckystar` (jax: ~2 s, 170 MB)
  at every restart. This file imports nothing but the standard library at the
  top, so it doubles as the worker program, which imports only math-verify.
- It is persistent: sympy is imported once, then requests flow over its
  stdin/stdout as length-prefixed JSON (no pickle in either direction).
- A request that runs past `timeout_s` gets its worker terminated (then
  killed); a fresh worker starts on the next one (~1 s of imports). The calling
  process survives all of it. To save that restart when sympy is merely slow
  in Python code, the worker first interrupts itself (SIGALRM, at
  `SOFT_TIMEOUT_FRACTION` of `timeout_s`); the kill is for hangs inside C
  (`9**9**9**9`), where no signal handler runs.
- The worker caps its own address space (`RLIMIT_AS`, 3 GiB), ignores Ctrl-C
  (the trainer decides when it ends) and dies with its parent (Linux
  `PR_SET_PDEATHSIG`; elsewhere an idle worker still exits on stdin EOF).
- Nothing in a prediction is ever passed to eval/exec by us. math-verify's
  plain-expression path hands sympy's `parse_expr` only strings its regex
  limits to digits, operators and parentheses; LaTeX goes through an ANTLR
  parser. Both run inside the worker anyway.

Scores: True (equivalent), False (not equivalent, no answer found in the
prediction, or the prediction made the verifier fail), None (the gold itself
cannot be scored: it does not parse or is prose, or checking it failed).
Before a gold's first prediction the worker checks that the gold parses, with
the same parsing scoring uses, and the answer is cached per gold. So a
prediction that times out, crashes the worker or makes math-verify raise
scores False, exactly as a wrong answer does: an RL policy gains nothing by
emitting verifier bombs, whatever form the gold has. Callers count Nones as
their own metric; they are never a silent 0. `MathVerifier.stats` counts why.

Predictions longer than `MAX_PREDICTION_CHARS` score False without parsing:
the response section holds the final answer, and no genuine one is that long,
while a policy that learned long junk makes a parser slow (a 1 MB string takes
~4 s). False, not None, so that padding an answer is punished, not excused.

Accepted answer forms (math-verify's LaTeX and plain-expression extraction):
`\\boxed{...}`, `$...$` / `\\(...\\)` / `\\[...\\]`
LaTeX, plain numbers and arithmetic (`-3`, `0.5`, `1/2`, `2^10`), thousands
separators (`1,234`, `1 234`), percentages (`50%` equals 0.5), assignments
(`x = 3` scores as 3), and answer markers: English (`The final answer is 7`,
`Answer: 7`) and Korean (`정답은`, `답:`, `최종 답은` ..., rewritten to `answer:`).
With a marker, only the sentence the last one introduces is scored: up to a
newline, or a `.`, `!`, `?` before a space, outside braces and closed math
delimiters. So a check after the answer is not the answer: `정답은 5입니다.
검산: 5 + 1 = 6` and `The answer is 5. Check: 5 + 1 = 6` score as 5. A marker
whose sentence holds no answer (`The answer is as follows:`) is passed over
for the one before it (up to `MAX_ANSWER_MARKERS`), then for the whole text.
Fractions end sentences in either language (`정답은 327/4입니다.`, `The answer
is 404/5.`). Without any marker, the last number or LaTeX expression in the
text is the answer. LaTeX in a prediction needs delimiters: a bare `2\\pi`
reads as the number 2.

A value the prediction itself rejects is not its answer, as a person reads it:
negated (`5가 아니라 7`, `5는 정답이 아니고 7`, `5가 아닌 7`, `not 5 but 7`,
`7, not 5`, `is not 5; it is 7`), called wrong (`5는 틀렸고 정답은 7`,
`7 is right, 5 is wrong`) or taken back for another (`5, no wait, 7`,
`5, 아니 7`). Such values (numbers, fractions, percentages, `$..$`,
`\\(..\\)`, `\\boxed{}`) are struck out before the answer is looked for; all
of these score as 7.

Gold answers are LaTeX, bare (`\\frac{\\sqrt{2}}{2}`, `42`, `x=3`, as in MATH's
boxed contents) or already delimited; bare ones are parsed as `\\boxed{gold}`.
`\\$` is a dollar sign, dropped: `\\$18.90` is 18.90. A bare gold with prose
in it scores None, for the judge to decide: a word of 3+ letters that is no
LaTeX command, environment or `\\text{}` group and no math function (`sqrt`,
`and`, `or` ...), as in CHAMP's `98 values` or `The limit exists and is equal
to 3`, whose letters would otherwise multiply as symbols.

  from luckystar.rewards import math as math_reward
  math_reward.is_correct('정답은 42입니다.', '42')          # True
  math_reward.are_correct([('\\boxed{0.5}', '\\frac{1}{2}'), ('7', '8')])  # [True, False]
"""

import atexit
import collections
import functools
import json
import logging
import os
import re
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from typing import Sequence

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MEMORY_LIMIT_BYTES = 3 << 30
MAX_PREDICTION_CHARS = 10_000
SOFT_TIMEOUT_FRACTION = 0.8
MAX_ANSWER_MARKERS = 3   # each costs a parse (~2 ms): a prediction of 1000 'answer:'s must not time out
STARTUP_TIMEOUT_S = 60.0   # importing sympy is trusted work, but slow on a loaded machine
GOLD_CACHE_SIZE = 65_536   # golds whose parse (worker) and parses-or-not (parent) are kept: a run's worth

_FRAME_HEADER = struct.Struct('>I')   # payload length, then UTF-8 JSON
_TERMINATE_GRACE_S = 0.5
_LATEX_DELIMITERS = ('$', '\\boxed', '\\(', '\\[')
_KOREAN_ANSWER_MARKER = re.compile(r'(?:최종\s*)?정?답\s*(?:은|는|:|：)')
_ANSWER_MARKER = re.compile(r'(?:final\s+)?answer(?:\*\*)?\s*(?:is\b|:|：)', re.IGNORECASE)
_MATH_CLOSERS = {'$$': '$$', '$': '$', '\\[': '\\]', '\\(': '\\)'}   # '$$' is tried before '$'
_SENTENCE_END = re.compile(r'[.!?。](?=\s|$)|\n')
# Prose in a bare gold (see the module docstring): a word that is neither LaTeX nor one of _MATH_WORDS, the
# function names and the connectors math-verify reads as commas.
_WORD = re.compile(r'[A-Za-z]{3,}')
_MATH_WORDS = frozenset('and or sqrt sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln exp max min '
                        'gcd lcm mod floor ceil det lim inf'.split())
_LATEX_NOT_WORDS = re.compile(r'\\(?:text\w*|math\w*|mbox|operatorname|begin|end)\s*\{[^{}]*\}|\\[A-Za-z]+')
# math-verify reads '327/4입니다' as 327 and the sentence-final '404/5.' as 404/5.0 (then unequal to
# 404/5): a space goes between a number and the Hangul after it, and a period that ends a number goes.
_NUMBER_THEN_HANGUL = re.compile(r'(\d)(?=[가-힣])')
_PERIOD_AFTER_NUMBER = re.compile(r'(\d)\.(?!\d)')
# A value a prediction states: delimited LaTeX, or a number that starts a digit run (so the scan stays linear
# on long digit strings), with its fraction and percent sign.
_VALUE = (r'(?:\$[^$]+\$|\\\(.{0,500}?\\\)|\\boxed\{(?:[^{}]|\{[^{}]*\})*\}'
          r'|(?<![0-9A-Za-z.,])[-−]?\d+(?:[.,]\d+)*(?:\s*/\s*\d+(?:\.\d+)?)?(?:\s*\\?%)?)')
_NOT_RIGHT = r'(?:the\s+(?:right\s+|correct\s+)?answer|right|correct)'
# A value the text rejects, with the words that reject it (see the module docstring).
_REJECTED_VALUE = re.compile(
    # Korean, after the value: '5가 아니라', '5는 정답이 아니고', '5, 아니', '5는 틀렸고' (not '아니면' = or,
    # '아닌가' = isn't it, '틀리지 않' = not wrong, '틀림없' = surely).
    rf'{_VALUE}[가-힣]{{0,3}}(?:\s*정?답[가-힣]{{0,2}})?[\s,…]*'
    r'(?:아니(?!면)|아닌(?!가)|아닙|틀리(?!지\s*않)|틀렸|틀린|틀림(?!없)|오답)[가-힣]*[\s,.…]*'
    # English, before the value: 'not 5 but', 'is not 5;', "isn't 5", 'rather than 5'.
    rf'|\b(?:not|isn[\'’]t|wasn[\'’]t|cannot\s+be|can[\'’]t\s+be|never|rather\s+than|instead\s+of)\s+'
    rf'(?:equal\s+to\s+|be\s+)?{_VALUE}[\s,;:]*(?:but\b)?'
    # English, after the value: '5 is wrong', "5 isn't the answer".
    rf'|{_VALUE}\s+(?:(?:is|was)\s+(?:wrong|incorrect|not\s+{_NOT_RIGHT})|(?:isn|wasn)[\'’]t\s+{_NOT_RIGHT})\b'
    # Taken back for the value that follows: '5, no wait, 7', '5 - sorry, I mean 7'.
    rf'|{_VALUE}[\s,.;:!…—–-]*(?:(?:no|nope|wait|sorry|oops|I\s+mean|correction|scratch\s+that|make\s+that)\b'
    rf'[\s,.;:!…—–-]*)+(?=(?:it[\'’]?s\s+|it\s+is\s+|the\s+answer\s+is\s+)?{_VALUE})',
    re.IGNORECASE)

logger = logging.getLogger(__name__)


class WorkerStartError(RuntimeError):
  """The math worker could not start: an environment problem, not a bad prediction."""


class _WorkerGone(Exception):
  """The worker died or closed its pipe mid-request."""


class _SoftTimeout(BaseException):
  """Raised in the worker by SIGALRM; a BaseException so math-verify's `except Exception` lets it by."""


# ---- parent side ---------------------------------------------------------------------------------


def _stop(process: subprocess.Popen, owner_pid: int) -> None:
  """Ends a worker for good: SIGTERM, then SIGKILL if it lingers. Safe on a worker already dead."""
  if os.getpid() != owner_pid:
    return   # a forked copy of the trainer exiting must not take the trainer's worker with it
  for pipe in (process.stdin, process.stdout):
    try:
      pipe.close()
    except OSError:
      pass   # a dead worker's pipe may already be broken
  for send_signal in (process.terminate, process.kill):
    try:
      send_signal()
    except ProcessLookupError:
      pass
    try:
      process.wait(timeout=_TERMINATE_GRACE_S)
      return
    except subprocess.TimeoutExpired:
      continue
  process.wait()   # after SIGKILL the kernel reaps promptly


class _Worker:
  """One worker process and its pipes; the parent never reads it without a deadline."""

  def __init__(self, memory_limit_bytes: int, startup_timeout_s: float):
    self.process = subprocess.Popen(
        [sys.executable, '-P', os.path.abspath(__file__), '--worker',
         f'--memory_limit_bytes={memory_limit_bytes}', f'--parent_pid={os.getpid()}'],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    # At exit or when the verifier is collected, whichever comes first; calling it again is a no-op.
    self.stop = weakref.finalize(self, _stop, self.process, os.getpid())
    try:
      reply = self.receive(time.monotonic() + startup_timeout_s)
    except (TimeoutError, _WorkerGone, ValueError) as e:
      self.stop()
      raise WorkerStartError(
          f'the math-verify worker ({sys.executable} {__file__} --worker) did not start within '
          f'{startup_timeout_s:.0f} s ({type(e).__name__}); its stderr is above. Run that command by hand '
          'to see why.') from None
    if 'error' in reply:
      self.stop()
      raise WorkerStartError(f'the math-verify worker failed to start: {reply["error"]}. '
                             f'Install it for this interpreter: {sys.executable} -m pip install math-verify')

  @property
  def pid(self) -> int:
    return self.process.pid

  def alive(self) -> bool:
    return self.stop.alive and self.process.poll() is None

  def send(self, message: dict) -> None:
    payload = json.dumps(message).encode()   # ensure_ascii: lone surrogates travel as \ud800 escapes
    frame = memoryview(_FRAME_HEADER.pack(len(payload)) + payload)
    try:
      while frame:   # a raw pipe write may be partial
        frame = frame[self.process.stdin.write(frame):]
    except (BrokenPipeError, ConnectionError, ValueError) as e:
      raise _WorkerGone() from e

  def receive(self, deadline: float) -> dict:
    header = self._read_exactly(_FRAME_HEADER.size, deadline)
    (length,) = _FRAME_HEADER.unpack(header)
    return json.loads(self._read_exactly(length, deadline))

  def _read_exactly(self, size: int, deadline: float) -> bytes:
    chunks, received = [], 0
    with selectors.DefaultSelector() as selector:
      selector.register(self.process.stdout, selectors.EVENT_READ)
      while received < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not selector.select(remaining):
          raise TimeoutError()
        chunk = os.read(self.process.stdout.fileno(), size - received)
        if not chunk:
          raise _WorkerGone()
        chunks.append(chunk)
        received += len(chunk)
    return b''.join(chunks)


class MathVerifier:
  """Scores predictions against gold answers in one persistent, killable worker process.

  Thread-safe (calls are serialised). The worker starts on the first call and
  after any timeout or crash; `close()` (or leaving a `with` block, or process
  exit) ends it.

  stats counts outcomes that are not a plain True/False, per scored pair:
  `overlong` (prediction over MAX_PREDICTION_CHARS), and the prediction's
  `timeout`, `crash`, `worker_error` (all four score False); `gold_unparsable`
  and `gold_check_failed` (the gold's own check timed out or failed; both score
  None); and `worker_starts`.
  """

  def __init__(self, *, memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
               startup_timeout_s: float = STARTUP_TIMEOUT_S):
    self.memory_limit_bytes = memory_limit_bytes
    self.startup_timeout_s = startup_timeout_s
    self.stats = collections.Counter()
    self._gold_parses: collections.OrderedDict[str, bool] = collections.OrderedDict()   # an LRU
    self._worker: _Worker | None = None
    self._lock = threading.Lock()

  def __enter__(self) -> 'MathVerifier':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  @property
  def worker_pid(self) -> int | None:
    """The live worker's pid, or None when there is none (not started yet, or ended)."""
    worker = self._worker
    return worker.pid if worker is not None and worker.alive() else None

  def close(self) -> None:
    """Ends the worker; a later call starts a fresh one."""
    with self._lock:
      self._discard_worker()

  def score(self, prediction: str, gold: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool | None:
    """True/False, or None when it cannot be scored (see the module docstring)."""
    return self.score_all([(prediction, gold)], timeout_s=timeout_s)[0]

  def score_all(self, pairs: Sequence[tuple[str, str]], *, timeout_s: float = DEFAULT_TIMEOUT_S
                ) -> list[bool | None]:
    """One score per (prediction, gold) pair; timeout_s bounds each worker request on its own: a new gold's
    check (once per gold), then each prediction."""
    if not timeout_s > 0:
      raise ValueError(f'timeout_s must be positive, got {timeout_s!r}')
    pairs = list(pairs)
    for index, pair in enumerate(pairs):
      if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
        raise TypeError(f'pairs[{index}] must be a (prediction: str, gold: str) tuple, got {pair!r:.200}; '
                        "pass '' for a missing response section")
    with self._lock:
      return [self._score_one(prediction, gold, timeout_s) for prediction, gold in pairs]

  def _score_one(self, prediction: str, gold: str, timeout_s: float) -> bool | None:
    if len(prediction) > MAX_PREDICTION_CHARS:
      self.stats['overlong'] += 1
      return False
    gold_parses = self._gold_parses_cached(gold, timeout_s)
    if not gold_parses:
      self.stats['gold_unparsable' if gold_parses is False else 'gold_check_failed'] += 1
      return None
    reply, failure = self._request({'prediction': prediction, 'gold': gold}, timeout_s)
    if failure is not None:   # the gold parses, so the prediction made the verifier fail: no better than wrong
      self.stats[failure] += 1
      return False
    if reply['result'] is None:   # cannot happen for a gold that parsed, unless the worker changed its mind
      self.stats['gold_unparsable'] += 1
    return reply['result']

  def _gold_parses_cached(self, gold: str, timeout_s: float) -> bool | None:
    """Does `gold` parse as a gold, as scoring parses it? Asked once per gold; None when the check itself
    failed (not cached: a loaded moment must not make a gold unscorable for good)."""
    if gold in self._gold_parses:
      self._gold_parses.move_to_end(gold)
      return self._gold_parses[gold]
    reply, failure = self._request({'gold': gold}, timeout_s)
    if failure is not None:
      logger.warning('checking gold answer %r failed (%s); its predictions score None', gold[:200], failure)
      return None
    if not reply['gold_parses']:
      logger.warning('gold answer %r does not parse as math; its predictions score None', gold[:200])
    self._gold_parses[gold] = reply['gold_parses']
    if len(self._gold_parses) > GOLD_CACHE_SIZE:
      self._gold_parses.popitem(last=False)
    return reply['gold_parses']

  def _request(self, message: dict, timeout_s: float) -> tuple[dict | None, str | None]:
    """(the worker's reply, None), or (None, why it failed: 'timeout', 'crash' or 'worker_error')."""
    if self._worker is None or not self._worker.alive():   # lazily, also after an idle worker died
      self._discard_worker()
      self._worker = _Worker(self.memory_limit_bytes, self.startup_timeout_s)
      self.stats['worker_starts'] += 1
    try:
      self._worker.send(dict(message, soft_timeout_s=timeout_s * SOFT_TIMEOUT_FRACTION))
      reply = self._worker.receive(time.monotonic() + timeout_s)
    except TimeoutError:
      self._discard_worker()
      return None, 'timeout'
    except (_WorkerGone, ValueError) as e:   # ValueError: a garbled frame from a dying worker
      code = self._worker.process.poll()
      logger.warning('math-verify worker crashed (exit code %s, %s); restarting it', code, type(e).__name__)
      self._discard_worker()
      return None, 'crash'
    if reply.get('timeout'):   # the worker interrupted itself and lives on
      return None, 'timeout'
    if 'error' in reply:   # an exception escaped math-verify inside the worker; the worker lives on
      logger.warning('math-verify raised %s', reply['error'])
      return None, 'worker_error'
    return reply, None

  def _discard_worker(self) -> None:
    if self._worker is not None:
      self._worker.stop()
      self._worker = None


_default_verifier: MathVerifier | None = None
_default_verifier_lock = threading.Lock()


def _shared_verifier() -> MathVerifier:
  global _default_verifier
  with _default_verifier_lock:
    if _default_verifier is None:
      _default_verifier = MathVerifier()
    return _default_verifier


def is_correct(prediction: str, gold: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool | None:
  """Is the response section `prediction` mathematically equal to `gold`? None: the gold cannot be scored."""
  return _shared_verifier().score(prediction, gold, timeout_s=timeout_s)


def are_correct(pairs: Sequence[tuple[str, str]], *, timeout_s: float = DEFAULT_TIMEOUT_S
                ) -> list[bool | None]:
  """is_correct for each (prediction, gold) pair, through one shared worker."""
  return _shared_verifier().score_all(pairs, timeout_s=timeout_s)


def close() -> None:
  """Ends the shared worker behind is_correct/are_correct (it also ends at exit)."""
  with _default_verifier_lock:
    if _default_verifier is not None:
      _default_verifier.close()


atexit.register(close)


# ---- worker side (runs as `python -P math.py --worker`) -------------------------------------------


def _read_frame(stream) -> dict | None:
  header = stream.read(_FRAME_HEADER.size)
  if len(header) < _FRAME_HEADER.size:
    return None   # the parent closed our stdin: time to go
  (length,) = _FRAME_HEADER.unpack(header)
  return json.loads(stream.read(length))


def _write_frame(stream, message: dict) -> None:
  payload = json.dumps(message).encode()
  stream.write(_FRAME_HEADER.pack(len(payload)) + payload)
  stream.flush()


def _die_with_parent(parent_pid: int) -> None:
  """Asks Linux to SIGKILL us when the parent dies, so a hung worker cannot outlive the trainer.

  Linux means the parent *thread*: a worker started from a thread that later
  ends dies with it, and the next call starts a fresh one.
  """
  try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # 1 = PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass   # not Linux: an idle worker still exits on stdin EOF
  if os.getppid() != parent_pid:
    os._exit(0)   # the parent died before prctl took effect


def _is_prose(bare_gold: str) -> bool:
  """Does a gold without math delimiters hold a word (3+ letters) outside LaTeX commands, environment names and
  `\\text{}`-like groups that is no math function or connector?"""
  words = _WORD.findall(_LATEX_NOT_WORDS.sub(' ', bare_gold))
  return any(word.lower() not in _MATH_WORDS for word in words)


def _sentence_end(text: str, position: int) -> int:
  """Where the sentence that starts at `position` (after any blank) ends: a newline, or `.`, `!`, `?` before a
  space or the end of the text; never inside braces or inside math delimiters that close."""
  while position < len(text) and text[position].isspace():   # the answer may start on the next line
    position += 1
  depth = 0   # of braces
  while position < len(text):
    opener = next((o for o in _MATH_CLOSERS if text.startswith(o, position)), None)
    math_end = text.find(_MATH_CLOSERS[opener], position + len(opener)) if opener else -1
    if math_end >= 0:
      position = math_end + len(_MATH_CLOSERS[opener])
    elif text[position] == '\\':
      position += 2   # a command or an escaped character (`\$`, `\{`)
    elif depth <= 0 and _SENTENCE_END.match(text, position):
      return position
    else:
      depth += {'{': 1, '}': -1}.get(text[position], 0)
      position += 1
  return len(text)


def _answer_candidates(prediction: str):
  """Where the answer is, best first: the sentence each of the last MAX_ANSWER_MARKERS answer markers
  introduces, the last marker's first, then the whole prediction. So a check after the answer ('The answer is
  13. Check: 10 + 4 = 14') is not read as the answer, while a marker that introduces none ('The answer is as
  follows:', '... so the answer is correct.') is passed over."""
  for marker in reversed(list(_ANSWER_MARKER.finditer(prediction))[-MAX_ANSWER_MARKERS:]):
    yield prediction[marker.start():_sentence_end(prediction, marker.end())]
  yield prediction


def _parse_gold(math_verify, extraction_config, gold: str) -> list | None:
  """The gold as scoring reads it, or None when it cannot be scored (empty, prose, or only raw text)."""
  gold = gold.strip().replace('\\$', '')   # trusted data: no length cap. '\$18.90' is a price, not math
  if gold and not any(delimiter in gold for delimiter in _LATEX_DELIMITERS):
    if _is_prose(gold):
      return None   # unscorable: the judge decides
    gold = f'\\boxed{{{gold}}}'   # bare gold is LaTeX: unwrapped, '2\\pi' would parse as 2
  gold_parsed = math_verify.parse(gold, extraction_config, parsing_timeout=None)
  if all(isinstance(item, str) for item in gold_parsed):   # empty, or only the raw-text fallback
    return None
  return gold_parsed


def _without_rejected_values(prediction: str) -> str:
  """The prediction with each value it negates, calls wrong or takes back struck out ('5가 아니라 7' → ' 7')."""
  return _REJECTED_VALUE.sub(' ', prediction)


def _verify(math_verify, extraction_config, prediction: str, gold_parsed: list) -> bool:
  prediction = _KOREAN_ANSWER_MARKER.sub('answer: ', _without_rejected_values(prediction))
  prediction_parsed = []
  for candidate in _answer_candidates(prediction):
    candidate = _PERIOD_AFTER_NUMBER.sub(r'\1', _NUMBER_THEN_HANGUL.sub(r'\1 ', candidate))
    prediction_parsed = math_verify.parse(candidate, extraction_config, parsing_timeout=None)
    if prediction_parsed:
      break
  if not prediction_parsed:
    return False
  # Gold first: math-verify is not symmetric (assignments, intervals). timeout_seconds=None turns
  # off its signal.alarm timeouts (whole seconds, and they score False); ours are in _answer.
  return bool(math_verify.verify(gold_parsed, prediction_parsed, timeout_seconds=None))


def _raise_soft_timeout(signum, frame):
  raise _SoftTimeout()


def _answer(math_verify, extraction_config, parse_gold, request: dict) -> dict:
  """A request with a prediction is scored; one without asks whether its gold parses."""
  try:
    signal.setitimer(signal.ITIMER_REAL, request['soft_timeout_s'])
    try:
      gold_parsed = parse_gold(request['gold'])
      if 'prediction' not in request:
        return {'gold_parses': gold_parsed is not None}
      if gold_parsed is None:
        return {'result': None}
      return {'result': _verify(math_verify, extraction_config, request['prediction'], gold_parsed)}
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
  except _SoftTimeout:   # also when the alarm lands just after the work returned: a failure errs on the safe side
    return {'timeout': True}
  except Exception as e:   # math-verify catches most (MemoryError, RecursionError too); report the rest
    return {'error': type(e).__name__}


def _serve(memory_limit_bytes: int, parent_pid: int) -> None:
  import resource
  resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGALRM, _raise_soft_timeout)
  _die_with_parent(parent_pid)
  # The protocol owns the real stdout; anything a library prints goes to stderr instead.
  protocol_out = os.fdopen(os.dup(1), 'wb')
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  protocol_in = sys.stdin.buffer
  try:
    import math_verify
  except Exception as e:   # e.g. not installed: tell the parent, which raises WorkerStartError
    _write_frame(protocol_out, {'error': f'{type(e).__name__}: {e}'})
    return
  logging.getLogger('math_verify').setLevel(logging.ERROR)   # "timeout is disabled" is on purpose
  extraction_config = (math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig())
  # A gold is parsed once, for its check and for every prediction after it (math-verify does not mutate it).
  parse_gold = functools.lru_cache(maxsize=GOLD_CACHE_SIZE)(
      functools.partial(_parse_gold, math_verify, extraction_config))
  _write_frame(protocol_out, {'ready': True})
  while (request := _read_frame(protocol_in)) is not None:
    _write_frame(protocol_out, _answer(math_verify, extraction_config, parse_gold, request))


def _main(argv: list[str]) -> None:
  import argparse
  parser = argparse.ArgumentParser(description='math-verify worker; started by luckystar.rewards.math')
  parser.add_argument('--worker', action='store_true', required=True)
  parser.add_argument('--memory_limit_bytes', type=int, default=DEFAULT_MEMORY_LIMIT_BYTES)
  parser.add_argument('--parent_pid', type=int, default=os.getppid())
  args = parser.parse_args(argv)
  _serve(args.memory_limit_bytes, args.parent_pid)


if __name__ == '__main__':
  _main(sys.argv[1:])
