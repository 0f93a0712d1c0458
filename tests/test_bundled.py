"""The bundled models ship inside the package, load offline and behave as docs/data.md says; save_hf
writes what transformers and `luckystar.load` read back."""

import json

import jax
import numpy as np
import pytest

import luckystar
from luckystar import api, model, quant
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import suites
from luckystar.interop import hf

SHIPPED = ('tiny-base', 'tiny-sft', 'tiny-rlvr', 'tiny-teacher')
INT4 = ('tiny-teacher',)   # shipped in int4 to keep within the size budget (experiments/bundled_models.py)


@pytest.mark.fast
def test_everything_shipped_fits_the_size_budget():
  files = [f for f in api.BUNDLED_DIR.parent.rglob('*') if f.is_file()]
  assert sum(f.stat().st_size for f in files) <= 40 * 2**20


@pytest.mark.fast
@pytest.mark.parametrize('name', SHIPPED)
def test_bundled_models_load_offline_with_their_provenance(name):
  loaded = luckystar.load(name)
  assert loaded.tokenizer is not None and loaded.tokenizer.model_proto == tokenizer_lib.default().model_proto
  assert loaded.config.layer_types == model.get('tiny').layer_types
  card = json.loads((api.BUNDLED_DIR / name / 'luckystar.json').read_text())
  assert card['recipe'].startswith('python -m luckystar.main --config=configs/')
  assert card['heldout']['metrics']['eval/concise/correctness'] > 0
  weights = hf.read_safetensors(api.BUNDLED_DIR / name)
  if name in INT4:   # packed int4 Linears with bf16 scales; the rest bf16
    assert quant.is_served(loaded.config) and {w.dtype.name for w in weights.values()} == {'bfloat16', 'int32'}
  else:
    assert sum(x.size for x in jax.tree.leaves(loaded.params)) == model.param_count(model.get('tiny'))
    assert {w.dtype.name for w in weights.values()} == {'bfloat16'}


@pytest.fixture(scope='module')
def sft_replies():
  sft = luckystar.load('tiny-sft')
  prompts = [e.prompt for task in ('math', 'korean_mc', 'chat') for e in suites.load(task, 'heldout')[:3]]
  return (sft.generate(prompts, mode='reasoning', max_new_tokens=96),
          sft.generate(prompts, mode='concise', max_new_tokens=48))


def test_tiny_sft_thinks_in_reasoning_mode(sft_replies):
  reasoning, _ = sft_replies
  assert sum(g.thinking is not None for g in reasoning) >= len(reasoning) - 1


def test_tiny_sft_does_not_think_in_concise_mode(sft_replies):
  _, concise = sft_replies
  assert not any(g.thinking is not None for g in concise)


def test_tiny_sft_solves_math_with_the_calculator_and_tiny_base_does_not():
  """Reasoning-mode math: set the problem up, call the calculator, answer from its result (docs/models.md,
  "Bundled models": 97.5% vs 2.5% of the first 100 held-out prompts per language when built)."""
  from luckystar.rewards import reward
  examples = suites.load('math', 'heldout')[:12]
  correct = {}
  for name in ('tiny-sft', 'tiny-base'):
    replies = luckystar.load(name).generate([e.prompt for e in examples], mode='reasoning', max_new_tokens=160)
    correct[name] = sum(bool(reward.is_correct(e, r.rollout.final_turn)) for e, r in zip(examples, replies))
    if name == 'tiny-sft':
      assert all('"calculator"' in r.actions[0] for r in replies if r.actions)
  assert correct['tiny-sft'] >= 10 and correct['tiny-base'] <= 2, correct


def test_tiny_base_is_a_concise_chat_model():
  """Held-out knowledge questions (facts taught in other words; arithmetic left out): the shipped
  `tiny-base` answered 17 of 21 English and 23 of 44 overall when it was built."""
  base = luckystar.load('tiny-base')
  examples = [e for e in suites.load('chat', 'heldout') if e.meta['kind'] not in ('sum', 'minutes')]
  replies = base.generate([e.prompt for e in examples], mode='concise', max_new_tokens=24)
  correct = [e.answer in r.response for e, r in zip(examples, replies)]
  english = [ok for ok, e in zip(correct, examples) if e.language == 'en']
  assert all(r.thinking is None for r in replies)
  assert sum(english) >= 0.6 * len(english) and sum(correct) >= 0.4 * len(correct)


def test_save_hf_round_trips_and_transformers_reads_it(tmp_path):
  transformers = pytest.importorskip('transformers')
  torch = pytest.importorskip('torch')
  config = model.get('tiny', hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, num_layers=4,
                     sliding_window=8)
  params = model.init(config, jax.random.key(1))
  ours = luckystar.Model(config, params, tokenizer_lib.default())
  ours.save_hf(tmp_path / 'fp32')
  back = luckystar.load(tmp_path / 'fp32')
  assert back.config == config and back.tokenizer is not None
  jax.tree.map(np.testing.assert_array_equal, back.params, params)
  with pytest.raises(FileExistsError, match='fp32'):
    ours.save_hf(tmp_path / 'fp32')

  ids = np.random.default_rng(0).integers(0, config.vocab_size, (2, 3 * config.sliding_window))
  theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'fp32', torch_dtype=torch.float32)
  with torch.no_grad():
    expected = theirs(torch.as_tensor(ids)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours.logits(ids)), expected, atol=1e-4)

  ours.save_hf(tmp_path / 'bf16', dtype='bfloat16')
  assert {w.dtype.name for w in hf.read_safetensors(tmp_path / 'bf16').values()} == {'bfloat16'}
  generation = json.loads((tmp_path / 'bf16' / 'generation_config.json').read_text())
  tok = ours.tokenizer   # a server stops at the end of a turn and at a tool call (END_ACTION), for the caller to run
  assert generation['eos_token_id'] == [tok.eos_id, tok.end_of_turn_id, tok.end_of_action_id]


def test_tiny_teacher_writes_execute_sql_calls_on_databases_it_never_saw():
  teacher = luckystar.load('tiny-teacher')
  for question in suites.load('nl2sql', 'heldout')[:4]:
    out = teacher.generate(question.prompt, mode='reasoning', system=question.system,
                           tools=question.meta['db_path'], max_new_tokens=160)
    assert out.actions and '"execute_sql"' in out.actions[0] and out.rollout.tool_results, out.actions
