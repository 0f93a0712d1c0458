"""Math answer verifier: math-verify in a worker process we can kill (docs/rl.md).

Model output is untrusted, and an RL policy pushes on every hole it finds.
math-verify runs on sympy, which hangs on `9**9**9**9`, eats memory on
`100000!` and overflows the stack on deeply nested input; math-verify's own
timeouts use `signal.alarm`, which works only on the main thread. So all
parsing and comparison happens in a separate worker process:

- The worker is a `luckystar.workers.Worker`: a fresh interpreter
  (`python -P`), never a fork of the trainer nor a re-import of it, that loads
  this file alone (which imports nothing but the standard library at the top)
  and then math-verify.
- It is persistent: sympy is imported once, then requests flow over its
  stdin/stdout as length-prefixed JSON (no pickle in either direction).
- A request that runs past `timeout_s` gets its worker killed; a fresh worker
  starts on the next one (~1 s of imports). The calling process survives all
  of it. To save that restart when sympy is merely slow
  in Python code, the worker first interrupts itself (SIGALRM, at
  `SOFT_TIMEOUT_FRACTION` of `timeout_s`); the kill is for hangs inside C
  (`9**9**9**9`), where no signal handler runs.
- The worker's address space is capped (`RLIMIT_AS`, 3 GiB), it ignores
  Ctrl-C (the trainer decides when it ends) and dies with its parent (Linux
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
separators (`1,234`, `1 234`; a period is always a decimal point, so `1.000` is
1, never the European 1000), percentages (`50%` equals 0.5, and 50 as well, as
math-verify has it: "what percent" golds are written either way), assignments
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
text is the answer.

A notation after a number is part of its value, never dropped for the leading
number (which math-verify alone reads): bare LaTeX that starts with a number or
a command is read as LaTeX, as if in `$..$` (`2\\pi` is 2π, `2 \\times 3` is 6,
`2^{10}` is 1024, `10!` is 3628800, also after an answer marker), as are `3²`,
`2π`, `2 pi` and `2√3`. A letter glued to a number makes it a product, never
the number: `2e` is 2·e, `2i` is 2i, and `3k`, `3M`, `2B` are 3·k and so on,
which no plain number equals (k for thousand or kelvin is ambiguous). Units of
two letters or more stay units (`5cm` is 5, `3rd` is 3), as does `90°`. Digits
joined by commas that group no thousands (`1,5`, `1,50`) are a list of values,
as in a bare gold, so `1,5` is never 1.5 (the European decimal), 15 or 5.

Scales are written out as decimals before anything reads them: times ten to a
power (`2\\times10^{3}`, `2 \\cdot 10^3`, `2·10^3`, `2*10^3`, `2 x 10^3`, `2×10³`
are 2000), magnitude words (`3 thousand`, `1.5 million`, `3 dozen`), Korean
magnitudes (`3만` 30000, `3만 5천` 35000, `1억 2345만 6789`, `3백만`, `2천`; a
currency after them such as `3만 원` is dropped as any unit is; 만큼, 만약 and
the like are words, not 10⁴), vulgar fractions (`1½` is 3/2), `0x1F` (31) and
`1_000`.

Scientific notation is its value, in predictions and golds alike: `2e3`, `2E3`,
`2.0e3`, `2e+3` and `1,000e3`'s peers are written out (2000, `1e-3` as 0.001)
before anything reads them, so `2e3` equals 2000 and never 2, which math-verify
alone reads it as; a malformed `2e3.5` is 2·e·3.5, never 2. An exponent past
`MAX_SCIENTIFIC_EXPONENT` (in either notation) is not written out (its digits
would be a bomb): such a prediction scores False, such a gold None. Golds get
the same writing out of scales; the reading of bare LaTeX and comma lists is
for predictions only (a bare gold is LaTeX already).
`NaN` and `inf` are words, not numbers: a prediction of them scores False, a
bare gold of them is prose (None, for the judge).

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
import decimal
import fractions
import functools
import json
import logging
import re
import shlex
import signal
import sys
import threading
import time
import unicodedata
from typing import Callable, Sequence

from luckystar import workers

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MEMORY_LIMIT_BYTES = 3 << 30
MAX_PREDICTION_CHARS = 10_000
SOFT_TIMEOUT_FRACTION = 0.8
MAX_ANSWER_MARKERS = 3   # each costs a parse (~2 ms): a prediction of 1000 'answer:'s must not time out
MAX_SCIENTIFIC_EXPONENT = 1000   # `1e1000` is written out as 1001 digits; `1e99999999` would be a bomb
MAX_INTEGER_DIGITS = 2 * MAX_PREDICTION_CHARS   # the worker's int<->str limit: a gold of 5,001 digits parses
STARTUP_TIMEOUT_S = 60.0   # importing sympy is trusted work, but slow on a loaded machine
GOLD_CACHE_SIZE = 65_536   # golds whose parse (worker) and parses-or-not (parent) are kept: a run's worth

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
# A number in scientific notation (mantissa with optional thousands separators, then e/E and a signed
# exponent); not inside a word or hex literal (`0x1e3`, `a1e5`), not a decimal's tail.
_SCIENTIFIC = re.compile(r'(?<![A-Za-z0-9_.])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?|\.\d+)[eE]([-+−]?\d+)'
                         r'(?!\.\d)')
# A number that may carry a notation after it: plain or with thousands separators, not inside a word or number.
_MANTISSA = r'(?<![A-Za-z0-9_.,^/÷])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)'
_SUPERSCRIPTS = str.maketrans('⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺', '0123456789-+')
# Times ten to a power: `2\times10^{3}`, `2 \cdot 10^3`, `2·10^3`, `2*10^3`, `2 x 10^3`, `2×10³`.
_TIMES_TEN = re.compile(_MANTISSA + r'\s*(?:\\times|\\cdot|[×·⋅∙*xX])\s*10\s*(?:\^\s*\{\s*([-+−]?\d+)\s*\}'
                        r'|\^\s*([-+−]?\d+)|([⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+))(?![\d^!.⁰¹²³⁴⁵⁶⁷⁸⁹]|\.\d)')
_MAGNITUDE_WORDS = {'hundred': 100, 'thousand': 10**3, 'million': 10**6, 'billion': 10**9, 'trillion': 10**12,
                    'dozen': 12}
_MAGNITUDE_WORD = re.compile(_MANTISSA + r'((?:\s+(?:' + '|'.join(_MAGNITUDE_WORDS) + r')\b)+)', re.IGNORECASE)
# Korean magnitudes: digits before 조 10¹², 억 10⁸, 만 10⁴ and 천, 백, 십 within them (`1억 2345만 6789`, `3백만`),
# not the words that start with those syllables (만큼 'as much as', 만약 'if', 조각 'piece' ...).
_KOREAN_UNITS = {'조': 10**12, '억': 10**8, '만': 10**4, '천': 1000, '백': 100, '십': 10}
_KOREAN_UNIT = r'[조억만천백십](?![큼약들족일나든각건합사])'
_KOREAN_NUMBER_PART = r'\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?'
_KOREAN_NUMBER = re.compile(rf'(?<![A-Za-z0-9_.,])(?:{_KOREAN_NUMBER_PART})\s?{_KOREAN_UNIT}'
                            rf'(?:\s?(?:(?:{_KOREAN_NUMBER_PART})\s?)?{_KOREAN_UNIT})*(?:\s?\d+(?![\d.,]))?')
_KOREAN_TOKEN = re.compile(rf'({_KOREAN_NUMBER_PART})?\s?([조억만천백십])|(\d+)$')
_VULGAR_FRACTION = re.compile(r'(?<![\w.,])(\d+)?([½⅓⅔¼¾⅕⅖⅗⅘⅙⅚⅛⅜⅝⅞])')
_NON_DECIMAL_INTEGER = re.compile(r'(?<![\w.])0(?:[xX][0-9a-fA-F]+|[bB][01]+|[oO][0-7]+)\b')
_UNDERSCORE_GROUPS = re.compile(r'(?<![\w.])\d{1,3}(?:_\d{3})+\b')
# Where math a prediction already delimits starts; bare LaTeX is looked for only outside it.
_MATH_OPENER = re.compile(r'\$\$|\$|\\\(|\\\[|\\boxed\s*\{')
# Bare LaTeX that starts with a number or a command (`2\pi`, `2 \times 3`, `2^{10}`, `10!`, `3k`): atoms (numbers,
# commands, brace groups, parentheses without words, operators, a letter glued to a number) with spaces between.
_BARE_ATOM = (r'(?:\\[A-Za-z]+|\\[,;:!{} ]|\d+(?:\.\d+)?|\{(?:[^{}\n]|\{(?:[^{}\n]|\{[^{}\n]*\})*\})*\}'
              r'|\((?:[^()A-Za-z\n]|\\[A-Za-z]+)*\)|[-+−*/=^_×·÷<>]|(?<=\d)[A-Za-z](?![A-Za-z])|(?<=\S)!)')
_BARE_LATEX = re.compile(rf'(?<![\w.,\\^_{{}}$])(?:[-−]?(?:\d+(?:\.\d+)?|\\[A-Za-z]+)|\((?:[^()A-Za-z\n]|\\[A-Za-z]+)*\))'
                         rf'(?:[ \t]*{_BARE_ATOM})*')
# What makes a bare run LaTeX rather than math-verify's plain arithmetic: a command, a brace, `^`, a factorial, or
# a letter glued to a number (`2e` is 2·e, `3k` 3·k: never 3).
_LATEX_SIGN = re.compile(r'[\\{^!]|\d[A-Za-z]')
# Digits joined by commas that group no thousands (`1,5`): values in a list, as in a bare gold.
_COMMA_LIST = re.compile(r'(?<![A-Za-z0-9_.,])\d+(?:\.\d+)?(?:,\d+(?:\.\d+)?)+(?![A-Za-z0-9_,]|\.\d)')
_THOUSANDS = re.compile(r'\d{1,3}(?:,\d{3})+(?:\.\d+)?')
# Unicode a plain-text answer writes math in, rewritten as LaTeX: `3²`, `2π`, `2 pi`, `2√3`.
_SUPERSCRIPT_EXPONENT = re.compile(r'[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+')
_SPELT_PI = re.compile(r'(\d)\s*(?:π|pi\b)')
_ROOT_SIGN = re.compile(r'√\s*(\d+(?:\.\d+)?|[A-Za-z]|\([^()\n]*\))')
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


class _SoftTimeout(BaseException):
  """Raised in the worker by SIGALRM; a BaseException so math-verify's `except Exception` lets it by."""


