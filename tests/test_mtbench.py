"""MT-Bench scoring (engine.mtbench, Judge.rate): exact averages under a stub judge, the right FastChat prompt per
turn and category, counted failures, rating parsing, and `luckystar.serve` rating real questions on 127.0.0.1."""

import json
import re

import pytest

import serve_process
from luckystar import errors
from luckystar import tokenizer as tokenizer_lib
from luckystar.data import benchmarks
from luckystar.engine import evals, mtbench
from luckystar.rewards import judge as judge_lib

fast = pytest.mark.fast

# Shaped like FastChat's judge_prompts.jsonl, short, each naming itself so a test sees which one was used.
PROMPTS = {
    'single-v1': {'system_prompt': 'sys general', 'prompt_template': '[single-v1]\nQ: {question}\nA: {answer}'},
    'single-math-v1': {'system_prompt': 'sys math', 'prompt_template':
                       '[single-math-v1]\nQ: {question}\nREF: {ref_answer_1}\nA: {answer}'},
    'single-v1-multi-turn': {'system_prompt': 'sys general 2', 'prompt_template':
                             '[single-v1-multi-turn]\nQ1: {question_1}\nA1: {answer_1}\nQ2: {question_2}\n'
                             'A2: {answer_2}'},
    'single-math-v1-multi-turn': {'system_prompt': 'sys math 2', 'prompt_template':
                                  '[single-math-v1-multi-turn]\nQ1: {question_1}\nREF1: {ref_answer_1}\n'
                                  'Q2: {question_2}\nREF2: {ref_answer_2}\nA1: {answer_1}\nA2: {answer_2}'},
}
CATEGORIES = {1: 'writing', 2: 'math', 3: 'reasoning', 4: 'coding', 5: 'humanities'}
QUESTIONS = [{'id': qid, 'category': category, 'turns': [f'question {qid}.1', f'question {qid}.2'],
              'reference': [f'reference {qid}.1', f'reference {qid}.2'] if category in ('math', 'reasoning', 'coding')
              else None} for qid, category in CATEGORIES.items()]
# (question, turn) → what the stub judge says of that answer: a rating, 'junk' (no rating) or 'down' (no reply)
VERDICTS = {(1, 1): 8, (1, 2): 6, (2, 1): 3, (2, 2): 'junk', (3, 1): 5, (3, 2): 7, (4, 1): 'down', (4, 2): 4,
            (5, 1): 10, (5, 2): 1}


class StubJudge(judge_lib.Judge):
  """Rates the answer its prompt shows last ("answer Q.T", the fake model's) by VERDICTS, recording each request."""

  def __init__(self):
    super().__init__()
    self.requests = []

  def _complete(self, prompt, *, system=None, choices=judge_lib.VERDICT_CHOICES):
    self.requests.append((system, prompt, tuple(choices)))
    verdict = VERDICTS[tuple(map(int, re.findall(r'answer (\d+)\.(\d)', prompt)[-1]))]
    if verdict == 'down':
      raise judge_lib.JudgeError('the stub server is down', 'connection')
    return 'It rambles.' if verdict == 'junk' else f'Fine work. Rating: [[{verdict}]]'


def _fake_model(seen):
  """A text model answering "question Q.T" with "answer Q.T" (reasoning mode: after a thinking section)."""
  (think, end_think), (respond, end_respond) = (tokenizer_lib.SECTION_TOKENS[s] for s in ('thinking', 'response'))
  def model(messages, mode):
    seen.append(messages)
    answer = messages[-1]['content'].replace('question', 'answer')
    return f'{think}Let me think.{end_think}{respond}{answer}{end_respond}' if mode == 'reasoning' else answer
  return model


