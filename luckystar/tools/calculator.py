"""Exact arithmetic for agent traces: the `calculator` tool math rollouts call.

The expression is untrusted model output. It is parsed, never executed: only number literals,
`+ - * /` (also written `×` `÷`), unary signs and parentheses are accepted, on text of at most
`MAX_CHARS` characters, and every intermediate value must stay under `MAX_DIGITS` digits, so an
evaluation is bounded in time and memory without a worker process. Arithmetic is over fractions,
so `247 / 3` stays exact; results print as math answers do (`82`, `247/3`).

A literal means exactly what it says: `0.1` is 1/10 and `1.00000000000000001` is not 1 (never
rounded through a float). A comma is accepted only as a thousands separator (`1,000`, `12,345.5`);
any other comma (`2,5`, `(1, 2)`) makes the expression not arithmetic, rather than silently
gluing the digits into another number.
"""

import ast
import dataclasses
import decimal
from fractions import Fraction
import re

MAX_CHARS = 200
MAX_DIGITS = 60
# Digit groups of three after a comma; no digit, dot, letter or comma touching either end, so
# `12345,678`, `0.123,456` and `1,0000` are not read as separated thousands.
_THOUSANDS = re.compile(r'(?<![\w.,])\d{1,3}(?:,\d{3})+(?![\w,])')
_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
              ast.Div: lambda a, b: a / b}


@dataclasses.dataclass(frozen=True)
class CalculatorResult:
  value: Fraction | None
  error: str | None = None

  @property
  def ok(self) -> bool:
    return self.error is None


def format_value(value: Fraction) -> str:
  """Integers plainly, other rationals as reduced fractions: the form math answers take."""
  return str(value.numerator) if value.denominator == 1 else f'{value.numerator}/{value.denominator}'


def evaluate(expression: object) -> CalculatorResult:
  """The exact value of an arithmetic expression, or the reason it has none (module docstring)."""
  if not isinstance(expression, str):
    return CalculatorResult(None, f'the expression must be a string, got {type(expression).__name__}')
  if len(expression) > MAX_CHARS:
    return CalculatorResult(None, f'the expression is longer than {MAX_CHARS} characters')
  text = expression.replace('×', '*').replace('÷', '/')
  text = _THOUSANDS.sub(lambda match: match.group().replace(',', ''), text).strip()
  try:
    tree = None if ',' in text else ast.parse(text, mode='eval')  # a comma left separates no thousands
  except (SyntaxError, ValueError):
    tree = None
  if tree is None:
    return CalculatorResult(None, f'not an arithmetic expression: {expression!r}')
  try:
    return CalculatorResult(_value(tree.body, text))
  except ZeroDivisionError:
    return CalculatorResult(None, 'division by zero')
  except ValueError as e:
    return CalculatorResult(None, str(e))


def _value(node: ast.AST, source: str) -> Fraction:
  """The exact value of a parsed node; source is the text it was parsed from (literals are read from it)."""
  if isinstance(node, ast.Constant) and type(node.value) is int:
    value = Fraction(node.value)
  elif isinstance(node, ast.Constant) and type(node.value) is float:
    value = _decimal_literal(ast.get_source_segment(source, node))
  elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
    value = _value(node.operand, source)
    value = -value if isinstance(node.op, ast.USub) else value
  elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
    value = _OPERATORS[type(node.op)](_value(node.left, source), _value(node.right, source))
  else:
    raise ValueError(f'only numbers, + - * / and parentheses are allowed, got {ast.unparse(node)!r}')
  if max(abs(value.numerator), value.denominator) >= 10**MAX_DIGITS:
    raise ValueError(f'a value exceeds {MAX_DIGITS} digits')
  return value


def _decimal_literal(text: str) -> Fraction:
  """The exact value of a float literal's text ('1.5', '.5', '1e-3', '1_000.5'), not of its nearest float.

  Decimal reads any exponent cheaply, but the Fraction costs 10**|exponent|; a nonzero literal with an
  exponent beyond MAX_CHARS + MAX_DIGITS (its digits cannot bring it back under MAX_DIGITS) is refused first.
  """
  literal = decimal.Decimal(text)
  if literal and abs(literal.as_tuple().exponent) > MAX_CHARS + MAX_DIGITS:
    raise ValueError(f'a value exceeds {MAX_DIGITS} digits')
  return Fraction(literal)
