"""The evaluation core: every eval/* metric, computed from real greedy rollouts."""

import math

import jax

from luckystar import model, tokenizer as tokenizer_lib
from luckystar.evals import core


def test_evaluate_reports_every_metric_for_a_random_model():
  tok = tokenizer_lib.default()
  config = model.get('tiny', hidden_size=64, intermediate_size=128, num_layers=2,
                     layer_types=(model.SLIDING, model.FULL), sliding_window=16)
  params = model.init(config, jax.random.key(0))
  settings = core.Settings(tasks=('math', 'nl2sql', 'korean_mc'), per_task_language=2, max_new_tokens=12,
                           batch_size=8)
  metrics = core.evaluate(config, params, tok, settings)
  for mode in ('reasoning', 'concise'):
    for name in ('correctness', 'language_mismatch', 'response_length', 'thinking_rate', 'format_ok',
                 'unscorable', 'correctness/math', 'correctness/nl2sql/ko', 'correctness/en'):
      assert f'eval/{mode}/{name}' in metrics, (mode, name)
  assert metrics['eval/correctness'] == metrics['eval/reasoning/correctness']
  assert 'eval/correctness/korean_mc' in metrics and 'eval/correctness/math/ko' not in metrics
  # A random model cannot follow the format: nothing is correct, lengths are the budget.
  assert metrics['eval/reasoning/correctness'] == 0.0
  assert 0 < metrics['eval/reasoning/response_length'] <= 12
  assert math.isnan(metrics['eval/reasoning/language_mismatch']) or 0 <= metrics['eval/reasoning/language_mismatch'] <= 1


def test_the_eval_set_is_fixed_and_balanced():
  settings = core.Settings(tasks=('math', 'chat'), per_task_language=5)
  chosen = core.select(settings)
  assert chosen == core.select(settings)
  assert len(chosen) == 20 and {e.split for e in chosen} == {'heldout'}
