"""Our bilingual sentencepiece tokenizer and the chat template (DESIGN §4).

A conversation renders to token ids plus a loss mask (1 on the tokens the
assistant generates, 0 elsewhere). Special tokens are sentencepiece *control*
symbols: they are never produced from text, so a user who types
"<|END_OF_TURN|>" gets ordinary text tokens, not a turn boundary.

Retrain the bundled model (deterministic, ~1 min; the corpus is the task suites, `luckystar.data.corpus`):

    python -m luckystar.data.corpus --output=luckystar/assets/tokenizer.model
"""

import dataclasses
import io
import pathlib
from typing import Iterable, Sequence

import sentencepiece as spm

DEFAULT_PATH = pathlib.Path(__file__).parent / 'assets' / 'tokenizer.model'
VOCAB_SIZE = 8000

PAD, UNK, BOS, EOS = '<pad>', '<unk>', '<s>', '</s>'
START_OF_TURN, END_OF_TURN = '<|START_OF_TURN|>', '<|END_OF_TURN|>'
ROLE_TOKENS = {'system': '<|SYSTEM|>', 'user': '<|USER|>', 'assistant': '<|ASSISTANT|>', 'tool': '<|TOOL|>'}
SECTION_TOKENS = {  # section → (start, end); an assistant turn holds them in this order
    'thinking': ('<|START_THINKING|>', '<|END_THINKING|>'),
    'action': ('<|START_ACTION|>', '<|END_ACTION|>'),
    'response': ('<|START_RESPONSE|>', '<|END_RESPONSE|>'),
}
SPECIAL_TOKENS = (START_OF_TURN, END_OF_TURN, *ROLE_TOKENS.values(),
                  *(token for pair in SECTION_TOKENS.values() for token in pair))

PREAMBLES = {
    'reasoning': ('You are LuckyStar, a bilingual Korean and English assistant. Reasoning mode: think step by '
                  'step in English, then answer in the language of the user.'),
    'concise': ('You are LuckyStar, a bilingual Korean and English assistant. Concise mode: answer directly '
                'and briefly, in the language of the user.'),
}
MODES = tuple(PREAMBLES)


@dataclasses.dataclass(frozen=True)
class AssistantTurn:
  """The sections of one assistant turn; None where the section is absent."""
  thinking: str | None = None
  action: str | None = None
  response: str | None = None
  ended: bool = False   # the turn closed with END_OF_TURN (or stopped at END_ACTION for a tool call)


