"""The calculator tool: exact values, and adversarial expressions refused with a reason."""

import pytest
from fractions import Fraction

import hypothesis
from hypothesis import strategies as st

from luckystar.data import math_problems
from luckystar.tools import calculator

pytestmark = pytest.mark.fast


def test_exact_arithmetic_and_the_answer_format():
  assert calculator.evaluate('12 × 15 + 7').value == 187
  assert calculator.evaluate('(71 + 85 + 91) / 3').value == Fraction(247, 3)
  assert calculator.evaluate('75 × (2 + 15 / 60)').value == Fraction(675, 4)
  assert calculator.evaluate('20000 - 20000 × 15 / 100').value == 17000
  assert calculator.evaluate('-(-3) + 1,000 ÷ 4').value == 253
  assert calculator.evaluate('0.5 * 3').value == Fraction(3, 2)
  assert [calculator.format_value(Fraction(v)) for v in (82, Fraction(247, 3), -4)] == ['82', '247/3', '-4']


def test_adversarial_expressions_are_refused_not_run():
  refused = {
      '__import__("os").system("echo pwned")': 'only numbers', 'open("/etc/passwd").read()': 'only numbers',
      '2 ** 10000000': 'only numbers', '9' * 61: 'exceeds 60 digits', '10' * 30 + ' * ' + '10' * 30: 'exceeds',
      '1 / 0': 'division by zero', '1 / (2 - 2)': 'division by zero', 'x + 1': 'only numbers',
      '[1, 2]': 'not an arithmetic', 'True + 1': 'only numbers', '1j': 'only numbers', '1e400': 'exceeds',
      'lambda: 1': 'only numbers', '1 if 1 else 2': 'only numbers', '': 'not an arithmetic',
      '(' * 150 + '1' + ')' * 150: 'longer than', '1 +': 'not an arithmetic', '5 // 2': 'only numbers',
  }
  for expression, reason in refused.items():
    result = calculator.evaluate(expression)
    assert not result.ok and result.value is None and reason in result.error, (expression, result)
  assert 'must be a string' in calculator.evaluate(['1 + 1']).error
  deep = '(' * 99 + '1' + ')' * 99   # under MAX_CHARS: parsed, bounded recursion
  assert calculator.evaluate(deep).value == 1


def test_literals_are_exact_as_written():
  assert calculator.evaluate('1.00000000000000001 - 1').value == Fraction(1, 10**17)
  assert calculator.evaluate('123456789.123456789 * 10').value == Fraction(123456789123456789, 10**8)
  assert calculator.evaluate('0.1 + 0.2').value == Fraction(3, 10)
  assert calculator.evaluate('.5 + 5. + 1_000.25 + 2.5e-3').value == Fraction(402301, 400)
  assert calculator.evaluate('5e-60').value == Fraction(1, 2 * 10**59)
  assert calculator.evaluate('0e999999999').value == 0
  for huge in ['1e60', '1e999999999', '1e-999999999', '-1.5e-300']:  # refused before 10**exponent is built
    assert 'exceeds 60 digits' in calculator.evaluate(huge).error, huge


def test_commas_only_separate_thousands():
  separated = {'1,000 + 1': 1001, '1,000,000 - 1': 999999, '12,345.5 * 2': 24691, '-(2,000)': -2000, '999': 999}
  for expression, value in separated.items():
    assert calculator.evaluate(expression).value == value, expression
  for expression in ['2,5 * 2', '(1,2)', '1, 2', '1,0000', '12345,678', '0.123,456', '1,000,00', '1,000e3', ',5',
                     '1,000_000', '(1,000, 2,000)', '5,']:
    result = calculator.evaluate(expression)
    assert not result.ok and 'not an arithmetic expression' in result.error, (expression, result)


@hypothesis.given(st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=6),
                  st.lists(st.sampled_from('+-*/'), min_size=5, max_size=5))
def test_agrees_with_exact_fractions(numbers, operators):
  expression = str(numbers[0])
  for number, operator in zip(numbers[1:], operators):
    expression += f' {operator} ({number})'
  try:
    expected = eval(expression.replace('(', 'Fraction('), {'Fraction': Fraction})  # noqa: S307  (our own text)
  except ZeroDivisionError:
    assert calculator.evaluate(expression).error == 'division by zero'
    return
  assert calculator.evaluate(expression).value == expected


def test_every_math_trace_computes_its_gold_answer():
  for example in math_problems.suite(seed=1, per_template=40):
    expression = example.meta['expression']
    assert expression in example.thinking and expression in example.thinking_ko, example.id
    assert calculator.format_value(calculator.evaluate(expression).value) == example.answer, example.id
