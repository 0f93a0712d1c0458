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
from luckystar.tokenizer import codecs
from luckystar.tokenizer import formats

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


# A tool call's arguments as our action writes them: an object as JSON (vLLM hands templates objects), JSON text
# as it came.
_ARGUMENTS = '(call.function.arguments if call.function.arguments is defined else {})'
_ARGUMENTS = f'({_ARGUMENTS} if {_ARGUMENTS} is string else {_ARGUMENTS} | tojson)'


def _numbered_calls(f: formats.ChatFormat) -> dict[str, str]:
  """Cohere's action and tool-turn Jinja: indented lists, call ids counted across the conversation
  (`ns.calls`; `ns.first` / `ns.count` the last action's calls, `ns.j` the result being written)."""
  lit = _literal
  id_open, name_open, parameters_open = lit('    {"tool_call_id": "'), lit('", "tool_name": '), lit(', "parameters": ')
  call = (f'{id_open} ~ (ns.first + loop.index0) ~ {name_open} ~ (call.function.name | tojson) ~ {parameters_open} ~ '
          f'{_ARGUMENTS} ~ "}}"')
  list_open, list_next, list_close = lit('[\n'), lit(',\n'), lit('\n]')
  # One entry as the format writes it, cut around its id and its result: the Jinja and Python layouts are one.
  entry = f.tool_result_text(['\0'], ['\1'])[2:-2]
  entry_head, entry_rest = entry.split('"\\u0001"')
  content_head, content_tail = entry_rest.split('{"content": "\\u0000"}')
  return dict(
      action=''.join([
          '{%- set ns.first = ns.calls -%}{%- set ns.count = message.tool_calls | length -%}',
          '{%- set ns.calls = ns.calls + ns.count -%}',
          f'{{{{- {list_open} -}}}}{{%- for call in message.tool_calls -%}}{{{{- {call} -}}}}',
          f'{{%- if not loop.last -%}}{{{{- {list_next} -}}}}{{%- endif -%}}{{%- endfor -%}}{{{{- {list_close} -}}}}']),
      our_action='{{ raise_exception("the cohere format numbers calls: give an assistant message tool_calls") }}',
      results_open=lit(f.tool_result[0] + '[\n'), results_close=lit('\n]' + f.tool_result[1]),
      separator=list_next,
      result=''.join([
          '{%- if ns.j < ns.count -%}{%- set id = ns.first + ns.j -%}',
          '{%- else -%}{%- set id = ns.calls -%}{%- set ns.calls = ns.calls + 1 -%}{%- endif -%}',
          f'{{{{- {lit(entry_head)} ~ (id | string | tojson) ~ {lit(content_head)} ~ '
          f'({{"content": text(message.content)}} | tojson) ~ {lit(content_tail)} -}}}}']))


def _our_calls(f: formats.ChatFormat) -> dict[str, str]:
  """Our action and tool-turn Jinja: one call as an object, several as a list; results a blank line apart."""
  lit = _literal
  name_open, parameters_open = lit('{"tool_name": '), lit(', "parameters": ')
  call = f'{name_open} ~ (call.function.name | tojson) ~ {parameters_open} ~ {_ARGUMENTS} ~ "}}"'
  several = lambda bracket: '{%- if message.tool_calls | length > 1 -%}{{- "' + bracket + '" -}}{%- endif -%}'
  act_open, act_close = map(lit, f.sections['action'])
  return dict(
      action=''.join([several('['), '{%- for call in message.tool_calls -%}{{- ' + call + ' -}}',
                      '{%- if not loop.last -%}{{- ", " -}}{%- endif -%}{%- endfor -%}', several(']')]),
      our_action=f'{{{{- {act_open} ~ message.action ~ {act_close} -}}}}',
      results_open='""', results_close='""', separator=lit('\n\n'), result='{{- text(message.content) -}}')


