"""Tokenizers and chat formats (docs/models.md): a `Tokenizer` is a text codec (`codecs`: the bundled
sentencepiece model, or a transformers `tokenizer.json`) plus a chat format (`formats`: ours, or
Cohere's as Command R7B and Command A use it).

A conversation renders to token ids plus a loss mask (1 on the tokens the assistant generates, 0
elsewhere); a generated turn parses back into its sections; the stop ids come from the format. Special
tokens are never produced from text, so a user who types "<|END_OF_TURN|>" gets ordinary text tokens,
not a turn boundary.

Retrain the bundled model (deterministic, ~1 min; the corpus is the task suites, `luckystar.data.corpus`):

    python -m luckystar.data.corpus --output=luckystar/assets/tokenizer.model
"""

import functools
import hashlib
import io
import itertools
import json
import os
import pathlib
from typing import Any, Iterable, Mapping, Sequence

from luckystar import files
from luckystar.tokenizer import codecs
from luckystar.tokenizer import formats
from luckystar.tokenizer.formats import AssistantTurn, ChatFormat  # noqa: F401  (the public names)

DEFAULT_PATH = pathlib.Path(__file__).parents[1] / 'assets' / 'tokenizer.model'
VOCAB_SIZE = 8000

PAD, UNK, BOS, EOS = '<pad>', '<unk>', '<s>', '</s>'
# Our format's tokens, as the bundled sentencepiece model holds them.
START_OF_TURN, END_OF_TURN = formats.LUCKYSTAR.start_of_turn, formats.LUCKYSTAR.end_of_turn
ROLE_TOKENS = dict(formats.LUCKYSTAR.roles)
SECTION_TOKENS = dict(formats.LUCKYSTAR.sections)   # section → (start, end); an assistant turn holds them in order
SPECIAL_TOKENS = formats.LUCKYSTAR.special_tokens

PREAMBLES = {
    'reasoning': ('You are LuckyStar, a bilingual Korean and English assistant. Reasoning mode: think step by '
                  'step in English, then answer in the language of the user.'),
    'concise': ('You are LuckyStar, a bilingual Korean and English assistant. Concise mode: answer directly '
                'and briefly, in the language of the user.'),
}
MODES = tuple(PREAMBLES)
# The mode of a chat client's request that names none (a server; an exported chat template without
# enable_thinking): clients such as a judge or a chat UI want the answer, not the trace.
CLIENT_DEFAULT_MODE = 'concise'


def mode_of(enable_thinking: bool) -> str:
  """The mode that vLLM's / Qwen3's `enable_thinking` chat-template switch names."""
  return 'reasoning' if enable_thinking else 'concise'
ROLES = ('system', 'developer', 'user', 'assistant', 'tool')   # developer: OpenAI's newer name for system
_OURS_FOR_OPENAI = {'reasoning_content': 'thinking', 'tool_calls': 'action', 'content': 'response'}