class Tokenizer:
  """sentencepiece model + chat template. Ids are Python ints; arrays are the caller's business."""

  def __init__(self, model_proto: bytes):
    self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.model_proto = model_proto
    missing = [t for t in SPECIAL_TOKENS if self.sp.piece_to_id(t) == self.sp.unk_id()]
    if missing:
      raise ValueError(f'tokenizer lacks special tokens {missing}; retrain it with `python -m luckystar.data.corpus`')
    self.special_ids = {t: self.sp.piece_to_id(t) for t in SPECIAL_TOKENS}
    self._section_by_start = {self.special_ids[s]: name for name, (s, _) in SECTION_TOKENS.items()}
    self._section_end = {name: self.special_ids[e] for name, (_, e) in SECTION_TOKENS.items()}

  @classmethod
  def from_file(cls, path: str | pathlib.Path = DEFAULT_PATH) -> 'Tokenizer':
    path = pathlib.Path(path)
    if not path.is_file():
      raise FileNotFoundError(f'{path}: no tokenizer model; build it with `python -m luckystar.data.corpus`')
    return cls(path.read_bytes())

  @property
  def vocab_size(self) -> int:
    return self.sp.get_piece_size()

  pad_id = property(lambda self: self.sp.pad_id())
  bos_id = property(lambda self: self.sp.bos_id())
  eos_id = property(lambda self: self.sp.eos_id())
  end_of_turn_id = property(lambda self: self.special_ids[END_OF_TURN])
  end_of_action_id = property(lambda self: self.special_ids[SECTION_TOKENS['action'][1]])

  def encode(self, text: str) -> list[int]:
    """Plain text → ids; never yields special tokens (they are control symbols)."""
    return self.sp.encode(text)

  def decode(self, ids: Iterable[int]) -> str:
    """Ids → text; special tokens decode to nothing."""
    return self.sp.decode([int(i) for i in ids])

  # ---- chat template -------------------------------------------------------------------------

  def _turn(self, role: str, body: list[int]) -> list[int]:
    return [self.special_ids[START_OF_TURN], self.special_ids[ROLE_TOKENS[role]], *body,
            self.special_ids[END_OF_TURN]]

  def _assistant_body(self, message: dict) -> list[int]:
    if not any(message.get(name) is not None for name in SECTION_TOKENS):
      raise ValueError(f'assistant message has none of the sections {list(SECTION_TOKENS)}: {message}')
    body = []
    for name, (start, end) in SECTION_TOKENS.items():
      if message.get(name) is not None:
        body += [self.special_ids[start], *self.encode(message[name]), self.special_ids[end]]
    return body

  def render(self, messages: Sequence[dict], mode: str, add_generation_prompt: bool = False
             ) -> tuple[list[int], list[int]]:
    """Conversation → (ids, loss_mask).

    messages: dicts with `role` in system/user/assistant/tool; assistant messages
    carry `thinking` / `action` / `response` (any of them), the others `content`.
    The mode's preamble opens the system turn (a system message's content follows
    it). loss_mask is 1 on every assistant token after the turn header, END_OF_TURN
    included, and 0 elsewhere.
    """
    if mode not in PREAMBLES:
      raise ValueError(f'unknown mode {mode!r}; expected one of {MODES}')
    system = [m['content'] for m in messages if m['role'] == 'system']
    if len(system) > 1 or (system and messages[0]['role'] != 'system'):
      raise ValueError('at most one system message, and only as the first message')
    ids = [self.bos_id, *self._turn('system', self.encode('\n\n'.join([PREAMBLES[mode], *system])))]
    mask = [0] * len(ids)
    for message in messages[len(system):]:
      role = message['role']
      if role not in ROLE_TOKENS or role == 'system':
        raise ValueError(f'unknown or misplaced role {role!r} in {message}')
      if role == 'assistant':
        turn = self._turn(role, self._assistant_body(message))
        mask += [0, 0] + [1] * (len(turn) - 2)
      else:
        turn = self._turn(role, self.encode(message['content']))
        mask += [0] * len(turn)
      ids += turn
    if add_generation_prompt:
      header = self.generation_prompt()
      ids, mask = ids + header, mask + [0] * len(header)
    return ids, mask

  def generation_prompt(self) -> list[int]:
    return [self.special_ids[START_OF_TURN], self.special_ids[ROLE_TOKENS['assistant']]]

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
    return AssistantTurn(**{name: self.decode(body) for name, body in sections.items()}, ended=ended)


def default() -> Tokenizer:
  """The bundled tokenizer."""
  return Tokenizer.from_file(DEFAULT_PATH)


# Every printable ASCII character gets its own piece (math and SQL need `+ * [ ]` even if the corpus
# rarely shows them); anything else outside the corpus falls back to UTF-8 bytes.
_REQUIRED_CHARS = ''.join(chr(c) for c in range(33, 127))


def train(lines: Iterable[str], vocab_size: int = VOCAB_SIZE) -> bytes:
  """A byte-fallback BPE model over `lines` with our special tokens; identity normalisation and kept
  whitespace so that decode(encode(text)) == text exactly."""
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type='bpe',
      byte_fallback=True, character_coverage=1.0, required_chars=_REQUIRED_CHARS, normalization_rule_name='identity',
      add_dummy_prefix=False, remove_extra_whitespaces=False, split_digits=True,
      allow_whitespace_only_pieces=True, user_defined_symbols=['\n'], control_symbols=list(SPECIAL_TOKENS),
      pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece=PAD, unk_piece=UNK, bos_piece=BOS, eos_piece=EOS,
      num_threads=1, minloglevel=2)
  return model.getvalue()
