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


# Scientific notation is its value (issue 54): math-verify alone reads `2e3` as 2, so `2e3` scored correct
# against the gold 2. Written out, it equals 2000 and only that; an exponent past MAX_SCIENTIFIC_EXPONENT
# scores False (its digits would be a bomb), and a gold in this notation is read the same way.
@pytest.mark.parametrize('prediction, gold, expected', [
    ('2e3', '2', False),
    ('2E3', '2', False),
    ('2.0e3', '2', False),
    ('2e+3', '2', False),
    ('1e-3', '1', False),
    ('1.5e2', '1.5', False),
    ('The answer is 2e3.', '2', False),
    ('정답은 2e3입니다.', '2', False),
    ('\\boxed{2e3}', '2', False),
    ('1e999', '1', False),
    ('1,000e3', '1000', False),
    ('2e3', '2000', True),
    ('2E3', '2000', True),
    ('2.0e3', '2000', True),
    ('2e+3', '2000', True),
    ('-2e3', '-2000', True),
    ('1e-3', '0.001', True),
    ('2e−3', '\\frac{2}{1000}', True),   # a Unicode minus in the exponent
    ('1.5e2', '150', True),
    ('1,000e3', '1000000', True),
    ('The answer is 2e3.', '2000', True),
    ('정답은 2e3입니다.', '2000', True),
    ('\\boxed{2e3}', '2000', True),
    ('$2e3$', '2000', True),
    ('2e3', '2\\times10^{3}', True),
    ('1e999', '10^{999}', True),
    ('1e1001', '10^{1001}', False),        # past MAX_SCIENTIFIC_EXPONENT: never expanded, never rewarded
    ('1e1001', '1', False),
    ('2000', '2e3', True),                 # a gold in the notation is its value too
    ('2', '2e3', False),
    ('not 2e3 but 7', '7', True),          # a rejected value in the notation is struck out whole
    ('7, not 2e3', '2000', False),
])
def test_scientific_notation_is_its_value(verifier, prediction, gold, expected):
  assert verifier.score(prediction, gold, timeout_s=VERDICT_TIMEOUT_S) is expected


@pytest.mark.parametrize('prediction, gold, expected', [
    ('1,000', '1000', True),     # a comma before three digits groups thousands (as in Korean and English)
    ('1 000', '1000', True),
    ('1.000', '1000', False),    # a period is always a decimal point: 1.000 is one, not a European thousand
    ('1.000', '1', True),
    ('1,000', '1.000', False),
    ('1,000,000', '1e6', True),
])
def test_digit_grouping_keeps_its_documented_reading(verifier, prediction, gold, expected):
  assert verifier.score(prediction, gold, timeout_s=VERDICT_TIMEOUT_S) is expected


@pytest.mark.parametrize('prediction, gold, expected', [
    ('NaN', 'NaN', None),          # a word, so prose: the judge decides, a verifier never says True
    ('5', 'nan', None),
    ('nan', '5', False),
    ('NaN', '0', False),
    ('inf', '5', False),
    ('Infinity', '5', False),
    ('1e400', '\\infty', False),   # a large number, never a float overflowing to inf
    ('$\\infty$', '1e400', False),
    ('$\\infty$', '\\infty', True),
    ('5', '\\infty', False),
    ('$\\frac{0}{0}$', '5', False),
    ('5', '\\frac{0}{0}', False),
])
def test_non_finite_replies_and_golds(verifier, prediction, gold, expected):
  assert verifier.score(prediction, gold, timeout_s=VERDICT_TIMEOUT_S) is expected


def test_a_gold_of_5001_digits(verifier):
  gold = '1' * 5001   # past Python's 4,300-digit int conversion limit
  assert verifier.score(gold, gold, timeout_s=VERDICT_TIMEOUT_S) is True
  for wrong in ('1' * 5000 + '2', '1' * 5000, '5', '1e5000', '\\boxed{' + '1' * 5000 + '2}'):
    assert verifier.score(wrong, gold, timeout_s=VERDICT_TIMEOUT_S) is False, wrong[-20:]
  assert verifier.score(gold, '1', timeout_s=VERDICT_TIMEOUT_S) is False


