"""Text ↔ token ids, two backends behind one interface: the bundled sentencepiece model, and a transformers
tokenizer directory (`tokenizer.json` through the `tokenizers` library, special tokens from
`tokenizer_config.json`).

Both encode plain text only: special-token strings a user types come out as ordinary text tokens, never
as a turn boundary, and encoding adds no BOS/EOS (the chat format places them). Decoding drops special
tokens.

A checkpoint's tokenizer files come from a download: each is bounded in size and JSON depth and checked to be
a JSON object before the `tokenizers` library sees it (`luckystar.files`), so a bad one is one InvalidFile
naming it, not the library's bare `Exception`.
"""

import json
import os
import pathlib
from typing import Any, Iterable, Mapping

import tokenizers

from luckystar import errors
from luckystar import files

MAX_TOKENIZER_JSON_BYTES = 128 << 20    # ~4× the largest real one (Gemma 3's, 33 MB)
MAX_TOKENIZER_CONFIG_BYTES = 16 << 20   # a chat template and an added-token table: real ones are under 1 MB
MAX_SENTENCEPIECE_BYTES = 64 << 20      # tokenizer.model; real ones are a few MB
CHAT_TEMPLATE_FILE = 'chat_template.jinja'   # where transformers 5 saves a chat template (it wins over the config's)


class SentencePiece:
  """A sentencepiece model whose special tokens are control symbols (never produced from text)."""
  backend = 'sentencepiece'

  def __init__(self, model_proto: bytes):
    import sentencepiece as spm   # here: the GPU benchmark image runs the model and sampler without it
    self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.model_proto = model_proto

  vocab_size = property(lambda self: self.sp.get_piece_size())
  pad_id = property(lambda self: self.sp.pad_id())
  bos_id = property(lambda self: self.sp.bos_id())
  eos_id = property(lambda self: self.sp.eos_id())

  def token_id(self, token: str) -> int | None:
    """The id of a whole piece, None if the vocabulary lacks it."""
    i = self.sp.piece_to_id(token)
    return None if i == self.sp.unk_id() and token != self.sp.id_to_piece(i) else i

  def token(self, i: int) -> str:
    return self.sp.id_to_piece(int(i))

  def encode(self, text: str) -> list[int]:
    return self.sp.encode(text)

  def decode(self, ids: Iterable[int]) -> str:
    return self.sp.decode([int(i) for i in ids])

  def files(self) -> dict[str, bytes]:
    return {'tokenizer.model': self.model_proto}

  identity = files   # what decides the ids it makes


def _token_text(config: Mapping[str, Any], key: str, source: str) -> str | None:
  """A special token in tokenizer_config.json: a string, or an AddedToken dict with its `content`."""
  value = config.get(key)
  text = value.get('content') if isinstance(value, dict) else value
  if text is not None and not isinstance(text, str):
    raise errors.InvalidFile(f'{source}: {key}={json.dumps(value)[:60]} must be a string (or an object with a '
                             f'"content" string)')
  return text


def _json_type(value: Any) -> str:
  return {list: 'list', str: 'string', int: 'number', float: 'number', bool: 'boolean'}.get(type(value), 'null')


def _object(value: Any, source: str) -> dict:
  if not isinstance(value, dict):
    raise errors.InvalidFile(f'{source}: expected a JSON object, got a JSON {_json_type(value)}')
  return value


