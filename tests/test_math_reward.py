"""The math verifier scores equivalent answers and survives whatever a policy writes."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import hypothesis
import hypothesis.strategies as st
import pytest

from luckystar.rewards import math as math_reward

pytestmark = pytest.mark.fast

TIMEOUT_S = 1.0
CALL_BOUND_S = TIMEOUT_S + 2.0   # the promise: a call returns within timeout_s + 2 s, restart included
# Equivalence cases test the verdict, not the limit: on 2 cores busy with another test file (pytest-xdist)
# a 1 s sandbox call has timed out (None) on a case that takes milliseconds alone.
VERDICT_TIMEOUT_S = 10.0


@pytest.fixture(scope='module')
def verifier():
  with math_reward.MathVerifier() as shared:
    assert shared.score('1', '1', timeout_s=30.0) is True   # pay the first start outside the bounds
    yield shared


@pytest.mark.parametrize('prediction, gold, expected', [
    ('\\boxed{0.5}', '\\frac{1}{2}', True),
    ('The answer is \\boxed{\\frac{1}{2}}', '0.5', True),
    ('0.25', '1/4', True),
    ('$\\frac{3}{4}$', '0.75', True),
    ('1,234', '1234', True),
    ('1234', '1,234', True),
    ('1,000,000', '1000000', True),
    ('x = 3', '3', True),
    ('3', 'x=3', True),
    ('정답은 42입니다.', '42', True),
    ('정답은 5입니다. 검산: 5+1=6', '5', True),   # the Korean marker anchors the answer, not the last number
    ('The answer is 7.', '7', True),
    ('The answer is \\boxed{5}. Check: 5+1=6', '5', True),
    ('-5', '-5', True),
    ('정답은 -3입니다', '-3', True),
    ('정답은 327/4입니다.', '327/4', True),      # a fraction glued to Korean is the whole fraction
    ('The answer is 404/5.', '404/5', True),    # the sentence's period is not a decimal point
    ('The answer is 3.5.', '7/2', True),
    ('정답은 80.8입니다.', '404/5', True),
    ('정답은 327입니다.', '327/4', False),
    ('The answer is 404/5.', '404/6', False),
    ('50%', '0.5', True),
    ('50\\%', '50\\%', True),
    ('$\\frac{\\sqrt{2}}{2}$', '\\frac{\\sqrt{2}}{2}', True),
    ('$2\\pi$', '2\\pi', True),   # bare gold is read as LaTeX, not as "2"
    ('$\\int_0^1 x\\,dx$', '\\frac{1}{2}', True),
    ('The answer is -5', '5', False),
    ('8', '7', False),
    ('The answer is 3/4', '0.7', False),
    ('정답은 41입니다.', '42', False),
    ('2', '2\\pi', False),
    ('', '5', False),
    ('모르겠습니다.', '5', False),
])
def test_equivalence(verifier, prediction, gold, expected):
  assert verifier.score(prediction, gold, timeout_s=VERDICT_TIMEOUT_S) is expected


@pytest.mark.parametrize('prediction, gold, expected', [
    # A check after the answer is not the answer, spaced or not, in either language.
    ('정답은 13입니다. 검산: 10 + 4 = 14', '14', False),
    ('정답은 13입니다. 검산: 10 + 4 = 14', '13', True),
    ('정답은 5입니다. 검산: 5 + 1 = 6', '5', True),
    ('정답은 5입니다. 검산: 5 + 1 = 6', '6', False),
    ('The answer is 13. Check: 10 + 4 = 14', '14', False),
    ('The answer is 13. Check: 10 + 4 = 14', '13', True),
    ('Answer: 14. Check: 14 + 3 = 17.', '17', False),
    ('Answer: 14. Check: 14 + 3 = 17.', '14', True),
    ('**Answer**: 5. Check: 5 + 1 = 6', '5', True),
    ('The answer is x = 3. Check: 3 + 1 = 4', '3', True),
    ('The answer is x = 3. Check: 3 + 1 = 4', '4', False),
    ('The answer is 1,234. Check: 1,000 + 200 = 1,200', '1234', True),
    # A decimal point, a period inside math and a newline inside braces do not end the answer's sentence.
    ('The answer is 3.5. Check: 3.5 * 2 = 7', '7/2', True),
    ('The answer is $(1, 2)$. Check: 1 + 2 = 3', '(1,2)', True),
    ('The answer is \\boxed{\\begin{pmatrix} 1 \\\\\n 2 \\end{pmatrix}}.', '\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}',
     True),
    # The answer may start on the next line; a marker that introduces none is passed over; the last one wins.
    ('The answer is:\n\\[\n\\boxed{5}\n\\]\nCheck: 5 + 1 = 6', '5', True),
    ('The answer is as follows:\n\\boxed{5}', '5', True),
    ('정답은 5입니다. 검산: 5 + 1 = 6, so the answer is correct.', '5', True),
    ('The answer is 7. The answer is 8.', '7', False),
    ('The answer is 7. The answer is 8.', '8', True),
])
def test_answer_marker_scores_only_the_sentence_it_introduces(verifier, prediction, gold, expected):
  assert verifier.score(prediction, gold, timeout_s=VERDICT_TIMEOUT_S) is expected


def test_many_answer_markers_do_not_time_out(verifier):
  timeouts = verifier.stats['timeout']
  assert verifier.score('answer: x ' * 999, '7', timeout_s=TIMEOUT_S) is False   # not a parse per marker
  assert verifier.stats['timeout'] == timeouts


@pytest.mark.parametrize('prediction, gold', [
    ('\\boxed{3}', 'The limit exists and is equal to 3'),
    ('\\boxed{4}', 'The limit exists and is equal to 3'),
    ('\\boxed{98}', '98 values'),
    ('\\boxed{Yes}', 'Yes'),
    ('\\boxed{\\frac{\\sqrt{3}}{3}}', 'sqrt(3)/3, or equivalently 1/sqrt(3)'),
    ('\\boxed{1}', 'sqrt(3)/3, or equivalently 1/sqrt(3)'),
    ('\\boxed{x(n)<y(n-1)}', 'x(n)<y(n-1) for all n≥3'),
])
def test_prose_gold_is_unscorable(verifier, prediction, gold):
  before = verifier.stats['gold_unparsable']
  assert verifier.score(prediction, gold, timeout_s=VERDICT_TIMEOUT_S) is None   # for the judge, not a verdict
  assert verifier.stats['gold_unparsable'] == before + 1


@pytest.mark.parametrize('prediction, gold, expected', [
    ('\\boxed{\\sqrt{2}}', 'sqrt(2)', True),        # function names are not prose
    ('\\boxed{2}', 'sqrt(2)', False),
    ('\\boxed{1, 3}', '1 and 3', True),             # nor are the connectors math-verify reads as commas
    ('\\boxed{1, 4}', '1 and 3', False),
    ('\\boxed{5}', '5\\text{ dollars}', True),      # nor \text groups and environment names
    ('\\boxed{6}', '5\\text{ dollars}', False),
    ('$\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}$', '\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}', True),
    ('$\\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}$', '\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}', False),
])
def test_gold_with_math_words_stays_scorable(verifier, prediction, gold, expected):
  assert verifier.score(prediction, gold, timeout_s=VERDICT_TIMEOUT_S) is expected


@pytest.mark.parametrize('prediction, gold, expected', [
    ('\\boxed{18.90}', '\\$18.90', True),
    ('\\boxed{\\$18.90}', '\\$18.90', True),
    ('The answer is 18.90', '\\$18.90', True),
    ('\\boxed{18.80}', '\\$18.90', False),
    ('\\boxed{32,348}', '\\$32,348', True),
    ('\\boxed{32,349}', '\\$32,348', False),
    ('The answer is 12.', '\\$12', True),
    ('The answer is 13.', '\\$12', False),
])
def test_escaped_dollar_in_gold_is_a_dollar_sign(verifier, prediction, gold, expected):
  assert verifier.score(prediction, gold, timeout_s=VERDICT_TIMEOUT_S) is expected


@pytest.mark.parametrize('gold', ['', '   ', '\\frac{', '\\boxed{}', '$$'])
def test_unparsable_gold_is_none_not_false(verifier, gold):
  before = verifier.stats['gold_unparsable']
  assert verifier.score('5', gold, timeout_s=TIMEOUT_S) is None
  assert verifier.stats['gold_unparsable'] == before + 1


def _adversarial_predictions(pwned_path):
  touch = f"__import__('os').system('touch {pwned_path}')"
  return {
      'power tower': '9**9**9**9',
      'latex power tower': '$9^{9^{9^{9}}}$',
      'latex 2 tower': '$2^{2^{2^{2^{2^{2}}}}}$',
      'nested parens 10000': '(' * 10_000 + '1' + ')' * 10_000,
      'nested parens in latex': '$' + '(' * 4_000 + '1' + ')' * 4_000 + '$',
      'nested frac': '$' + '\\frac{' * 700 + '1' + '}{2}' * 700 + '$',
      'nested sqrt': '$' + '\\sqrt{' * 2_000 + '2' + '}' * 2_000 + '$',
      'import os': touch,
      'import os in latex': f'${touch}$',
      'import os boxed': f'\\boxed{{{touch}}}',
      'division by zero': '\\frac{1}{0}',
      'factorial': '100000!',
      'latex factorial': '$100000!$',
      'factorial of a 4000-digit number': '$' + '9' * 4_000 + '!$',
      'huge float': '1e999999999',
      'latex huge float': '$1e999999999$',
      '1 MB string': 'a' * (1 << 20),
      'long digit string': '9' * 9_999,
      'unbalanced boxed': '\\boxed{',
      'nested unbalanced boxed': '\\boxed{\\boxed{\\boxed{',
      'integral': '$\\int_0^\\infty e^{x^{x^x}}\\,dx$',
      'huge sum': '$\\sum_{i=1}^{10^{100}} i$',
      'nul and surrogates': '5\x00\ud800\udfff\x00',
      'lambda': '(lambda: 5)()',
      'eval': "eval('2+3')",
      'exec': "exec('import os; os.system(\"true\")')",
      'dunder escape': "().__class__.__bases__[0].__subclasses__()",
      'empty assignment': 'x = ',
  }


ADVERSARIAL_NAMES = list(_adversarial_predictions('/unused'))


@pytest.mark.parametrize('name', ADVERSARIAL_NAMES)
def test_adversarial_prediction_is_bounded_and_never_rewarded(verifier, tmp_path, name):
  pwned_path = tmp_path / 'pwned'
  prediction = _adversarial_predictions(pwned_path)[name]
  started = time.monotonic()
  score = verifier.score(prediction, '7', timeout_s=TIMEOUT_S)
  elapsed = time.monotonic() - started
  assert score is not True, f'{name} scored as correct'   # False, or None when it could not be scored
  assert score in (False, None)
  assert elapsed < CALL_BOUND_S, f'{name} took {elapsed:.2f} s'
  assert not pwned_path.exists(), f'{name} ran code'
  # The worker (restarted if it had to be) still scores normal answers.
  assert verifier.score('The answer is \\boxed{7}.', '7', timeout_s=CALL_BOUND_S) is True


BOMB_TIMEOUT_S = 0.15   # every bomb below hangs sympy for seconds
_FAILURES = ('timeout', 'crash', 'worker_error')


# Bare LaTeX golds read as something else when parsed as a prediction (a bare '3\pi' reads as 3), so the
# verdict must not rest on scoring the gold as a prediction. The wrong answer comes first, as in an RL group:
# its generous timeout lets the gold's check pass on a busy machine.
@pytest.mark.parametrize('gold, correct, bomb', [
    pytest.param('3\\pi', '$3\\pi$', '$9^{9^{9^{9}}}$', id='pi-latex tower'),
    pytest.param('\\sqrt{5}', '$\\sqrt{5}$', '9**9**9**9', id='sqrt-power tower'),
    pytest.param('\\dfrac{5}{7}', '$\\frac{5}{7}$', '\\boxed{9^{9^{9^{9}}}}', id='dfrac-boxed tower'),
    pytest.param('[0, 2)', '$[0, 2)$', '$8^{8^{8^{8}}}$', id='interval-8 tower'),
    pytest.param('y=4', 'y = 4', '$' + '{' * 3_000 + '1' + '}' * 3_000 + '$', id='assignment-nested braces'),
    pytest.param('35\\%', '35%', '정답은 $7^{7^{7^{7}}}$입니다.', id='percent-korean tower'),
    pytest.param('$\\frac{2}{9}$', '$\\frac{2}{9}$', 'The answer is $2^{2^{2^{2^{2^{2}}}}}$.', id='dollars-2 tower'),
    pytest.param('\\boxed{\\frac{4}{11}}', '$\\frac{4}{11}$', '$' + '(' * 3_000 + '1' + ')' * 3_000 + '$',
                 id='boxed-nested parens'),
])
def test_a_verifier_bomb_scores_as_wrong_for_every_gold_form(verifier, gold, correct, bomb):
  assert verifier.score('The answer is 987654321.', gold, timeout_s=VERDICT_TIMEOUT_S) is False
  failures = sum(verifier.stats[key] for key in _FAILURES)
  assert verifier.score(bomb, gold, timeout_s=BOMB_TIMEOUT_S) is False   # not None: no escape from the penalty
  assert sum(verifier.stats[key] for key in _FAILURES) == failures + 1   # counted as what it was
  assert verifier.score(correct, gold, timeout_s=VERDICT_TIMEOUT_S) is True


@pytest.mark.parametrize('hang', ['interrupted', 'killed'])
def test_a_bomb_as_the_first_prediction_for_a_gold_scores_as_wrong(verifier, monkeypatch, hang):
  if hang == 'killed':
    _hang_until_killed(monkeypatch)
  gold = {'interrupted': '5\\pi', 'killed': '\\sqrt{7}'}[hang]   # spelt only here: not checked yet
  assert verifier.score('9**9**9**9', gold, timeout_s=TIMEOUT_S) is False   # the gold is checked first
  assert (verifier.worker_pid is None) == (hang == 'killed')
  assert verifier.score(f'${gold}$', gold, timeout_s=VERDICT_TIMEOUT_S) is True


def test_none_only_when_the_gold_cannot_be_scored(verifier):
  unparsable = verifier.stats['gold_unparsable']
  for gold in ('\\frac{', '98 values'):   # does not parse; prose, for the judge
    assert verifier.score('9**9**9**9', gold, timeout_s=BOMB_TIMEOUT_S) is None   # the bomb never reaches sympy
    assert verifier.score('The answer is 987654321.', gold, timeout_s=VERDICT_TIMEOUT_S) is None
  assert verifier.stats['gold_unparsable'] == unparsable + 4


def test_a_gold_whose_own_check_times_out_is_unscorable(verifier):
  failed = verifier.stats['gold_check_failed']
  slow_gold = '{' * 3_000 + '1' + '}' * 3_000   # trusted data, but no gold is this slow to parse
  assert verifier.score('1', slow_gold, timeout_s=0.2) is None
  assert verifier.stats['gold_check_failed'] == failed + 1


@pytest.mark.parametrize('prediction', [
    # Korean: negated, called wrong, taken back.
    '정답은 5가 아니라 7입니다.',
    '정답은 5이 아니고 7입니다.',
    '5는 틀렸고 정답은 7입니다.',
    '답은 5가 아닌 7',
    '5는 정답이 아니고 7이 정답입니다.',
    '정답은 5, 아니 7입니다.',
    '5개가 아니라 7개입니다.',
    '정답은 $5$가 아니라 $7$입니다.',
    # English.
    'The answer is not 5 but 7.',
    '5, no wait, 7',
    'The answer is not 5; it is 7.',
    'The answer is 7, not 5.',
    '7, not 5',
    '7 is correct, 5 is wrong.',
    "The answer is 5, no wait, it's 7.",
    'The answer is \\boxed{7}, not \\boxed{5}.',
    'It is 7 rather than 5.',
])
def test_a_rejected_value_is_not_the_answer(verifier, prediction):
  assert verifier.score(prediction, '7', timeout_s=VERDICT_TIMEOUT_S) is True
  assert verifier.score(prediction, '5', timeout_s=VERDICT_TIMEOUT_S) is False


@pytest.mark.parametrize('prediction, gold', [
    ('정답은 12입니다. 틀린 풀이의 5는 무시합니다.', '12'),   # a later sentence's '틀린' rejects nothing before it
    ('5는 틀리지 않았습니다.', '5'),                           # 'not wrong'
    ('정답은 5 아닌가요?', '5'),                               # 'isn't it 5?' asserts 5
    ('x is not 0, so the answer is 7.', '7'),
    ('The answer is 7. It is not 8.', '7'),
    ('The answer is 3/4, not 0.7.', '3/4'),
    ('The number is not 10 which is 1,000.99', '1000.99'),
])
def test_a_value_that_is_not_rejected_still_counts(verifier, prediction, gold):
  assert verifier.score(prediction, gold, timeout_s=VERDICT_TIMEOUT_S) is True


def test_overlong_prediction_is_false_without_a_worker_round_trip(verifier):
  before = dict(verifier.stats)
  assert verifier.score('7 ' * math_reward.MAX_PREDICTION_CHARS, '7') is False
  assert verifier.stats['overlong'] == before.get('overlong', 0) + 1
  assert verifier.stats['worker_starts'] == before['worker_starts']


def test_slow_sympy_interrupts_itself_and_keeps_the_worker(verifier):
  verifier.score('1', '1')
  pid, timeouts = verifier.worker_pid, verifier.stats['timeout']
  assert verifier.score('9**9**9**9', '5', timeout_s=TIMEOUT_S) is False   # the gold parses: as wrong as wrong
  assert verifier.stats['timeout'] == timeouts + 1
  assert verifier.worker_pid == pid
  assert verifier.score('x = 3', '3') is True


def _hang_until_killed(monkeypatch):
  """Pushes the worker's own SIGALRM past the parent's deadline, as a hang inside C code would."""
  monkeypatch.setattr(math_reward, 'SOFT_TIMEOUT_FRACTION', 100.0)


def test_timeout_kills_worker_and_next_call_restarts_it(verifier, monkeypatch):
  _hang_until_killed(monkeypatch)
  verifier.score('1', '1')
  first_pid = verifier.worker_pid
  timeouts = verifier.stats['timeout']
  assert verifier.score('9**9**9**9', '5', timeout_s=TIMEOUT_S) is False
  assert verifier.stats['timeout'] == timeouts + 1
  assert verifier.worker_pid is None
  with pytest.raises(ProcessLookupError):
    os.kill(first_pid, 0)   # killed and reaped, not left running
  assert verifier.score('x = 3', '3') is True
  assert verifier.worker_pid not in (None, first_pid)


def test_worker_crash_mid_call_scores_false_and_restarts(verifier):
  verifier.score('1', '1')
  pid = verifier.worker_pid
  crashes = verifier.stats['crash']
  # Kill the worker while it grinds on a hang; the long timeout shows the crash, not a clock, ends it.
  killer = threading.Timer(0.3, os.kill, (pid, signal.SIGKILL))
  killer.start()
  try:
    assert verifier.score('9**9**9**9', '5', timeout_s=60.0) is False
  finally:
    killer.cancel()
  assert verifier.stats['crash'] == crashes + 1
  assert verifier.score('\\boxed{0.5}', '\\frac{1}{2}') is True


def test_worker_that_died_while_idle_is_replaced_silently(verifier):
  verifier.score('1', '1')
  pid = verifier.worker_pid
  os.kill(pid, signal.SIGKILL)
  assert _wait_until_gone(pid, timeout_s=10.0)
  crashes = verifier.stats['crash']
  assert verifier.score('42', '42') is True   # not None: the death was not this prediction's doing
  assert verifier.stats['crash'] == crashes


def test_batch_reuses_one_worker_and_survives_a_hang(verifier, monkeypatch):
  _hang_until_killed(monkeypatch)
  verifier.score('1', '1')
  starts = verifier.stats['worker_starts']
  scores = verifier.score_all([('\\boxed{0.5}', '\\frac{1}{2}'), ('7', '8'), ('정답은 3입니다', '3'),
                               ('9**9**9**9', '5'), ('1,234', '1234')], timeout_s=TIMEOUT_S)
  assert scores == [True, False, True, False, True]
  assert verifier.stats['worker_starts'] == starts + 1   # one restart, after the hang only


def test_module_level_api_and_close():
  try:
    assert math_reward.is_correct('The answer is 7.', '7', timeout_s=30.0) is True
    assert math_reward.are_correct([('x = 3', '3'), ('4', '3'), ('5', '')]) == [True, False, None]
    pid = math_reward._shared_verifier().worker_pid
    assert pid is not None
  finally:
    math_reward.close()
  assert math_reward._shared_verifier().worker_pid is None
  with pytest.raises(ProcessLookupError):
    os.kill(pid, 0)


def test_bad_arguments_speak_to_the_caller(verifier):
  with pytest.raises(TypeError, match="pass ''"):
    verifier.score(None, '5')
  with pytest.raises(TypeError, match='pairs\\[1\\]'):
    verifier.score_all([('1', '1'), ('1', 1)])
  with pytest.raises(ValueError, match='timeout_s'):
    verifier.score('1', '1', timeout_s=0)


def _wait_until_gone(pid, timeout_s):
  """True once pid has exited (zombie or reaped), waiting on a pidfd rather than polling."""
  try:
    pidfd = os.pidfd_open(pid)
  except ProcessLookupError:
    return True
  try:
    return bool(select.select([pidfd], [], [], timeout_s)[0])
  finally:
    os.close(pidfd)


@pytest.mark.parametrize('ending', ['exit', 'sigkill'])
def test_no_orphan_worker_when_the_trainer_ends(ending):
  # Load the module by path so the child skips `import luckystar` (jax) and starts fast.
  script = textwrap.dedent(f'''
      import importlib.util, os, signal
      spec = importlib.util.spec_from_file_location('math_reward', {math_reward.__file__!r})
      math_reward = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(math_reward)
      verifier = math_reward.MathVerifier()
      assert verifier.score('1', '1', timeout_s=30.0) is True
      print(verifier.worker_pid, flush=True)
      if {ending!r} == 'sigkill':
        os.kill(os.getpid(), signal.SIGKILL)   # no atexit: the kernel's parent-death signal must act
  ''')
  child = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=60)
  assert child.stdout.strip(), child.stderr
  worker_pid = int(child.stdout.split()[0])
  assert _wait_until_gone(worker_pid, timeout_s=10.0), f'worker {worker_pid} outlived its parent'


def test_worker_that_cannot_start_is_an_error_not_a_stream_of_nones():
  verifier = math_reward.MathVerifier(memory_limit_bytes=16 << 20)   # too little to import sympy
  with pytest.raises(math_reward.WorkerStartError, match='math-verify worker'):
    verifier.score('1', '1')
  assert verifier.worker_pid is None


_MATHY_CHARACTERS = st.sampled_from(list('0123456789+-*/^()!.,=x $\\{}_eE%정답은'))


@hypothesis.settings(max_examples=25, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(prediction=st.text(alphabet=_MATHY_CHARACTERS | st.characters(), max_size=60))
def test_any_text_scores_bool_or_none_within_the_bound(verifier, prediction):
  started = time.monotonic()
  assert verifier.score(prediction, '7', timeout_s=TIMEOUT_S) in (True, False, None)
  assert time.monotonic() - started < CALL_BOUND_S