def from_openai(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
  """Messages in OpenAI's chat shape (or ours, or a mix) → messages as `Tokenizer.render` reads them.

  An assistant message's `reasoning_content` becomes its thinking section, `tool_calls` (OpenAI's function
  calls, arguments the JSON text of an object) its action, `content` its response; our `thinking` / `action` /
  `response` pass through. `content` may be a string or a list of text parts; `developer` is a system message;
  `tool` messages keep their content. A ValueError names the field ('messages[1].tool_calls[0].function.arguments').
  """
  converted = []
  for i, message in enumerate(messages):
    where = f'messages[{i}]'
    if not isinstance(message, Mapping):
      raise ValueError(f'{where}: a message is a dict with a role, got {type(message).__name__}')
    role = message.get('role')
    if role not in ROLES:
      raise ValueError(f'{where}.role: unknown role {role!r}; expected one of {list(ROLES)}')
    if role == 'assistant':
      converted.append(_assistant_turn(message, where))
      continue
    if (text := _text(message.get('content'), f'{where}.content')) is None:
      raise ValueError(f'{where}: a {role} message needs content')
    converted.append({'role': 'system' if role == 'developer' else role, 'content': text})
  return converted


def with_tools(messages: Sequence[dict], tools: Sequence[Mapping] | None) -> list[dict]:
  """`messages` with function schemas (an OpenAI request's `tools`, or BFCL's docs) shown at the head of the
  system turn, before a system message's content (`formats.tools_text`): `render(tools=...)`, a server's
  `tools` and the function-calling data all lay them out so."""
  messages = list(messages)
  if not tools:
    return messages
  text = formats.tools_text(tools)
  if messages and messages[0]['role'] == 'system':
    return [{**messages[0], 'content': f'{text}\n\n{messages[0]["content"]}'}, *messages[1:]]
  return [{'role': 'system', 'content': text}, *messages]


def _text(content: Any, where: str) -> str | None:
  """A message's content: a string, or OpenAI's list of text parts joined."""
  if content is None or isinstance(content, str):
    return content
  if not isinstance(content, (list, tuple)):
    raise ValueError(f'{where}: content is a string or a list of text parts, got {type(content).__name__}')
  for j, part in enumerate(content):
    if not (isinstance(part, Mapping) and part.get('type') == 'text' and isinstance(part.get('text'), str)):
      raise ValueError(f'{where}[{j}]: only text parts ({{"type": "text", "text": ...}}) are supported')
  return ''.join(part['text'] for part in content)


def _assistant_turn(message: Mapping[str, Any], where: str) -> dict:
  for theirs, ours in _OURS_FOR_OPENAI.items():
    if message.get(theirs) and message.get(ours) is not None:   # an empty list of tool_calls is no action
      raise ValueError(f'{where}: both {theirs} and {ours} give its {ours} section; give one')
  content = _text(message.get('content'), f'{where}.content')
  if content == '' and message.get('tool_calls'):
    content = None   # OpenAI clients send a call back with content "" or null: no response section either way
  thinking = message.get('reasoning_content')
  turn = {'role': 'assistant', 'thinking': thinking if thinking is not None else message.get('thinking'),
          'action': message.get('action'), 'response': content if content is not None else message.get('response')}
  if calls := message.get('tool_calls'):
    turn['action'] = json.dumps([_call(call, f'{where}.tool_calls[{j}]') for j, call in enumerate(calls)]
                                if len(calls) > 1 else _call(calls[0], f'{where}.tool_calls[0]'), ensure_ascii=False)
  if all(turn[name] is None for name in formats.SECTIONS):
    raise ValueError(f'{where}: an assistant message needs content, reasoning_content or tool_calls')
  return turn


def _call(call: Any, where: str) -> dict:
  """An OpenAI tool call → our action's {tool_name, parameters}."""
  function = call.get('function') if isinstance(call, Mapping) else None
  if not (isinstance(function, Mapping) and isinstance(function.get('name'), str)):
    raise ValueError(f'{where}: a tool call is {{"type": "function", "function": {{"name": ..., "arguments": ...}}}}')
  name, arguments = function['name'], function.get('arguments', '{}')
  if isinstance(arguments, str):   # bounded: the arguments are JSON text, as deep as a client likes
    try:
      arguments = files.loads(arguments, f'{where}.function.arguments')
    except ValueError as e:
      raise ValueError(f'{e}; function.arguments of {name[:200]!r} must be the JSON text of an object') from None
  if not isinstance(arguments, Mapping):
    raise ValueError(f'{where}.function.arguments: function.arguments of {name[:200]!r} must be the JSON text of an '
                     f'object, got {str(function.get("arguments"))[:200]!r}')
  return {'tool_name': name, 'parameters': dict(arguments)}

Codec = codecs.SentencePiece | codecs.Tokenizers


class Tokenizer:
  """A codec and a chat format. Ids are Python ints; arrays are the caller's business."""

  def __init__(self, codec: Codec, chat_format: str | ChatFormat = 'auto'):
    self.codec = codec
    self.format = formats.resolve(chat_format, lambda token: codec.token_id(token) is not None)
    self.special_ids = {token: codec.token_id(token) for token in self.format.special_tokens}
    self._special_id_set = frozenset(self.special_ids.values())
    sections = self.format.sections
    self._section_by_start = {self.special_ids[start]: name for name, (start, _) in sections.items()}
    self._section_end = {name: self.special_ids[end] for name, (_, end) in sections.items()}

  @classmethod
  def from_sentencepiece(cls, model_proto: bytes) -> 'Tokenizer':
    """A sentencepiece model with our chat tokens, in our format."""
    try:
      return cls(codecs.SentencePiece(model_proto), formats.LUCKYSTAR)
    except ValueError as e:
      raise ValueError(f'{e}; retrain it with `python -m luckystar.data.corpus`') from None

  @classmethod
  def from_file(cls, path: str | pathlib.Path = DEFAULT_PATH) -> 'Tokenizer':
    """`from_sentencepiece` of a model file."""
    path = pathlib.Path(path)
    if not path.is_file():
      raise FileNotFoundError(f'{path}: no tokenizer model; build it with `python -m luckystar.data.corpus`')
    return cls.from_sentencepiece(files.read_bytes(path, codecs.MAX_SENTENCEPIECE_BYTES, 'sentencepiece model'))

  @property
  def vocab_size(self) -> int:
    return self.codec.vocab_size

  pad_id = property(lambda self: self.codec.pad_id)
  bos_id = property(lambda self: self.codec.bos_id)
  eos_id = property(lambda self: self.codec.eos_id)
  end_of_turn_id = property(lambda self: self.special_ids[self.format.end_of_turn])
  end_of_action_id = property(lambda self: self.special_ids[self.format.sections['action'][1]])
  stop_ids = property(lambda self: (self.end_of_turn_id, self.end_of_action_id))
  sp = property(lambda self: self.codec.sp)                    # sentencepiece backend only
  model_proto = property(lambda self: self.codec.model_proto)  # sentencepiece backend only

  def files(self) -> dict[str, str | bytes]:
    """The codec's files, as a transformers directory holds them."""
    return self.codec.files()

  @functools.cached_property
  def fingerprint(self) -> str:
    """The identity of the ids this tokenizer makes: its files and its chat format."""
    layout = self.format.name + (f'/{self.format.revision}' if self.format.revision else '')
    digest = hashlib.sha256(layout.encode())
    for name, content in sorted(self.codec.identity().items()):
      digest.update(name.encode() + b'\0' + (content if isinstance(content, bytes) else content.encode()) + b'\0')
    return digest.hexdigest()[:16]

  def made(self, recorded: str | None) -> bool:
    """Whether token ids an artifact recorded with tokenizer fingerprint `recorded` are this tokenizer's ids
    (None: a file from before artifacts recorded their tokenizer, made by the bundled one)."""
    return recorded == self.fingerprint or (recorded is None and self.fingerprint == _bundled_fingerprint())

  def describe(self) -> dict[str, str | int]:
    """What a run directory records about its tokenizer."""
    return {'backend': self.codec.backend, 'chat_format': self.format.name, 'vocab_size': self.vocab_size,
            'fingerprint': self.fingerprint}

  def encode(self, text: str) -> list[int]:
    """Plain text → ids; never yields special tokens."""
    return self.codec.encode(text)

  def decode(self, ids: Iterable[int]) -> str:
    """Ids → text; special tokens decode to nothing."""
    return self.codec.decode([i for i in map(int, ids) if i not in self._special_id_set])

  # ---- the chat format ---------------------------------------------------------------------------

  def _turn(self, role: str, body: list[int]) -> list[int]:
    return [self.special_ids[self.format.start_of_turn], self.special_ids[self.format.roles[role]], *body,
            self.special_ids[self.format.end_of_turn]]

  def _assistant_body(self, message: dict, first_call: int = 0) -> tuple[list[int], list[str]]:
    """(the ids of an assistant turn's sections, the ids its action gave its calls, counted from first_call)."""
    if not any(message.get(name) is not None for name in formats.SECTIONS):
      raise ValueError(f'assistant message has none of the sections {list(formats.SECTIONS)}: {message}')
    body, call_ids = [], []
    for name in formats.SECTIONS:
      if (text := message.get(name)) is not None:
        start, end = self.format.sections[name]
        if name == 'action':
          text, call_ids = self.format.write_action(text, first_call)
        body += [self.special_ids[start], *self.encode(text), self.special_ids[end]]
    return body, call_ids

  def tool_result_ids(self, results: str | Sequence[str], max_tokens: int | None = None,
                      call_ids: Sequence[str] = ()) -> tuple[list[int], str]:
    """(ids of a tool turn's body answering calls `call_ids` with `results`, one each; the results' text as the
    model reads them): each result is cut to `max_tokens` tokens of its own first, then written as the format
    writes tool results (ours: joined by a blank line, then cut). A call without an id (a tool_fn that answers
    several calls with one text, or a result past the action's calls) is numbered after the last id."""
    results = [results] if isinstance(results, str) else list(results)
    if self.format.tool_result is None:
      ids = self.encode(self.format.tool_result_text(results, ()))
      ids = ids if max_tokens is None else ids[:max_tokens]
      return ids, self.decode(ids)
    texts = [self.decode(self.encode(r) if max_tokens is None else self.encode(r)[:max_tokens]) for r in results]
    ids = list(call_ids)[:len(texts)]
    while len(ids) < len(texts):
      ids.append(str(max((int(i) for i in ids if i.isdigit()), default=-1) + 1))
    start, end = self.format.tool_result
    body = [self.special_ids[start], *self.encode(self.format.tool_result_text(texts, ids)), self.special_ids[end]]
    return body, '\n\n'.join(texts)

  def tool_round_trip(self, body: Sequence[int]) -> list[int]:
    """What follows a generated END_ACTION when the tool answers with `body` (`tool_result_ids`): the rest of
    the assistant turn as `render` closes it, the tool turn, and the next generation prompt; the one place it
    is built, so rollouts splice exactly what `render` lays out."""
    return [self.end_of_turn_id, *self._turn(self.format.tool_role, list(body)), *self.generation_prompt()]

  def render(self, messages: Sequence[dict], mode: str, add_generation_prompt: bool = False,
             tools: Sequence[Mapping] | None = None) -> tuple[list[int], list[int]]:
    """Conversation → (ids, loss_mask).

    messages: dicts with `role` in system/user/assistant/tool; assistant messages carry `thinking` /
    `action` / `response` (any of them), the others `content`; the tool messages after an action answer its
    calls in order and make one tool turn. One BOS opens the ids; the system turn holds the mode's preamble,
    then `tools` (function schemas, `formats.tools_text`), then a system message's content, a blank line
    apart. loss_mask is 1 on every assistant token after the turn header, END_OF_TURN included, and 0 elsewhere.
    """
    if mode not in PREAMBLES:
      raise ValueError(f'unknown mode {mode!r}; expected one of {MODES}')
    messages = with_tools(messages, tools)
    system = [m['content'] for m in messages if m['role'] == 'system']
    if len(system) > 1 or (system and messages[0]['role'] != 'system'):
      raise ValueError('at most one system message, and only as the first message')
    ids = [self.bos_id, *self._turn('system', self.encode('\n\n'.join([PREAMBLES[mode], *system])))]
    mask = [0] * len(ids)
    rest = list(messages[len(system):])
    calls, answering = 0, []    # calls made so far; the ids of the last action's calls
    for i, message in enumerate(rest):
      role = message['role']
      if role == 'assistant':
        body, answering = self._assistant_body(message, calls)
        calls += len(answering)
        turn = self._turn(role, body)
        mask += [0, 0] + [1] * (len(turn) - 2)
      elif role == 'user':
        turn = self._turn(role, self.encode(message['content']))
        mask += [0] * len(turn)
      elif role == 'tool':
        if i > 0 and rest[i - 1]['role'] == 'tool':
          continue   # written with the first of its run
        run = [m['content'] for m in itertools.takewhile(lambda m: m['role'] == 'tool', rest[i:])]
        call_ids = answering[:len(run)] + [str(calls + k) for k in range(len(run) - len(answering))]
        calls, answering = calls + max(0, len(run) - len(answering)), []
        turn = self._turn(self.format.tool_role, self.tool_result_ids(run, call_ids=call_ids)[0])
        mask += [0] * len(turn)
      else:
        raise ValueError(f'unknown or misplaced role {role!r} in {message}')
      ids += turn
    if add_generation_prompt:
      header = self.generation_prompt()
      ids, mask = ids + header, mask + [0] * len(header)
    return ids, mask

  def generation_prompt(self) -> list[int]:
    return [self.special_ids[self.format.start_of_turn], self.special_ids[self.format.roles['assistant']]]

  def parse_assistant(self, ids: Sequence[int]) -> AssistantTurn:
    """Generated ids after the generation prompt → sections. Unclosed sections keep their text;
    text outside any section is ignored (a format error that verifiers see as a missing section)."""
    sections: dict[str, list[int]] = {}
    current, ended = None, False
    for token in map(int, ids):
      if token == self.end_of_turn_id:
        ended = True
        break
      if current is None and token in self._section_by_start:
        current = self._section_by_start[token]
        sections[current] = []
      elif current is not None and token == self._section_end[current]:
        if current == 'action':
          ended = True  # a tool call ends generation until the tool answers
        current = None
      elif current is not None:
        sections[current].append(token)
    texts = {name: self.decode(body) for name, body in sections.items()}
    call_ids = ()
    if 'action' in texts:
      texts['action'], call_ids = self.format.read_action(texts['action'])
    return AssistantTurn(**texts, ended=ended, call_ids=call_ids)


def default() -> Tokenizer:
  """The bundled tokenizer."""
  return Tokenizer.from_file(DEFAULT_PATH)


@functools.cache
def _bundled_fingerprint() -> str:
  return default().fingerprint


def from_dir(path: str | pathlib.Path, chat_format: str = 'auto') -> Tokenizer | None:
  """The tokenizer a model directory carries, None if it has none: our sentencepiece `tokenizer.model` (with
  our chat tokens) first, else a transformers `tokenizer.json` (+ `tokenizer_config.json`) in `chat_format`
  ('auto': detected from its special tokens). A tokenizer.json that lacks the format's tokens is a
  ValueError naming them. A tokenizer file that is no regular file, is too large or is malformed is an
  errors.InvalidFile naming it (one that is not there is skipped)."""
  path = pathlib.Path(path)
  model = path / 'tokenizer.model'
  if os.path.lexists(model) and chat_format in ('auto', formats.LUCKYSTAR.name):
    proto = files.read_bytes(model, codecs.MAX_SENTENCEPIECE_BYTES, 'sentencepiece model')
    try:
      return Tokenizer.from_sentencepiece(proto)
    except (ValueError, RuntimeError):
      pass  # another model's sentencepiece file (e.g. Cohere's own): its tokenizer.json speaks for it
  if os.path.lexists(path / 'tokenizer.json'):
    codec = codecs.Tokenizers.from_dir(path)   # its errors name the file
    try:
      return Tokenizer(codec, chat_format)
    except ValueError as e:
      raise ValueError(f'{path}: {e}') from None
  return None   # no tokenizer, or only another model's sentencepiece file


# Every printable ASCII character gets its own piece (math and SQL need `+ * [ ]` even if the corpus
# rarely shows them); anything else outside the corpus falls back to UTF-8 bytes.
_REQUIRED_CHARS = ''.join(chr(c) for c in range(33, 127))


def train(lines: Iterable[str], vocab_size: int = VOCAB_SIZE) -> bytes:
  """A byte-fallback BPE model over `lines` with our special tokens; identity normalisation and kept
  whitespace so that decode(encode(text)) == text exactly."""
  import sentencepiece as spm   # here: the GPU benchmark image runs the model and sampler without it
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type='bpe',
      byte_fallback=True, character_coverage=1.0, required_chars=_REQUIRED_CHARS, normalization_rule_name='identity',
      add_dummy_prefix=False, remove_extra_whitespaces=False, split_digits=True,
      allow_whitespace_only_pieces=True, user_defined_symbols=['\n'], control_symbols=list(SPECIAL_TOKENS),
      pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece=PAD, unk_piece=UNK, bos_piece=BOS, eos_piece=EOS,
      num_threads=1, minloglevel=2)
  return model.getvalue()
