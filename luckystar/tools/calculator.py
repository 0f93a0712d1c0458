"""Exact arithmetic for agent traces: the `calculator` tool math rollouts call.

The expression is untrusted model output. It is parsed, never executed: only number literals,
`+ - * /` (also written `×` `÷`), unary signs and parentheses are accepted, on text of at most
`MAX_CHARS` characters, and every intermediate value must stay under `MAX_DIGITS` digits, so an
evaluation is bounded in time and memory without a worker process. Arithmetic is over fractions,
so `247 / 3` stays exact; results print as math answers do (`82`, `247/3`).
"""

import ast
import dataclasses
from fractions import Fraction

MAX_CHARS = 200
MAX_DIGITS = 60
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
  """The exact value of an arithmetic expression, or the reason it has none."""
  if not isinstance(expression, str):
    return CalculatorResult(None, f'the expression must be a string, got {type(expression).__name__}')
  if len(expression) > MAX_CHARS:
    return CalculatorResult(None, f'the expression is longer than {MAX_CHARS} characters')
  text = expression.replace('×', '*').replace('÷', '/').replace(',', '')
  try:
    tree = ast.parse(text.strip(), mode='eval')
  except (SyntaxError, ValueError):
    return CalculatorResult(None, f'not an arithmetic expression: {expression!r}')
  try:
    return CalculatorResult(_value(tree.body))
  except ZeroDivisionError:
    return CalculatorResult(None, 'division by zero')
  except ValueError as e:
    return CalculatorResult(None, str(e))


def _value(node: ast.AST) -> Fraction:
  if isinstance(node, ast.Constant) and type(node.value) in (int, float):
    value = Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value)
  elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
    value = _value(node.operand)
    value = -value if isinstance(node.op, ast.USub) else value
  elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
    value = _OPERATORS[type(node.op)](_value(node.left), _value(node.right))
  else:
    raise ValueError(f'only numbers, + - * / and parentheses are allowed, got {ast.unparse(node)!r}')
  if max(abs(value.numerator), value.denominator) >= 10**MAX_DIGITS:
    raise ValueError(f'a value exceeds {MAX_DIGITS} digits')
  return value
