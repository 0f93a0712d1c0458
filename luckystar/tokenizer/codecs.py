"""Text ↔ token ids, two backends behind one interface: the bundled sentencepiece model, and a transformers
tokenizer directory (`tokenizer.json` through the `tokenizers` library, special tokens from
`tokenizer_config.json`).

Both encode plain text only: special-token strings a user types come out as ordinary text tokens, never
as a turn boundary, and encoding adds no BOS/EOS (the chat format places them). Decoding drops special
tokens.
"""

import json
import pathlib
from typing import Any, Iterable, Mapping

import tokenizers


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


def _token_text(value: Any) -> str | None:
  """A special token in tokenizer_config.json: a string, or an AddedToken dict with its `content`."""
  return value.get('content') if isinstance(value, dict) else value


class Tokenizers:
  """A transformers tokenizer: tokenizer.json (any `tokenizers` model) plus tokenizer_config.json's bos, eos
  and pad tokens. Added special tokens in the text are encoded as text (`encode_special_tokens`)."""
  backend = 'tokenizers'

  def __init__(self, tokenizer_json: str, tokenizer_config: Mapping[str, Any]):
    self.tokenizer_json, self.config = tokenizer_json, dict(tokenizer_config)
    self.hf = tokenizers.Tokenizer.from_str(tokenizer_json)
    self.hf.encode_special_tokens = True
    self.hf.no_padding()
    self.hf.no_truncation()
    named = {key: _token_text(self.config.get(f'{key}_token')) for key in ('bos', 'eos', 'pad')}
    ids = {key: None if token is None else self.hf.token_to_id(token) for key, token in named.items()}
    if ids['bos'] is None or ids['eos'] is None:
      raise ValueError(f'tokenizer_config.json names bos_token {named["bos"]!r} and eos_token {named["eos"]!r}; '
                       f'both must be tokens of tokenizer.json')
    self.bos_id, self.eos_id = ids['bos'], ids['eos']
    self.pad_id = ids['pad'] if ids['pad'] is not None else ids['eos']   # padding is masked: any id does

  @classmethod
  def from_dir(cls, path: str | pathlib.Path) -> 'Tokenizers':
    path = pathlib.Path(path)
    config_file = path / 'tokenizer_config.json'
    config = json.loads(config_file.read_text(encoding='utf-8')) if config_file.is_file() else {}
    if not isinstance(config, dict):
      raise ValueError(f'{config_file}: expected a JSON object')
    return cls((path / 'tokenizer.json').read_text(encoding='utf-8'), config)

  vocab_size = property(lambda self: self.hf.get_vocab_size(with_added_tokens=True))

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
            'tokenizer_config.json': json.dumps(self.config, indent=2, ensure_ascii=False) + '\n'}
