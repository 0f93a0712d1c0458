"""Tool calls in an action section, parsed as every tool and verifier reads them (docs/models.md).

The action section of an assistant turn holds JSON and nothing else:
one call

    {"tool_name": "math.factorial", "parameters": {"number": 5}}

or a JSON list of calls made in parallel

    [{"tool_name": "spotify.play", "parameters": {"artist": "Taylor Swift", "duration": 20}},
     {"tool_name": "spotify.play", "parameters": {"artist": "Maroon 5", "duration": 15}}]

A call has exactly two keys: `tool_name`, the function's name as its doc spells
it (dots included), and `parameters`, an object ({} for none). Everything else
is a format error and `parse_calls` returns None: invalid JSON, NaN/Infinity,
a duplicated key, other keys, an empty list, over MAX_ACTION_CHARS characters
or MAX_DEPTH levels of nesting (bounds the work a hostile sample can cause).
"""

import itertools
import json
import re

MAX_ACTION_CHARS = 100_000
MAX_DEPTH = 32  # [ / { levels; a call in a list with a dict argument is 3-4 deep

_CALL_KEYS = frozenset({'tool_name', 'parameters'})
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r'[^\[\]{}]')


def _nesting_depth(text: str) -> int:
  """Deepest bracket nesting outside strings, counted before json sees the text (its parser recurses)."""
  brackets = _NOT_BRACKET.sub('', _JSON_STRING.sub('', text))
  return max(itertools.accumulate(1 if c in '[{' else -1 for c in brackets), default=0)


def _object_without_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
  keys = [key for key, _ in pairs]
  if len(set(keys)) != len(keys):
    raise ValueError(f'duplicate key in {keys}')  # json.loads would silently keep the last one
  return dict(pairs)


def _reject_constant(name: str):
  raise ValueError(f'{name} is not JSON')


def _is_call(obj, extra_keys: tuple[str, ...]) -> bool:
  return (isinstance(obj, dict) and obj.keys() == _CALL_KEYS | set(extra_keys)
          and all(isinstance(obj[key], str) for key in extra_keys) and isinstance(obj['tool_name'], str)
          and bool(obj['tool_name'].strip()) and isinstance(obj['parameters'], dict))


def parse_calls(action_text: str, extra_keys: tuple[str, ...] = ()) -> list[dict] | None:
  """Action-section text → its calls, or None when the text breaks the format (module docstring).

  None is a format error; the caller scores it wrong and counts it in its metrics. `extra_keys`: string
  keys every call must also have (a chat format's own, e.g. Cohere's "tool_call_id").
  """
  if not isinstance(action_text, str) or len(action_text) > MAX_ACTION_CHARS:
    return None
  if _nesting_depth(action_text) > MAX_DEPTH:
    return None
  try:
    parsed = json.loads(action_text, object_pairs_hook=_object_without_duplicate_keys,
                        parse_constant=_reject_constant)
  except (ValueError, RecursionError):
    return None
  calls = parsed if isinstance(parsed, list) else [parsed]
  if not calls or not all(_is_call(call, extra_keys) for call in calls):
    return None
  return calls
