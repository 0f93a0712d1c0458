"""The rollout's AOT memory plan on the tiny model: the cache and params it sizes are what XLA takes."""

from luckystar import aot_plan, model


def test_rollout_plan_sizes_match_the_compiled_arguments():
  config = model.get('tiny', param_dtype='bfloat16', dtype='bfloat16')
  init, admit, decode = aot_plan.rollout_plans(config, (1, 4, 2), rows=8, prompt_len=16, max_new_tokens=48)
  # [groups, rows, kv_heads, slots, head_dim] k and v: rows over 4 devices, kv heads over 2
  groups, period = config.num_layers // config.layer_period, config.layer_period
  columns = sum(min(config.sliding_window, 64) if t == model.SLIDING else 64 for t in config.layer_types[:period])
  cache = 2 * groups * (8 // 4) * (config.num_kv_heads // 2) * columns * config.head_dim * 2 + (8 // 4) * 4   # + index
  assert decode.cache_bytes == cache
  logits = 8 * config.vocab_size * 4   # decode's [rows, vocab] float32 from admit, at most whole
  for plan in (admit, decode):   # the params and the cache are arguments; the host's inputs add little
    assert plan.params_bytes + plan.cache_bytes <= plan.argument_bytes < plan.params_bytes + cache + logits + 2**12
  assert admit.alias_bytes >= cache and decode.alias_bytes >= cache   # both donate the cache
  assert init.argument_bytes == 0 and cache <= init.output_bytes < cache + 2**10   # made sharded, never whole