@fast
@pytest.mark.parametrize('mode', ['concise', 'reasoning'])
def test_stub_ratings_average_exactly_and_failures_are_counted_and_left_out(mode):
  seen, judge = [], StubJudge()
  respond = evals.text_respond(_fake_model(seen), tokenizer_lib.default())
  figures = mtbench.evaluate(respond, judge, mode, questions=QUESTIONS, prompts=PROMPTS)
  assert figures == {
      'score': 44 / 8, 'score/turn_1': (8 + 3 + 5 + 10) / 4, 'score/turn_2': (6 + 7 + 4 + 1) / 4,
      'score/coding': 4, 'score/humanities': 5.5, 'score/math': 3, 'score/reasoning': 6, 'score/writing': 7,
      'judged': 8, 'judge_failures': 2, 'examples': 10}
  assert judge.stats.failures == 2 and judge.failure_reasons == {'not_a_rating': 1, 'connection': 1}

  # The second turn is a conversation: the first question, the model's own first answer (its response section,
  # not its thinking), the second question.
  assert seen[5:] == [[{'role': 'user', 'content': f'question {q}.1'},
                       {'role': 'assistant', 'response': f'answer {q}.1'},
                       {'role': 'user', 'content': f'question {q}.2'}] for q in CATEGORIES]
  for system, prompt, choices in judge.requests:
    name = re.match(r'\[(.+)\]', prompt)[1]
    qid = int(re.search(r'answer (\d+)', prompt)[1])
    turn = 2 if 'multi-turn' in name else 1
    with_reference = CATEGORIES[qid] in ('math', 'reasoning', 'coding')
    assert name == mtbench.PROMPT_NAMES[turn, with_reference] and system == PROMPTS[name]['system_prompt']
    assert ('reference' in prompt) == with_reference and 'Let me think' not in prompt
    assert choices == judge_lib.RATING_CHOICES
    if turn == 2:   # the whole conversation, rating the second answer
      assert f'answer {qid}.1' in prompt and f'answer {qid}.2' in prompt
      assert (f'reference {qid}.2' in prompt) == with_reference

  # A rerun answers from the cache; the failures are asked again.
  asked = len(judge.requests)
  assert mtbench.evaluate(respond, judge, mode, questions=QUESTIONS, prompts=PROMPTS) == figures
  assert len(judge.requests) == asked + 2 and judge.stats.cache_hits == 8


@fast
def test_max_examples_and_a_missing_judge():
  respond = evals.text_respond(_fake_model([]), tokenizer_lib.default())
  figures = mtbench.evaluate(respond, StubJudge(), 'concise', questions=QUESTIONS, prompts=PROMPTS, max_examples=1)
  assert figures['examples'] == 2 and figures['score'] == 7 and 'score/math' not in figures
  with pytest.raises(errors.UserError, match=r'config\.judge\.backend=http .*config\.judge\.base_url'):
    mtbench.evaluate(respond, None, 'concise', questions=QUESTIONS, prompts=PROMPTS)


@fast
def test_examples_and_the_text_the_judge_reads():
  first = mtbench.examples(QUESTIONS, 1)
  assert [(e.task, e.language, e.prompt, e.meta['category']) for e in first[:2]] == [
      ('chat', 'en', 'question 1.1', 'writing'), ('chat', 'en', 'question 2.1', 'math')]
  assert 'history' not in first[0].meta
  second = mtbench.examples(QUESTIONS, 2, [f'a{n}' for n in range(5)])
  assert second[1].prompt == 'question 2.2' and second[1].meta['history'][1] == {'role': 'assistant', 'response': 'a1'}
  with pytest.raises(ValueError, match='first answer'):
    mtbench.examples(QUESTIONS, 2)
  (think, end_think), (respond, end_respond) = (tokenizer_lib.SECTION_TOKENS[s] for s in ('thinking', 'response'))
  reply = lambda text: evals.TextReply(evals.parse_text(text)[0], [], None)
  assert mtbench.answer_text(reply(f'{think}hmm{end_think}{respond}The answer.{end_respond}')) == 'The answer.'
  assert mtbench.answer_text(reply(f'{think}cut off while thinking')) == 'cut off while thinking'
  assert mtbench.answer_text(reply('plain text')) == 'plain text'


@fast
def test_the_shipped_prompts_render_for_every_question():
  prompts = benchmarks.judge_prompts()
  for question in benchmarks.mtbench():
    for turn in mtbench.TURNS:
      system, prompt = mtbench.judge_prompt(question, turn, ('ANSWER ONE', 'ANSWER TWO'), prompts)
      assert system and '[[rating]]' in system + prompt and question['turns'][turn - 1] in prompt
      assert ('ANSWER TWO' in prompt) == (turn == 2) and 'ANSWER ONE' in prompt
      if question['category'] in mtbench.NEED_REF_CATEGORIES:
        assert question['reference'][turn - 1] in prompt
      else:
        assert 'Reference' not in prompt


# ---- Judge.rate ----------------------------------------------------------------------------------------------

@fast
@pytest.mark.parametrize('text, rating', [
    ('[[7]]', 7), ('Rating: [[10]]', 10), ('[8]', 8), ('no rating here', None), (None, None),
    ('As asked, "Rating: [[5]]". The answer is weak. Rating: [[3]]', 3),   # the last counts, not an echo
    ('[[2]] and [9]', 2),            # a double-bracket rating beats the backup pattern
    ('<think>maybe [[9]]</think>Rating: [[6]]', 6), ('[[0]]', None), ('[[11]]', None), ('[[8.5]]', None),
    ('[[07]]', 7), ('[[' + '9' * 5000 + ']]', None)])