def _system_turn(f: formats.ChatFormat) -> str:
  """Jinja of the mode (`mode`, else `enable_thinking`, else the client default) and the system turn: the mode's
  preamble, the tools, a system message, a blank line apart; sets `rest` (the messages after it) and `ns`."""
  lit = _literal
  preambles = '{' + ', '.join(f'{lit(mode)}: {lit(text)}' for mode, text in tokenizer_lib.PREAMBLES.items()) + '}'
  schema = '(tool.function if tool.function is defined and tool.function is mapping else tool) | tojson'
  return ''.join([
      f'{{%- set preambles = {preambles} -%}}',
      '{%- if mode is defined and mode is not none -%}{%- set chosen = mode -%}',
      '{%- elif enable_thinking is defined and enable_thinking is not none -%}',
      '{%- set chosen = "reasoning" if enable_thinking else "concise" -%}',
      f'{{%- else -%}}{{%- set chosen = {lit(tokenizer_lib.CLIENT_DEFAULT_MODE)} -%}}{{%- endif -%}}',
      '{%- if chosen not in preambles -%}{{ raise_exception("unknown mode " ~ chosen ~ "; expected one of '
      + ', '.join(tokenizer_lib.MODES) + '") }}{%- endif -%}',
      '{%- set ns = namespace(head=[preambles[chosen]], schemas=[], calls=0, first=0, count=0, j=0) -%}',
      '{%- if tools -%}{%- for tool in tools -%}{%- set ns.schemas = ns.schemas + [' + schema + '] -%}{%- endfor -%}',
      f'{{%- set ns.head = ns.head + [{lit(formats.TOOLS_HEADER + chr(10))} ~ ns.schemas | join({lit(chr(10))})] -%}}',
      '{%- endif -%}',
      '{%- if messages and messages[0].role in ["system", "developer"] -%}',
      '{%- set ns.head = ns.head + [text(messages[0].content)] -%}{%- set rest = messages[1:] -%}',
      '{%- else -%}{%- set rest = messages -%}{%- endif -%}',
      f'{{{{- bos_token ~ {lit(f.start_of_turn + f.roles["system"])} ~ ns.head | join({lit(chr(10) * 2)}) ~ '
      f'{lit(f.end_of_turn)} -}}}}'])


