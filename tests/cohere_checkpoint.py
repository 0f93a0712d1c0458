"""A Cohere-format checkpoint built offline, as a user's own Command R7B-style directory would be: small random
Cohere2 weights written by transformers, and a `tokenizers` byte-level BPE trained on our corpus with Cohere's
special tokens and its own chat template in chat_template.jinja, as transformers 5 saves one. Its vocabulary (VOCAB_SIZE) is neither 8000 nor
a multiple of 8."""

import json
import pathlib

import numpy as np

VOCAB_SIZE = 3001
BOS, EOS, PAD = '<BOS_TOKEN>', '<|END_OF_TURN_TOKEN|>', '<PAD>'
SPECIAL_TOKENS = (
    PAD, '<UNK>', '<CLS>', '<SEP>', '<MASK_TOKEN>', BOS, '<EOS_TOKEN>', '<EOP_TOKEN>',
    '<|START_OF_TURN_TOKEN|>', EOS, '<|USER_TOKEN|>', '<|CHATBOT_TOKEN|>', '<|SYSTEM_TOKEN|>',
    '<|START_THINKING|>', '<|END_THINKING|>', '<|START_ACTION|>', '<|END_ACTION|>',
    '<|START_RESPONSE|>', '<|END_RESPONSE|>', '<|START_TOOL_RESULT|>', '<|END_TOOL_RESULT|>')

# The checkpoint's own template, a simplified Cohere one for OpenAI-style messages (no preamble, compact JSON):
# an export keeps it beside ours (luckystar.interop.hf_tokenizer.export_files).
CHAT_TEMPLATE = ''.join([
    '{{- bos_token -}}',
    '{%- if messages and messages[0].role == "system" -%}{%- set system = messages[0].content -%}'
    '{%- set rest = messages[1:] -%}{%- else -%}{%- set system = "" -%}{%- set rest = messages -%}{%- endif -%}',
    '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{{- system -}}<|END_OF_TURN_TOKEN|>',
    '{%- for message in rest -%}',
    '{%- if message.role == "user" -%}<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{{- message.content -}}<|END_OF_TURN_TOKEN|>',
    '{%- elif message.role == "assistant" -%}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>',
    '{%- if message.reasoning_content -%}<|START_THINKING|>{{- message.reasoning_content -}}<|END_THINKING|>{%- endif -%}',
    '{%- if message.tool_calls -%}<|START_ACTION|>[',
    '{%- for call in message.tool_calls -%}{"tool_call_id": "{{- loop.index0 -}}", "tool_name": '
    '{{- " " ~ (call.function.name | tojson) -}}, "parameters": {{ call.function.arguments | tojson -}} }'
    '{%- if not loop.last -%}, {% endif -%}{%- endfor -%}]<|END_ACTION|>{%- endif -%}',
    '{%- if message.content -%}<|START_RESPONSE|>{{- message.content -}}<|END_RESPONSE|>{%- endif -%}',
    '<|END_OF_TURN_TOKEN|>',
    '{%- elif message.role == "tool" -%}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>'
    '[{"tool_call_id": "0", "results": {"0": {{ message.content | tojson -}} }, "is_error": null}]'
    '<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>',
    '{%- endif -%}{%- endfor -%}',
    '{%- if add_generation_prompt -%}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{%- endif -%}',
])


def tokenizer_files(num_lines: int = 6000, special_tokens: tuple[str, ...] = SPECIAL_TOKENS) -> dict[str, str]:
  """tokenizer.json (byte-level BPE of VOCAB_SIZE pieces over our corpus), tokenizer_config.json and
  chat_template.jinja."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers

  from luckystar.data import corpus
  tokenizer = tokenizers.Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(special_tokens), show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tokenizer.train_from_iterator(corpus.tokenizer_corpus(seed=0, num_lines=num_lines), trainer=trainer)
  assert tokenizer.get_vocab_size() == VOCAB_SIZE, tokenizer.get_vocab_size()
  config = {'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': BOS, 'eos_token': EOS, 'pad_token': PAD,
            'unk_token': None, 'add_bos_token': False, 'add_eos_token': False,
            'clean_up_tokenization_spaces': False, 'model_max_length': 2048}
  return {'tokenizer.json': tokenizer.to_str(), 'tokenizer_config.json': json.dumps(config, indent=2) + '\n',
          'chat_template.jinja': CHAT_TEMPLATE}


def build(directory: pathlib.Path, *, seed: int = 0, dtype: str = 'bfloat16') -> pathlib.Path:
  """The checkpoint in `directory` (created): transformers' Cohere2ForCausalLM with random weights spread
  enough for logits to differ (saved in `dtype`), bos/eos/pad ids of the tokenizer, and its tokenizer files."""
  import torch
  import transformers

  files = tokenizer_files()
  vocab = json.loads(files['tokenizer.json'])['model']['vocab'] | {
      t['content']: t['id'] for t in json.loads(files['tokenizer.json'])['added_tokens']}
  config = transformers.Cohere2Config(
      vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
      num_key_value_heads=2, head_dim=32, max_position_embeddings=2048, sliding_window=32,
      layer_types=['sliding_attention'] * 3 + ['full_attention'], logit_scale=0.25, tie_word_embeddings=True,
      bos_token_id=vocab[BOS], eos_token_id=vocab[EOS], pad_token_id=vocab[PAD])
  torch.manual_seed(seed)
  model = transformers.Cohere2ForCausalLM(config)
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      scale = 1.0 if 'embed' in name else 0.15
      parameter.copy_(1.0 + 0.2 * torch.randn(parameter.shape, generator=generator) if 'norm' in name
                      else scale * torch.randn(parameter.shape, generator=generator))
  model.to(getattr(torch, dtype)).save_pretrained(directory, safe_serialization=True)
  for name, text in files.items():
    (directory / name).write_text(text, encoding='utf-8')
  return directory


def greedy_agrees(ours: np.ndarray, theirs: np.ndarray, margin: float = 1e-3) -> bool:
  """The argmax of ours equals theirs wherever their top-2 margin exceeds `margin` (logits [..., V])."""
  top2 = np.sort(theirs, axis=-1)[..., -2:]
  decided = top2[..., 1] - top2[..., 0] > margin
  return bool(np.all(ours.argmax(-1)[decided] == theirs.argmax(-1)[decided]))