class Tokenizers:
  """A transformers tokenizer: tokenizer.json (any `tokenizers` model) plus tokenizer_config.json's bos, eos
  and pad tokens. Added special tokens in the text are encoded as text (`encode_special_tokens`).

  `source` and `config_source` (the files' paths) start the message of an InvalidFile about either."""
  backend = 'tokenizers'

  def __init__(self, tokenizer_json: str, tokenizer_config: Mapping[str, Any], *, source: str = 'tokenizer.json',
               config_source: str = 'tokenizer_config.json', chat_template: str | None = None):
    self.tokenizer_json, self.config = tokenizer_json, dict(tokenizer_config)
    self.chat_template = chat_template   # transformers 5's chat_template.jinja, kept for the export
    # Depth and shape first: the library's parser gives a bare Exception, or recurses, on what it cannot read.
    # Its own parser refuses lone surrogates, so the strings are walked only when it fails (a second for a
    # large vocabulary).
    spec = _object(files.loads(tokenizer_json, source, check_text=False), source)
    try:
      self.hf = tokenizers.Tokenizer.from_str(tokenizer_json)
    except Exception as e:  # the library raises a bare Exception for every fault
      if (bad := files.unencodable(spec)) is not None:
        raise errors.InvalidFile(f'{source}: a string is not valid Unicode (a lone surrogate): {ascii(bad[:40])}'
                                 ) from None
      reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
      raise errors.InvalidFile(f'{source}: the tokenizers library cannot read it: {reason}') from None
    self.hf.encode_special_tokens = True
    self.hf.no_padding()
    self.hf.no_truncation()
    named = {key: _token_text(self.config, f'{key}_token', config_source) for key in ('bos', 'eos', 'pad')}
    ids = {key: None if token is None else self.hf.token_to_id(token) for key, token in named.items()}
    if ids['bos'] is None or ids['eos'] is None:
      raise errors.InvalidFile(f'{config_source}: names bos_token {named["bos"]!r} and eos_token {named["eos"]!r}; '
                               f'both must be tokens of {source}')
    self.bos_id, self.eos_id = ids['bos'], ids['eos']
    self.pad_id = ids['pad'] if ids['pad'] is not None else ids['eos']   # padding is masked: any id does
    # One past the largest id, not the count of pieces: ids may skip numbers, and the model must embed each one.
    self.vocab_size = max(self.hf.get_vocab(with_added_tokens=True).values(), default=-1) + 1

  @classmethod
  def from_dir(cls, path: str | pathlib.Path) -> 'Tokenizers':
    """tokenizer.json and, when present, tokenizer_config.json of a directory, each read within bounds."""
    path = pathlib.Path(path)
    config_file, tokenizer_file = path / 'tokenizer_config.json', path / 'tokenizer.json'
    config = {}
    if os.path.lexists(config_file):   # a FIFO or a device is refused, not skipped
      config = _object(files.read_json(config_file, MAX_TOKENIZER_CONFIG_BYTES, 'tokenizer config'), str(config_file))
    text = files.read_text(tokenizer_file, MAX_TOKENIZER_JSON_BYTES, 'tokenizer file')
    template = path / CHAT_TEMPLATE_FILE
    template = (files.read_text(template, MAX_TOKENIZER_CONFIG_BYTES, 'chat template')
                if os.path.lexists(template) else None)
    return cls(text, config, source=str(tokenizer_file), config_source=str(config_file), chat_template=template)

  def token_id(self, token: str) -> int | None:
    return self.hf.token_to_id(token)

  def token(self, i: int) -> str:
    return self.hf.id_to_token(int(i))

  def encode(self, text: str) -> list[int]:
    return self.hf.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Iterable[int]) -> str:
    return self.hf.decode([int(i) for i in ids], skip_special_tokens=True)

  def files(self) -> dict[str, str]:
    return {'tokenizer.json': self.tokenizer_json,
            'tokenizer_config.json': json.dumps(self.config, indent=2, ensure_ascii=False) + '\n',
            **({CHAT_TEMPLATE_FILE: self.chat_template} if self.chat_template is not None else {})}

  def identity(self) -> dict[str, str]:
    """The files that decide the ids it makes: a chat template decides none (we render in our own format)."""
    config = {key: value for key, value in self.config.items() if key != 'chat_template'}
    return {'tokenizer.json': self.tokenizer_json,
            'tokenizer_config.json': json.dumps(config, indent=2, ensure_ascii=False) + '\n'}
