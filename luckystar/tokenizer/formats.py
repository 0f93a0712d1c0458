"""Chat formats: our conversation model laid out on a checkpoint's special tokens (docs/models.md).

A conversation is system / user / assistant / tool messages; an assistant message holds up to three
sections, in this order: `thinking`, `action` (tool calls as JSON, `luckystar.tools.calls`) and
`response`. The tool messages that follow an action answer its calls in order, one message a call, and
together make one tool turn. A format names the tokens that open and close turns, mark roles and bound
sections, and how tool calls and results are written inside them:

  luckystar  the bundled models: <|START_OF_TURN|><|ASSISTANT|>…<|END_OF_TURN|>, actions as we write them,
             a tool turn <|TOOL|> holding the results joined by a blank line.
  cohere     Command R7B / Command A, as Cohere's own renderer (`cohere_melody.render_cmd3`) lays them out:
             <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>…<|END_OF_TURN_TOKEN|>; an action is an indented JSON
             list, one call a line, {"tool_call_id", "tool_name", "parameters"}, with ids counted across the
             whole conversation; the tool turn is a system turn holding
             <|START_TOOL_RESULT|>[one indented entry per call: its id, {"0": {"content": result}},
             "is_error": null]<|END_TOOL_RESULT|>.

Decisions (docs/models.md says them to users): "is_error" is null, as Cohere's renderer always writes it (a
failing tool says so in its result text); results answer calls by position; the system turn is ours (the mode
preambles are the paper's switch between reasoning and concise), and both modes open a reply with the bare
assistant header, as Cohere's renderer does.
"""

import dataclasses
import json
from typing import Callable, Mapping, Sequence

from luckystar.tools import calls as calls_lib

SECTIONS = ('thinking', 'action', 'response')
TOOLS_HEADER = 'Available tools (JSON schema):'


def tools_text(functions: Sequence[Mapping]) -> str:
  """The system-turn text that shows a model its tools: one JSON schema a line. OpenAI's
  {"type": "function", "function": {...}} entries are read as their function."""
  schemas = [f['function'] if isinstance(f.get('function'), Mapping) else f for f in functions]
  return TOOLS_HEADER + '\n' + '\n'.join(json.dumps(schema, ensure_ascii=False) for schema in schemas)


@dataclasses.dataclass(frozen=True)
class AssistantTurn:
  """The sections of one assistant turn; None where the section is absent."""
  thinking: str | None = None
  action: str | None = None
  response: str | None = None
  ended: bool = False   # the turn closed with END_OF_TURN (or stopped at END_ACTION for a tool call)
  call_ids: tuple[str, ...] = ()   # the ids a numbered-calls format's action gave its calls


def _indented_list(items: Sequence[str]) -> str:
  """Cohere's list layout: one item a line, indented four spaces."""
  return '[\n' + ',\n'.join('    ' + item for item in items) + '\n]'


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """One layout of conversations on special tokens (module docstring)."""
  name: str
  start_of_turn: str
  end_of_turn: str
  roles: Mapping[str, str]                   # system / user / assistant → the token after start_of_turn
  sections: Mapping[str, tuple[str, str]]    # SECTIONS → (start, end)
  tool_role: str                             # the role token (a `roles` key) of a tool result's turn
  tool_result: tuple[str, str] | None = None  # markers around the results inside their turn
  numbered_calls: bool = False               # actions are JSON lists of calls carrying a "tool_call_id"
  revision: int = 0                          # bumped when the layout changes: tokenizer fingerprints follow it

  @property
  def special_tokens(self) -> tuple[str, ...]:
    """Every token the format needs, in a fixed order."""
    return (self.start_of_turn, self.end_of_turn, *dict.fromkeys(self.roles.values()),
            *(token for name in SECTIONS for token in self.sections[name]), *(self.tool_result or ()))

  def write_action(self, action: str, first_id: int = 0) -> tuple[str, list[str]]:
    """(our action text (one call or a list, `tools.calls`) as this format writes it in a turn, the ids its
    calls get): numbered calls count on from `first_id`; text that is not calls is written verbatim."""
    calls = calls_lib.parse_calls(action)
    ids = [str(first_id + i) for i in range(len(calls or ()))]
    if not self.numbered_calls or calls is None:
      return action, ids
    return _indented_list([json.dumps({'tool_call_id': i, 'tool_name': call['tool_name'],
                                       'parameters': call['parameters']}, ensure_ascii=False)
                           for i, call in zip(ids, calls)]), ids

  def read_action(self, text: str) -> tuple[str, tuple[str, ...]]:
    """(a generated action's text as our tools and verifiers read it, the call ids it gave): numbered calls
    lose their ids; anything else stays verbatim, so a malformed action is still a format error downstream."""
    if not self.numbered_calls:
      return text, ()
    calls = calls_lib.parse_calls(text, extra_keys=('tool_call_id',))
    if calls is None:
      return text, ()
    plain = [{key: call[key] for key in ('tool_name', 'parameters')} for call in calls]
    return json.dumps(plain[0] if len(plain) == 1 else plain, ensure_ascii=False), tuple(
        call['tool_call_id'] for call in calls)

  def tool_result_text(self, results: Sequence[str], call_ids: Sequence[str]) -> str:
    """The text of a tool turn answering calls `call_ids` with `results` (one each), between the tool_result
    markers if any."""
    if self.tool_result is None:
      return '\n\n'.join(results)
    return _indented_list([
        '{\n        "tool_call_id": ' + json.dumps(i) + ',\n        "results": {\n            "0": '
        + json.dumps({'content': result}, ensure_ascii=False) + '\n        },\n        "is_error": null\n    }'
        for i, result in zip(call_ids, results, strict=True)])


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
    tool_result=('<|START_TOOL_RESULT|>', '<|END_TOOL_RESULT|>'), numbered_calls=True, revision=2)

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