def chat_template(chat_format: formats.ChatFormat = formats.LUCKYSTAR) -> str:
  """Jinja for `apply_chat_template(messages, tools=..., enable_thinking=..., add_generation_prompt=...)` that
  renders exactly what `Tokenizer.render` encodes in `chat_format` (tests/test_chat_templates.py checks it).

  messages in OpenAI's shape (as `tokenizer.from_openai` reads them): an assistant message's
  `reasoning_content`, `tool_calls` (arguments an object, as vLLM passes them, or JSON text in json.dumps'
  layout) and `content`, or our `thinking` / `action` / `response`; `tool` messages answer the last action's
  calls in order. The mode: `enable_thinking` (True: reasoning), or our `mode`; neither: concise, as
  luckystar.serve answers a request that names none."""
  f, lit = chat_format, _literal
  start, end = lit(f.start_of_turn), lit(f.end_of_turn)
  header = lambda name: lit(f.start_of_turn + f.roles[name])
  (think_open, think_close), (act_open, act_close), (resp_open, resp_close) = (
      tuple(map(lit, f.sections[name])) for name in formats.SECTIONS)
  calls = _numbered_calls(f) if f.numbered_calls else _our_calls(f)
  return ''.join([
      '{%- macro text(content) -%}{%- if content is string -%}{{- content -}}{%- else -%}',
      '{%- for part in content -%}{{- part.text -}}{%- endfor -%}{%- endif -%}{%- endmacro -%}',
      _system_turn(f),
      '{%- for message in rest -%}',
      f'{{%- if message.role == "assistant" -%}}{{{{- {header("assistant")} -}}}}',
      '{%- set thinking = message.reasoning_content if message.reasoning_content is defined and '
      'message.reasoning_content is not none else message.thinking -%}',
      f'{{%- if thinking is defined and thinking is not none -%}}{{{{- {think_open} ~ thinking ~ {think_close} -}}}}'
      '{%- endif -%}',
      '{%- set calls = message.tool_calls if message.tool_calls is defined and message.tool_calls else [] -%}',
      f'{{%- if calls -%}}{{{{- {act_open} -}}}}{calls["action"]}{{{{- {act_close} -}}}}',
      f'{{%- elif message.action is defined and message.action is not none -%}}{calls["our_action"]}{{%- endif -%}}',
      # An OpenAI client sends a call back with content "" or null: no response section either way.
      '{%- set response = message.content if message.content is defined and message.content is not none '
      'and not (calls and message.content == "") else message.response -%}',
      f'{{%- if response is defined and response is not none -%}}'
      f'{{{{- {resp_open} ~ text(response) ~ {resp_close} -}}}}{{%- endif -%}}{{{{- {end} -}}}}',
      f'{{%- elif message.role == "user" -%}}{{{{- {header("user")} ~ text(message.content) ~ {end} -}}}}',
      '{%- elif message.role == "tool" -%}',   # a run of tool messages is one turn
      '{%- if loop.first or loop.previtem.role != "tool" -%}',
      f'{{{{- {header(f.tool_role)} ~ {calls["results_open"]} -}}}}{{%- set ns.j = 0 -%}}',
      f'{{%- else -%}}{{{{- {calls["separator"]} -}}}}{{%- endif -%}}',
      calls['result'], '{%- set ns.j = ns.j + 1 -%}',
      '{%- if loop.last or loop.nextitem.role != "tool" -%}',
      f'{{{{- {calls["results_close"]} ~ {end} -}}}}{{%- set ns.count = 0 -%}}{{%- endif -%}}',
      '{%- elif message.role in ["system", "developer"] -%}',
      '{{ raise_exception("at most one system message, and only as the first message") }}',
      '{%- else -%}{{ raise_exception("unknown role " ~ message.role) }}{%- endif -%}',
      '{%- endfor -%}',
      f'{{%- if add_generation_prompt -%}}{{{{- {header("assistant")} -}}}}{{%- endif -%}}',
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
      'model_max_length': model_max_length, 'chat_template': chat_template(tokenizer.format),
  }
  return {'tokenizer.json': json.dumps(tokenizer_json(tokenizer), ensure_ascii=False) + '\n',
          'tokenizer_config.json': json.dumps(config, indent=2, ensure_ascii=False) + '\n'}


SOURCE_TEMPLATE = 'source'   # the name a checkpoint's own chat template keeps in the export


def export_files(tokenizer: tokenizer_lib.Tokenizer, model_max_length: int) -> dict[str, str | bytes]:
  """File name → content of an exported checkpoint's tokenizer: its files, with our chat template for its
  format (`chat_template`) in tokenizer_config.json and chat_template.jinja (transformers 5 reads the latter
  first; older versions the former), so a transformers or vLLM server renders what luckystar trained on.

  Ours (sentencepiece) also gets the transformers tokenizer files (`tokenizer_files`). A checkpoint's own
  template, where it differs, stays beside ours as `additional_chat_templates/source*.jinja`
  (`apply_chat_template(..., chat_template="source")`); renamed, so that no `tool_use` template of the source
  is picked over ours when a request has tools."""
  template = chat_template(tokenizer.format)
  files = tokenizer.files()
  if tokenizer.codec.backend == 'sentencepiece':
    files.update(tokenizer_files(tokenizer, model_max_length))
  else:
    config = dict(tokenizer.codec.config)
    own = config.pop('chat_template', None)
    if tokenizer.codec.chat_template is not None:
      own = tokenizer.codec.chat_template   # the one transformers would have used
    named = ({template['name']: template['template'] for template in own} if isinstance(own, list)
             else {'default': own} if own is not None else {})
    for name, text in named.items():
      if text != template:
        suffix = '' if name == 'default' else f'_{name}'
        files[f'additional_chat_templates/{SOURCE_TEMPLATE}{suffix}.jinja'] = text
    files['tokenizer_config.json'] = json.dumps({**config, 'chat_template': template}, indent=2,
                                                ensure_ascii=False) + '\n'
  files[codecs.CHAT_TEMPLATE_FILE] = template
  return files