# ---- parent side ---------------------------------------------------------------------------------


def _start_worker(memory_limit_bytes: int, startup_timeout_s: float) -> workers.Worker:
  """A worker that has imported math-verify, or WorkerStartError."""
  worker = workers.Worker(__file__, '_worker_setup', flags=('-P',), limits={'RLIMIT_AS': memory_limit_bytes},
                          die_with_parent=True)
  try:
    ready, why = worker.wait_until_ready(time.monotonic() + startup_timeout_s), 'timed out'
  except workers.SetupFailed as e:
    worker.kill()
    raise WorkerStartError(f'the math-verify worker failed to start: {e}. '
                           f'Install it for this interpreter: {sys.executable} -m pip install math-verify') from None
  except workers.WorkerDied:
    ready, why = False, 'it exited'
  if not ready:
    worker.kill()
    raise WorkerStartError(
        f'the math-verify worker ({shlex.join(worker.command)}) did not start within {startup_timeout_s:.0f} s '
        f'({why}); its stderr is above. Run that command by hand to see why.')
  return worker


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
    self._worker: workers.Worker | None = None
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
      self._worker = _start_worker(self.memory_limit_bytes, self.startup_timeout_s)
      self.stats['worker_starts'] += 1
    request = json.dumps(dict(message, soft_timeout_s=timeout_s * SOFT_TIMEOUT_FRACTION)).encode()
    try:   # json.dumps escapes to ASCII: lone surrogates travel as \ud800 escapes
      reply = json.loads(self._worker.ask(request, time.monotonic() + timeout_s))
    except TimeoutError:
      self._discard_worker()
      return None, 'timeout'
    except (workers.WorkerDied, ValueError) as e:   # ValueError: a garbled frame from a dying worker
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
      self._worker.kill()
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