# A notation after the leading number changes its value (issue 54's family): math-verify alone reads the leading
# number of `2\\times10^{3}`, `2e`, `3만` or `10!`, so each scored correct against that number. Each now reads as
# its value, or, where it is ambiguous, as no plain number at all.
@pytest.mark.parametrize('prediction, gold, expected', [
    # Times ten to a power, in every spelling: its value, never the mantissa.
    ('2\\times10^{3}', '2', False),
    ('2\\times10^{3}', '2000', True),
    ('2 \\times 10^3', '2', False),
    ('2 \\times 10^3', '2000', True),
    ('2·10^3', '2', False),
    ('2·10^3', '2000', True),
    ('2*10^3', '2', False),
    ('2*10^3', '2000', True),
    ('2×10³', '2', False),
    ('2×10³', '2000', True),
    ('2 x 10^3', '2000', True),
    ('2.5 \\cdot 10^{-3}', '0.0025', True),
    ('The answer is 2\\times10^{3}.', '2', False),
    ('정답은 2×10^3입니다.', '2000', True),
    ('1/2\\times10^3', '1/2000', False),     # (1/2)·10³ = 500, not 1/2000
    ('1/2\\times10^3', '500', True),
    ('1\\times10^{1001}', '1', False),       # past MAX_SCIENTIFIC_EXPONENT: never the mantissa
    # Euler's number and malformed scientific notation.
    ('2e', '2', False),
    ('2e', '2e', True),
    ('The answer is 2e.', '2', False),
    ('2e3.5', '2', False),
    ('2e3.5', '2000', False),
    ('2E3.5', '2', False),
    # Bare LaTeX after a number is LaTeX, not its leading number.
    ('2\\pi', '2', False),
    ('2\\pi', '2\\pi', True),
    ('2 \\pi', '2', False),
    ('2π', '2', False),
    ('2π', '2\\pi', True),
    ('2 pi', '2', False),
    ('2\\sqrt{3}', '2', False),
    ('2√3', '2', False),
    ('2√3', '2\\sqrt{3}', True),
    ('2 \\times 3', '3', False),
    ('2 \\times 3', '6', True),
    ('2^{10}', '2', False),
    ('2^{10}', '1024', True),
    ('3²', '3', False),
    ('3²', '9', True),
    ('10!', '10', False),
    ('10!', '3628800', True),
    ('The answer is 10!', '10', False),
    ('2i', '2', False),
    ('1½', '1', False),
    ('1½', '3/2', True),
    ('½', '1/2', True),
    # A magnitude after the number: its value, or (a glued k, M, B) no plain number at all.
    ('3 thousand', '3', False),
    ('3 thousand', '3000', True),
    ('1.5 million', '1500000', True),
    ('3 hundred thousand', '300000', True),
    ('3 dozen', '3', False),
    ('3k', '3', False),
    ('3.5k', '3.5', False),
    ('3M', '3', False),
    ('2B', '2', False),
    ('0x1F', '0', False),
    ('0x1F', '31', True),
    ('1_000', '1', False),
    ('1_000', '1000', True),
    # Korean magnitudes (만 10⁴, 억 10⁸, 조 10¹², with 천, 백, 십) are their value, currency after them or not.
    ('정답은 3만입니다.', '3', False),
    ('정답은 3만입니다.', '30000', True),
    ('3만 5천', '3', False),
    ('3만 5천', '35000', True),
    ('3만5천', '35000', True),
    ('1억', '1', False),
    ('1억', '100000000', True),
    ('2천', '2', False),
    ('2천', '2000', True),
    ('3백만', '3000000', True),
    ('1억 2345만 6789', '123456789', True),
    ('3.5만', '35000', True),
    ('3,000만 원', '30000000', True),
    ('정답은 3만 원입니다.', '3', False),
    ('정답은 3만 원입니다.', '30000', True),
    ('30,000원', '30000', True),
    ('30,000원', '30', False),
    ('정답은 5만큼 큽니다. 답: 5', '5', True),   # 만큼 is 'as much as', not 10⁴
    # Units and words that keep the value still score as the number.
    ('5cm', '5', True),
    ('90°', '90', True),
    ('3%', '3', True),      # a percentage is its number and its fraction, as math-verify has it (documented)
    ('3%', '0.03', True),
    ('The answer is 7 apples.', '7', True),
    ('$2\\pi$', '2\\pi', True),
])
def test_a_notation_after_the_number_is_part_of_its_value(verifier, prediction, gold, expected):
  assert verifier.score(prediction, gold, timeout_s=VERDICT_TIMEOUT_S) is expected


# A comma between digits that is no thousands grouping (`1,5`) is read as a bare gold's is: it separates values.
# So the ambiguous `1,5` is the pair {1, 5}: never the European 1.5, never 15, never its last number 5.
@pytest.mark.parametrize('prediction, gold, expected', [
    ('1,5', '1.5', False),
    ('1,5', '15', False),
    ('1,5', '5', False),
    ('1,50', '1.5', False),
    ('x=1,5', '1.5', False),
    ('The answer is 1,5.', '1.5', False),
    ('1,5', '1,5', True),
    ('1,234', '1234', True),
    ('1,234.5', '1234.5', True),
])
def test_a_comma_that_groups_no_thousands_separates_values(verifier, prediction, gold, expected):
  assert verifier.score(prediction, gold, timeout_s=VERDICT_TIMEOUT_S) is expected


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