def test_rating_parsing(text, rating):
  assert judge_lib.parse_rating(text) == rating


@fast
def test_a_model_judge_rates_with_the_system_prompt_first_and_caches_ratings_beside_verdicts():
  prompts = []
  replies = {'rate me': 'Good. Rating: [[9]]', 'again': 'I cannot say.'}
  judge = judge_lib.ModelJudge(lambda text: prompts.append(text) or replies.get(text.split('\n\n')[-1], 'YES'))
  assert judge.rate('You judge.', 'rate me') == 9 and prompts == ['You judge.\n\nrate me']
  assert judge.rate('You judge.', 'rate me') == 9 and judge.stats.cache_hits == 1
  assert judge.rate('You judge.', 'again') is None and judge.failure_reasons == {'not_a_rating': 1}
  assert judge('q', '9', 'nine', criterion='equivalent') is True
  # Ratings persist with the verdicts (engine.judging writes verdicts() as JSON) and load back.
  reloaded = judge_lib.ModelJudge(lambda text: pytest.fail('asked again'))
  reloaded.preload(json.loads(json.dumps(judge.verdicts())))
  assert reloaded.rate('You judge.', 'rate me') == 9 and reloaded('q', '9', 'nine', criterion='equivalent') is True
  reloaded.preload({'bad': 11, 'worse': 'x'})
  assert 'bad' not in reloaded.verdicts() and 'worse' not in reloaded.verdicts()


@fast
def test_a_model_judge_with_a_choose_fn_picks_a_rating_and_still_writes_its_verdicts():
  """engine.judging gives a 'model' judge `Model.reply_logprobs` as choose_fn: ratings are a choice among the ten,
  verdicts stay generated (as before)."""
  asked = []
  judge = judge_lib.ModelJudge(lambda text: 'YES', choose_fn=lambda text, choices: asked.append(
      (text, tuple(choices))) or choices[6])
  assert judge.rate('You judge.', 'rate me') == 7 and judge.guided_choice
  assert asked == [('You judge.\n\nrate me', judge_lib.RATING_CHOICES)]
  assert judge('q', '9', 'nine', criterion='equivalent') is True and len(asked) == 1


@fast
def test_http_rating_payload_has_the_system_message_and_the_ten_choices():
  judge = judge_lib.HttpJudge('http://127.0.0.1:9', 'm')
  payload = judge.payload('the prompt', system='the system prompt', choices=judge_lib.RATING_CHOICES)
  assert payload['messages'] == [{'role': 'system', 'content': 'the system prompt'},
                                 {'role': 'user', 'content': 'the prompt'}]
  assert payload['guided_choice'] == [f'[[{n}]]' for n in range(1, 11)]
  assert payload['structured_outputs'] == {'choice': payload['guided_choice']}
  assert judge.payload('a verdict')['guided_choice'] == ['YES', 'NO']
  free = judge_lib.HttpJudge('http://127.0.0.1:9', 'm', guided_choice=False).payload(
      'p', choices=judge_lib.RATING_CHOICES)
  assert 'guided_choice' not in free and 'structured_outputs' not in free
  assert judge_lib.rating_cache_key('s', 'p', True) != judge_lib.rating_cache_key('s', 'p', False)


# ---- end to end: luckystar.serve as the judge --------------------------------------------------------------

def test_a_served_model_rates_two_questions_with_guided_choice():
  # Plumbing, not quality: the short prompts keep a 5M-parameter judge on CPU quick (the shipped ones render
  # above); a general and a math question, so both prompt kinds travel with their system message.
  respond = evals.text_respond(lambda messages, mode: 'A short answer.', tokenizer_lib.default())
  with serve_process.running_server('tiny-sft') as base_url:
    judge = judge_lib.make_judge(dict(backend='http', base_url=base_url, model='tiny-sft', timeout_s=60.0,
                                      retries=0))
    figures = mtbench.evaluate(respond, judge, 'concise', questions=QUESTIONS[:2], prompts=PROMPTS)
  ratings = list(judge.verdicts().values())   # the cache holds every rating given
  assert len(ratings) == 4 and all(rating in judge_lib.RATINGS for rating in ratings), ratings
  assert figures['judged'] == 4 and figures['judge_failures'] == 0 and judge.stats.failures == 0
  assert 1 <= figures['score'] <= 10 and figures['score'] == sum(ratings) / 4