# ---- worker side (runs in the child `luckystar.workers` starts) ------------------------------------


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
  gold = _written_out(gold.strip().replace('\\$', ''))   # trusted: no length cap. '\$18.90' is a price
  if gold is None:
    return None   # an exponent too large to write out: the judge decides
  if gold and not any(delimiter in gold for delimiter in _LATEX_DELIMITERS):
    if _is_prose(gold):
      return None   # unscorable: the judge decides
    gold = f'\\boxed{{{gold}}}'   # bare gold is LaTeX: unwrapped, '2\\pi' would parse as 2
  gold_parsed = math_verify.parse(gold, extraction_config, parsing_timeout=None)
  if all(isinstance(item, str) for item in gold_parsed):   # empty, or only the raw-text fallback
    return None
  return gold_parsed


def _decimal(number: str) -> decimal.Decimal:
  return decimal.Decimal(number.replace(',', '').replace('−', '-'))


def _plain(value: decimal.Decimal) -> str:
  """Every digit, no exponent, no trailing zeros after a point: 35000, 0.0025."""
  text = format(value, 'f')
  return text.rstrip('0').rstrip('.') if '.' in text else text


def _korean_value(text: str) -> decimal.Decimal:
  """`1억 2345만 6789` → 123456789: 천, 백, 십 add up a section, which 만, 억, 조 then scale."""
  total = section = decimal.Decimal(0)
  for number, unit, trailing in _KOREAN_TOKEN.findall(text.replace(' ', '')):
    if trailing:
      total += _decimal(trailing)
    elif _KOREAN_UNITS[unit] < 10**4:
      section += (_decimal(number) if number else 1) * _KOREAN_UNITS[unit]
    else:
      total += ((section + (_decimal(number) if number else 0)) or 1) * _KOREAN_UNITS[unit]
      section = decimal.Decimal(0)
  return total + section


