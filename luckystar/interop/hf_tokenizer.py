"""Our sentencepiece tokenizer and chat template as transformers tokenizer files (docs/models.md,
docs/int4_and_export.md).

`AutoTokenizer.from_pretrained(dir)` then encodes exactly as `luckystar.tokenizer.Tokenizer.encode`
and `apply_chat_template(messages, mode=...)` produces exactly `Tokenizer.render`'s ids, so a server
of the exported checkpoint (transformers, vLLM) speaks our chat format.

tokenizer.json is a `tokenizers` BPE model built from the sentencepiece model's own pieces and scores
(plain JSON; writing it needs neither transformers nor tokenizers): sentencepiece's BPE merges, at
each step, the adjacent pair whose joined piece scores highest, so ranking every (left, right) split of
a piece by that piece's score gives the same merges; spaces become '▁' (identity normalisation, no
dummy prefix), characters outside the vocabulary fall back to UTF-8 byte pieces, '\\n' is an atomic
user-defined piece, and our special tokens are special added tokens (split out of rendered chat text).

One difference by design: transformers matches special-token *strings* in any text it encodes, so a
user who types "<|END_OF_TURN|>" gets the special token there, where `Tokenizer.encode` gives plain
text pieces. The chat template renders messages verbatim, so this matters only for such inputs.
"""

import json
from typing import Any

from sentencepiece import sentencepiece_model_pb2

from luckystar import tokenizer as tokenizer_lib

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 1, 2, 3, 4, 6   # sentencepiece ModelProto.SentencePiece.Type


def _model_proto(tokenizer: tokenizer_lib.Tokenizer) -> Any:
  proto = sentencepiece_model_pb2.ModelProto.FromString(tokenizer.model_proto)
  trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
  problems = []
  if trainer.model_type != sentencepiece_model_pb2.TrainerSpec.BPE:
    problems.append('model_type is not BPE')
  if normalizer.add_dummy_prefix or normalizer.remove_extra_whitespaces or normalizer.precompiled_charsmap:
    problems.append('normalisation is not identity (no dummy prefix, whitespace kept)')
  if not trainer.byte_fallback or trainer.treat_whitespace_as_suffix:
    problems.append('byte_fallback is off or whitespace is a suffix')
  if problems:
    raise ValueError(f'cannot export this sentencepiece model as tokenizer.json: {"; ".join(problems)}; '
                     f'export models trained by `python -m luckystar.data.corpus`')
  return proto


def tokenizer_json(tokenizer: tokenizer_lib.Tokenizer) -> dict[str, Any]:
  """The `tokenizers` serialisation (tokenizer.json) of our sentencepiece BPE model."""
  proto = _model_proto(tokenizer)
  vocab = {piece.piece: i for i, piece in enumerate(proto.pieces)}
  normal = {piece.piece: (piece.score, i) for i, piece in enumerate(proto.pieces) if piece.type == _NORMAL}
  merges = []
  for piece, (score, _) in normal.items():
    for cut in range(1, len(piece)):
      left, right = piece[:cut], piece[cut:]
      if left in normal and right in normal:
        merges.append((-score, vocab[left], vocab[right], left, right))
  merges.sort()
  added = []
  for i, piece in enumerate(proto.pieces):
    if piece.type in (_CONTROL, _UNKNOWN, _USER_DEFINED):
      special = piece.type != _USER_DEFINED
      added.append({'id': i, 'content': piece.piece, 'single_word': False, 'lstrip': False, 'rstrip': False,
                    'normalized': False, 'special': special})
  unk = proto.pieces[tokenizer.sp.unk_id()].piece
  return {
      'version': '1.0', 'truncation': None, 'padding': None, 'added_tokens': added,
      'normalizer': {'type': 'Replace', 'pattern': {'String': ' '}, 'content': '▁'},
      'pre_tokenizer': None,
      'post_processor': None,
      'decoder': {'type': 'Sequence', 'decoders': [
          {'type': 'Replace', 'pattern': {'String': '▁'}, 'content': ' '},
          {'type': 'ByteFallback'}, {'type': 'Fuse'}]},
      'model': {'type': 'BPE', 'dropout': None, 'unk_token': unk, 'continuing_subword_prefix': None,
                'end_of_word_suffix': None, 'fuse_unk': True, 'byte_fallback': True, 'ignore_merges': False,
                'vocab': vocab, 'merges': [[left, right] for *_, left, right in merges]},
  }


