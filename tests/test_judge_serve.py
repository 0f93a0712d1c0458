"""The LLM judge end to end: `luckystar.serve` on 127.0.0.1 judges what no rule can verify in the rejection-sampling
and RLVR smoke runs; its verdicts are cached in the workdir, and once the server is stopped the run counts its
failures and finishes."""

import json

import pytest

import data_files
import serve_process
from luckystar.data import suites
from luckystar.engine import checkpoint, judging
from luckystar.stages import rejection_sampling, rlvr


@pytest.fixture(scope='module')
def unverifiable(tmp_path_factory):
  """Bundled math questions `tiny-sft` answers ("The answer is 34."), with golds in words no rule parses
  (`rewards.math`: a prose word of 3+ letters makes a gold unscorable), so every answer goes to the judge."""
  examples = [e for e in suites.load('math', 'heldout') if e.difficulty == 1][:4]
  path = tmp_path_factory.mktemp('data') / 'unverifiable.jsonl'
  path.write_text(''.join(json.dumps({'problem': e.prompt, 'answer': f'{e.answer} items in all'}, ensure_ascii=False)
                          + '\n' for e in examples), encoding='utf-8')
  return f'math_jsonl:{path}'


def _judge(base_url: str) -> dict:
  return dict(backend='http', base_url=base_url, model='tiny-sft', retries=0, backoff_s=0.0, timeout_s=30.0)


def _rows(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


def test_a_served_model_judges_rejection_sampling_and_rlvr_until_it_stops(unverifiable, tmp_path):
  server = serve_process.start_server('tiny-sft')
  try:
    judge = _judge(server.base_url)
    config = data_files.smoke_config('rejection_sampling', **{
        'init_from': 'tiny-sft', 'rejection_sampling.sources': unverifiable, 'sampling.max_new_tokens': 128,
        'rejection_sampling.samples_per_prompt': 2, 'rejection_sampling.max_prompts': 2, 'judge': judge})
    rejection_sampling.run(config, str(tmp_path / 'rs'))
    stats = json.loads((tmp_path / 'rs' / rejection_sampling.STATS_FILE).read_text())
    assert stats['judge/calls'] >= 4 and stats['judge/failures'] == 0
    assert stats['groups']['all']['dropped']['unscorable'] < stats['groups']['all']['samples']   # the judge decided

    changes = {'init_from': 'tiny-sft', 'rlvr.sources': unverifiable, 'rlvr.eval_sources': unverifiable,
               'rlvr.selection_prompts': {'math': 4}, 'rlvr.selection_samples': 2, 'rlvr.samples_per_prompt': 2,
               'rlvr.select_pass_rate': (0.0, 1.0), 'rlvr.eval_prompts': 4, 'rlvr.eval_samples': 0,
               'sampling.max_new_tokens': 128, 'total_steps': 2, 'checkpoint_every': 1, 'eval_every': 0,
               'judge': judge}
    rlvr.run(data_files.smoke_config('rlvr', **changes), str(tmp_path / 'rlvr'))
  finally:
    server.stop()   # at step 2, a fixed point of the run
  assert checkpoint.latest_step(tmp_path / 'rlvr') == 2
  before = _rows(tmp_path / 'rlvr')
  assert before[-1]['judge/calls'] >= 4 and before[-1]['judge/cache_hits'] >= 1 and before[-1]['judge/failures'] == 0
  assert (tmp_path / 'rlvr' / judging.CACHE_FILE).is_file()

  # The same run resumed for one more step with the server gone. tiny-sft repeats its answers, which the cache
  # would all answer, so the cache goes first: every verdict now fails, is counted, and the step and the final
  # eval still happen.
  (tmp_path / 'rlvr' / judging.CACHE_FILE).unlink()
  rlvr.run(data_files.smoke_config('rlvr', **{**changes, 'total_steps': 3}), str(tmp_path / 'rlvr'))
  after = _rows(tmp_path / 'rlvr')[len(before):]
  assert checkpoint.latest_step(tmp_path / 'rlvr') == 3
  step3 = next(row for row in after if 'judge/calls' in row)
  assert step3['judge/failures'] >= 1 and step3['judge/requests'] >= 1
  assert any(key.startswith('eval/') for row in after for key in row)