def _written_out(text: str, max_chars: int | None = None) -> str | None:
  """`text` with each number whose notation scales it written out as a decimal: scientific (`2e3` → 2000, `1e-3`
  → 0.001), times ten to a power (`2\\times10^{3}`), magnitude words (`3 thousand`, `3만 5천` → 35000), vulgar
  fractions (`1½` → 3/2), hexadecimal, binary, octal and `1_000`. None when an exponent is past
  MAX_SCIENTIFIC_EXPONENT or the result longer than `max_chars`: such a number has no digits worth writing."""
  too_big = False

  def scaled(mantissa: str, exponent: int) -> str:
    nonlocal too_big
    if abs(exponent) > MAX_SCIENTIFIC_EXPONENT:
      too_big = True
      return mantissa
    # Decimal from text is exact (no float rounding, no overflow to inf); 'f' writes every digit.
    return format(_decimal(mantissa).scaleb(exponent), 'f')

  def times_ten(match: re.Match) -> str:
    exponent = match[2] or match[3] or match[4].translate(_SUPERSCRIPTS)
    return scaled(match[1], int(exponent.replace('−', '-')))

  def magnitude_words(match: re.Match) -> str:
    value = _decimal(match[1])
    for word in match[2].split():
      value *= _MAGNITUDE_WORDS[word.lower()]
    return _plain(value)

  def vulgar_fraction(match: re.Match) -> str:
    value = fractions.Fraction(unicodedata.numeric(match[2])).limit_denominator(10) + int(match[1] or 0)
    return f'{value.numerator}/{value.denominator}'

  def non_decimal_integer(match: re.Match) -> str:
    nonlocal too_big
    if len(match[0]) > 66:   # 64 hex digits are 78 decimal ones; longer is no answer, and str(int) is quadratic
      too_big = True
      return match[0]
    return str(int(match[0], 0))

  text = _TIMES_TEN.sub(times_ten, text)
  text = _SCIENTIFIC.sub(lambda match: scaled(match[1], int(match[2].replace('−', '-'))), text)
  text = _MAGNITUDE_WORD.sub(magnitude_words, text)
  text = _KOREAN_NUMBER.sub(lambda match: _plain(_korean_value(match[0])), text)
  text = _VULGAR_FRACTION.sub(vulgar_fraction, text)
  text = _NON_DECIMAL_INTEGER.sub(non_decimal_integer, text)
  text = _UNDERSCORE_GROUPS.sub(lambda match: match[0].replace('_', ''), text)
  return None if too_big or (max_chars is not None and len(text) > max_chars) else text