def _literal(text: str) -> str:
  return json.dumps(text, ensure_ascii=False)   # a Jinja string literal


def chat_template() -> str:
  """Jinja for `apply_chat_template(messages, mode='reasoning' | 'concise', add_generation_prompt=...)`,
  rendering exactly what `Tokenizer.render` encodes. Assistant messages carry `thinking` / `action` /
  `response` (a plain `content` is read as the response)."""
  t = tokenizer_lib
  start, end = _literal(t.START_OF_TURN), _literal(t.END_OF_TURN)
  role = lambda name: _literal(t.ROLE_TOKENS[name])
  preambles = '{' + ', '.join(f'{_literal(mode)}: {_literal(text)}' for mode, text in t.PREAMBLES.items()) + '}'
  sections = ''.join(
      f'{{%- if message.{name} is defined and message.{name} is not none -%}}'
      f'{{{{ {_literal(open_)} ~ message.{name} ~ {_literal(close)} }}}}{{%- endif -%}}'
      for name, (open_, close) in t.SECTION_TOKENS.items() if name != 'response')
  response_open, response_close = (_literal(s) for s in t.SECTION_TOKENS['response'])
  return ''.join([
      f'{{%- set preambles = {preambles} -%}}',
      '{%- set mode = mode if mode is defined else "reasoning" -%}',
      '{%- if mode not in preambles -%}{{ raise_exception("unknown mode " ~ mode ~ "; expected one of '
      + ', '.join(t.MODES) + '") }}{%- endif -%}',
      '{%- if messages and messages[0].role == "system" -%}',
      '{%- set system = preambles[mode] ~ "\\n\\n" ~ messages[0].content -%}{%- set rest = messages[1:] -%}',
      '{%- else -%}{%- set system = preambles[mode] -%}{%- set rest = messages -%}{%- endif -%}',
      f'{{{{ bos_token ~ {start} ~ {role("system")} ~ system ~ {end} }}}}',
      '{%- for message in rest -%}',
      '{%- if message.role == "assistant" -%}',
      f'{{{{ {start} ~ {role("assistant")} }}}}',
      sections,
      '{%- set response = message.response if message.response is defined else message.content -%}',
      f'{{%- if response is defined and response is not none -%}}'
      f'{{{{ {response_open} ~ response ~ {response_close} }}}}{{%- endif -%}}',
      f'{{{{ {end} }}}}',
      '{%- elif message.role == "user" or message.role == "tool" -%}',
      f'{{{{ {start} ~ ({role("user")} if message.role == "user" else {role("tool")}) ~ message.content ~ {end} }}}}',
      '{%- elif message.role == "system" -%}',
      '{{ raise_exception("at most one system message, and only as the first message") }}',
      '{%- else -%}{{ raise_exception("unknown role " ~ message.role) }}{%- endif -%}',
      '{%- endfor -%}',
      f'{{%- if add_generation_prompt -%}}{{{{ {start} ~ {role("assistant")} }}}}{{%- endif -%}}',
  ])


def tokenizer_files(tokenizer: tokenizer_lib.Tokenizer, model_max_length: int) -> dict[str, str]:
  """File name → text: tokenizer.json and tokenizer_config.json (with the chat template)."""
  pieces = tokenizer.sp
  special = [token for token in tokenizer_lib.SPECIAL_TOKENS]
  config = {
      'tokenizer_class': 'PreTrainedTokenizerFast',
      'bos_token': pieces.id_to_piece(tokenizer.bos_id), 'eos_token': pieces.id_to_piece(tokenizer.eos_id),
      'unk_token': pieces.id_to_piece(pieces.unk_id()), 'pad_token': pieces.id_to_piece(tokenizer.pad_id),
      'additional_special_tokens': special, 'extra_special_tokens': special,
      'add_bos_token': False, 'add_eos_token': False, 'clean_up_tokenization_spaces': False,
      'model_max_length': model_max_length, 'chat_template': chat_template(),
  }
  return {'tokenizer.json': json.dumps(tokenizer_json(tokenizer), ensure_ascii=False) + '\n',
          'tokenizer_config.json': json.dumps(config, indent=2, ensure_ascii=False) + '\n'}
