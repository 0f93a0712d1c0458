"""Chat formats: our conversation model laid out on a checkpoint's special tokens (docs/models.md).

A conversation is system / user / assistant / tool messages; an assistant message holds up to three
sections, in this order: `thinking`, `action` (tool calls as JSON, `luckystar.tools.calls`) and
`response`. A format names the tokens that open and close turns, mark roles and bound sections, and
how tool calls and results are written inside them:

  luckystar  the bundled models: <|START_OF_TURN|><|ASSISTANT|>…<|END_OF_TURN|>, tool results in a
             <|TOOL|> turn, actions as we write them.
  cohere     Command R7B / Command A: <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>…<|END_OF_TURN_TOKEN|>,
             actions as a JSON list of {"tool_call_id", "tool_name", "parameters"}, a tool result in a
             system turn: <|START_TOOL_RESULT|>[{"tool_call_id": "0", "results": {"0": result},
             "is_error": null}]<|END_TOOL_RESULT|>.

Decision: our tools answer an action with one text (a list of calls gets one joined result), so a Cohere
tool turn holds one result entry for call "0"; call ids restart at "0" in every action.
"""

import dataclasses
import json
from typing import Callable, Mapping

from luckystar.tools import calls as calls_lib

SECTIONS = ('thinking', 'action', 'response')


@dataclasses.dataclass(frozen=True)
class AssistantTurn:
  """The sections of one assistant turn; None where the section is absent."""
  thinking: str | None = None
  action: str | None = None
  response: str | None = None
  ended: bool = False   # the turn closed with END_OF_TURN (or stopped at END_ACTION for a tool call)


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """One layout of conversations on special tokens (module docstring)."""
  name: str
  start_of_turn: str
  end_of_turn: str
  roles: Mapping[str, str]                   # system / user / assistant → the token after start_of_turn
  sections: Mapping[str, tuple[str, str]]    # SECTIONS → (start, end)
  tool_role: str                             # the role token (a `roles` key) of a tool result's turn
  tool_result: tuple[str, str] | None = None  # markers around the result inside its turn
  numbered_calls: bool = False               # actions are JSON lists of calls carrying a "tool_call_id"

  @property
  def special_tokens(self) -> tuple[str, ...]:
    """Every token the format needs, in a fixed order."""
    return (self.start_of_turn, self.end_of_turn, *dict.fromkeys(self.roles.values()),
            *(token for name in SECTIONS for token in self.sections[name]), *(self.tool_result or ()))

  def write_action(self, action: str) -> str:
    """Our action text (one call or a list, `tools.calls`) as this format writes it in a turn."""
    if not self.numbered_calls:
      return action
    calls = calls_lib.parse_calls(action)
    if calls is None:
      return action   # not calls: written verbatim, as it was given
    return json.dumps([{'tool_call_id': str(i), **call} for i, call in enumerate(calls)], ensure_ascii=False)

  def read_action(self, text: str) -> str:
    """A generated action's text as our tools and verifiers read it: numbered calls lose their ids; anything
    else stays verbatim, so a malformed action is still a format error downstream."""
    if not self.numbered_calls:
      return text
    calls = calls_lib.parse_calls(text, extra_keys=('tool_call_id',))
    if calls is None:
      return text
    plain = [{key: call[key] for key in ('tool_name', 'parameters')} for call in calls]
    return json.dumps(plain[0] if len(plain) == 1 else plain, ensure_ascii=False)

  def tool_result_text(self, result: str) -> str:
    """The text of a tool turn holding `result`, between the tool_result markers if any."""
    if self.tool_result is None:
      return result
    return json.dumps([{'tool_call_id': '0', 'results': {'0': result}, 'is_error': None}], ensure_ascii=False)


LUCKYSTAR = ChatFormat(
    name='luckystar', start_of_turn='<|START_OF_TURN|>', end_of_turn='<|END_OF_TURN|>',
    roles={'system': '<|SYSTEM|>', 'user': '<|USER|>', 'assistant': '<|ASSISTANT|>', 'tool': '<|TOOL|>'},
    sections={'thinking': ('<|START_THINKING|>', '<|END_THINKING|>'),
              'action': ('<|START_ACTION|>', '<|END_ACTION|>'),
              'response': ('<|START_RESPONSE|>', '<|END_RESPONSE|>')},
    tool_role='tool')

COHERE = ChatFormat(
    name='cohere', start_of_turn='<|START_OF_TURN_TOKEN|>', end_of_turn='<|END_OF_TURN_TOKEN|>',
    roles={'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'},
    sections=LUCKYSTAR.sections, tool_role='system',
    tool_result=('<|START_TOOL_RESULT|>', '<|END_TOOL_RESULT|>'), numbered_calls=True)

FORMATS = {f.name: f for f in (LUCKYSTAR, COHERE)}
CHOICES = ('auto', *FORMATS)


def resolve(chat_format: 'str | ChatFormat', has_token: Callable[[str], bool]) -> ChatFormat:
  """The format `chat_format` names, or is ('auto': the one whose turn tokens the tokenizer has), checked to have
  every special token it needs; a ValueError naming the missing tokens otherwise."""
  if not isinstance(chat_format, ChatFormat) and chat_format not in CHOICES:
    raise ValueError(f'unknown chat_format {chat_format!r}; expected one of {CHOICES}')
  if isinstance(chat_format, ChatFormat):
    chosen = chat_format
  elif chat_format == 'auto':
    found = [f for f in FORMATS.values() if has_token(f.start_of_turn) and has_token(f.roles['assistant'])]
    if not found:
      raise ValueError('the tokenizer has the turn tokens of no chat format luckystar knows: '
                       + '; '.join(f'{f.name} needs {f.start_of_turn} and {f.roles["assistant"]}'
                                   for f in FORMATS.values()))
    chosen = found[0]
  else:
    chosen = FORMATS[chat_format]
  if missing := [token for token in chosen.special_tokens if not has_token(token)]:
    hint = (' (a Cohere v1 checkpoint such as Command R has no thinking, action and tool-result tokens; use a '
            'Command R7B / Command A tokenizer)' if chosen is COHERE else '')
    raise ValueError(f'the tokenizer lacks {", ".join(missing)}, which the {chosen.name} chat format needs{hint}')
  return chosen