def _delimited(prediction: str) -> str:
  """The prediction with its bare LaTeX in `$..$`, so that math-verify reads `2\\pi` as 2π and `10!` as 3628800,
  never as their leading number; and with a comma list of digits that groups no thousands (`1,5`) in `$..$` too,
  read as values in a list, as a bare gold's is, never as the European 1.5."""

  def bare_latex(match: re.Match) -> str:
    run = match[0].rstrip(' \t-+−*/=^_×·÷<>')
    if not _LATEX_SIGN.search(run):
      return match[0]   # plain arithmetic: math-verify's own expression reading
    return f'${run}${match[0][len(run):]}'

  def comma_list(match: re.Match) -> str:
    return match[0] if _THOUSANDS.fullmatch(match[0]) else f'${match[0]}$'

  def plain_part(text: str) -> str:
    text = _SUPERSCRIPT_EXPONENT.sub(lambda match: f'^{{{match[0].translate(_SUPERSCRIPTS)}}}', text)
    text = _ROOT_SIGN.sub(r'\\sqrt{\1}', _SPELT_PI.sub(r'\1\\pi ', text))
    return _BARE_LATEX.sub(bare_latex, _COMMA_LIST.sub(comma_list, text))

  parts, position = [], 0
  for opener in _MATH_OPENER.finditer(prediction):
    if opener.start() < position:
      continue   # inside the math before
    parts.append(plain_part(prediction[position:opener.start()]))
    position = _math_end(prediction, opener)
    parts.append(prediction[opener.start():position])
  return ''.join(parts + [plain_part(prediction[position:])])


def _math_end(text: str, opener: re.Match) -> int:
  """Where the math `opener` starts ends: after its closer, or its braces' close for `\\boxed{`; the end of the
  text when it never closes (left as it is)."""
  if opener[0] in _MATH_CLOSERS:
    end = text.find(_MATH_CLOSERS[opener[0]], opener.end())
    return len(text) if end < 0 else end + len(_MATH_CLOSERS[opener[0]])
  depth = 1
  for brace in re.finditer(r'\\.|[{}]', text[opener.end():]):
    depth += {'{': 1, '}': -1}.get(brace[0], 0)
    if depth == 0:
      return opener.end() + brace.end()
  return len(text)


def _without_rejected_values(prediction: str) -> str:
  """The prediction with each value it negates, calls wrong or takes back struck out ('5가 아니라 7' → ' 7')."""
  return _REJECTED_VALUE.sub(' ', prediction)


def _verify(math_verify, extraction_config, prediction: str, gold_parsed: list) -> bool:
  # First, so that `not 2e3` strikes 2000, not 2. Many `1e999`s would write out a parser-slowing text.
  prediction = _written_out(prediction, max_chars=2 * MAX_PREDICTION_CHARS)
  if prediction is None:
    return False
  prediction = _KOREAN_ANSWER_MARKER.sub('answer: ', _without_rejected_values(_delimited(prediction)))
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


def _worker_setup() -> Callable[[bytes], bytes]:
  """In the worker: sympy's integer limit, the soft-timeout alarm and math-verify; returns what answers a request."""
  # Python converts at most 4,300 digits between int and str; sympy then fails on a long gold such as a
  # 5,001-digit integer. Predictions are shorter than MAX_PREDICTION_CHARS, so twice that stays cheap.
  if hasattr(sys, 'set_int_max_str_digits'):
    sys.set_int_max_str_digits(MAX_INTEGER_DIGITS)
  signal.signal(signal.SIGALRM, _raise_soft_timeout)
  import math_verify  # pylint: disable=import-outside-toplevel  # not installed: the parent raises WorkerStartError
  logging.getLogger('math_verify').setLevel(logging.ERROR)   # "timeout is disabled" is on purpose
  extraction_config = (math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig())
  # A gold is parsed once, for its check and for every prediction after it (math-verify does not mutate it).
  parse_gold = functools.lru_cache(maxsize=GOLD_CACHE_SIZE)(
      functools.partial(_parse_gold, math_verify, extraction_config))
  # Plain json.loads, not luckystar.files.loads: the parent writes these frames (a flat dict of strings,
  # numbers and bools; a prediction or gold is a JSON string, never nested or parsed as a number).
  return lambda frame: json.dumps(_answer(math_verify, extraction_config, parse_gold, json.loads(frame))).encode()
