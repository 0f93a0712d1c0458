"""MT-Bench (Zheng et al. 2023): two-turn questions, each answer rated 1–10 by an LLM judge (docs/evaluation.md).

    figures = mtbench.evaluate(respond, judge, 'concise')   # judge: engine.judging.make(config, workdir)

The model answers every first question, then every second one with its own first answer in the conversation
(`meta['history']`). The judge rates each turn with FastChat's single-answer prompts (`data.benchmarks`):
single-v1 for the first turn, single-v1-multi-turn (the whole conversation, rating the second answer) for the
second, and their math forms, which show GPT-4's reference answer, for the categories FastChat judges against
one (NEED_REF_CATEGORIES). A rating is `Judge.rate`: the most likely of [[1]] … [[10]] with a guided-choice
server, else the reply's "[[n]]". Figures: `score` (the mean rating over both turns), `score/turn_1`,
`score/turn_2`, `score/<category>`, `judged`, `judge_failures` (ratings the judge could not give: counted, left
out of every mean) and `examples` (turns answered).
"""

import collections
from typing import Any, Mapping, Sequence

import jax
import tqdm

from luckystar import distributed, errors
from luckystar.data import benchmarks
from luckystar.data.examples import Example
from luckystar.engine import evals
from luckystar.rewards import judge as judge_lib

TURNS = (1, 2)
NEED_REF_CATEGORIES = ('math', 'reasoning', 'coding')   # FastChat's NEED_REF_CATS
PROMPT_NAMES = {  # (turn, judged against the reference) → FastChat's judge prompt
    (1, False): 'single-v1', (1, True): 'single-math-v1',
    (2, False): 'single-v1-multi-turn', (2, True): 'single-math-v1-multi-turn',
}
NO_JUDGE = ("the mtbench suite is scored by an LLM judge, and config.judge.backend is 'none'. Point config.judge "
            'at an OpenAI-compatible server (vLLM, or python -m luckystar.serve; docs/serving.md "As the LLM '
            'judge"), e.g. --config.judge.backend=http --config.judge.base_url=http://127.0.0.1:8000 '
            '--config.judge.model=<the served model name>, or leave mtbench out of config.eval.suites')


def examples(questions: Sequence[Mapping[str, Any]], turn: int,
             first_answers: Sequence[str] | None = None) -> list[Example]:
  """One English chat Example per question for `turn` (1 or 2). Turn 2 carries the first question and the
  model's first answer (`first_answers`, one per question) in meta['history'], so every Respond answers it
  as the second turn of a conversation."""
  if turn not in TURNS:
    raise ValueError(f'MT-Bench has turns {TURNS}, not {turn!r}')
  if turn == 2 and (first_answers is None or len(first_answers) != len(questions)):
    raise ValueError(f'turn 2 needs the first answer to each of the {len(questions)} questions, got '
                     f'{None if first_answers is None else len(first_answers)}')
  out = []
  for n, question in enumerate(questions):
    reference = question.get('reference')
    meta = {'category': question['category'], 'question_id': question['id'], 'turn': turn}
    if turn == 2:
      meta['history'] = [{'role': 'user', 'content': question['turns'][0]},
                         {'role': 'assistant', 'response': first_answers[n]}]
    out.append(Example(id=f'mtbench-{question["id"]}-turn{turn}', task='chat', language='en', split='heldout',
                       prompt=question['turns'][turn - 1], answer=reference[turn - 1] if reference else '',
                       meta=meta))
  return out


def answer_text(reply: Any) -> str:
  """What the judge reads of a reply: its response section; without one, whatever else its last turn wrote
  (a reply cut off while thinking is judged on its thinking, as FastChat judges the raw output)."""
  turn = reply.final_turn
  if turn.response is not None:
    return turn.response
  return '\n'.join(section for section in (turn.thinking, turn.action) if section)


def judge_prompt(question: Mapping[str, Any], turn: int, answers: Sequence[str],
                 prompts: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
  """(system prompt, user prompt) rating `answers[turn - 1]`, with FastChat's prompt for the turn and the
  question's category (`answers`: the model's answers to the turns so far)."""
  with_reference = question['category'] in NEED_REF_CATEGORIES
  reference = question.get('reference')
  if with_reference and not reference:
    raise ValueError(f'MT-Bench question {question["id"]} ({question["category"]}) has no reference answer, '
                     f'which FastChat judges {"/".join(NEED_REF_CATEGORIES)} against')
  record = prompts[PROMPT_NAMES[turn, with_reference]]
  if turn == 1:
    fields = {'question': question['turns'][0], 'answer': answers[0]}
  else:
    fields = {'question_1': question['turns'][0], 'answer_1': answers[0],
              'question_2': question['turns'][1], 'answer_2': answers[1]}
  if with_reference:
    fields.update(ref_answer_1=reference[0], ref_answer_2=reference[1])
  return record['system_prompt'], record['prompt_template'].format(**fields)


def figures(questions: Sequence[Mapping[str, Any]], ratings: Mapping[int, Sequence[int | None]]
            ) -> dict[str, float]:
  """The suite's figures from `ratings[turn][n]` (question n's rating, None where the judge failed)."""
  by_key = collections.defaultdict(list)
  failures = 0
  for turn, turn_ratings in ratings.items():
    for question, rating in zip(questions, turn_ratings, strict=True):
      if rating is None:
        failures += 1
        continue
      for key in ('score', f'score/turn_{turn}', f'score/{question["category"]}'):
        by_key[key].append(rating)
  out = {'score': evals.mean(by_key.pop('score', ()))}
  out.update({f'score/turn_{turn}': evals.mean(by_key.pop(f'score/turn_{turn}', ())) for turn in ratings})
  out.update({key: evals.mean(values) for key, values in sorted(by_key.items())})
  examples_count = sum(len(turn_ratings) for turn_ratings in ratings.values())
  return out | {'judged': float(examples_count - failures), 'judge_failures': float(failures),
                'examples': float(examples_count)}


def evaluate(respond: evals.Respond, judge: judge_lib.Judge | None, mode: str, *,
             questions: Sequence[Mapping[str, Any]] | None = None,
             prompts: Mapping[str, Mapping[str, Any]] | None = None, temperature: float = 0.0, seed: int = 0,
             max_examples: int | None = None) -> dict[str, float]:
  """`figures` of `respond` in `mode` on `questions` (default: the 80 of `benchmarks.mtbench()`; the first
  `max_examples` of them), rated by `judge` with `prompts` (default: `benchmarks.judge_prompts()`). No judge
  is a UserError naming config.judge; a rating the judge fails to give is counted, never fatal."""
  if judge is None:
    raise errors.UserError(NO_JUDGE)
  questions = list(benchmarks.mtbench() if questions is None else questions)[:max_examples]
  prompts = benchmarks.judge_prompts() if prompts is None else prompts
  first = [answer_text(reply) for reply in respond(examples(questions, 1), mode, temperature, seed)]
  second = [answer_text(reply) for reply in respond(examples(questions, 2, first), mode, temperature, seed)]
  asks = [(turn, n) for turn in TURNS for n in range(len(questions))]
  with tqdm.tqdm(total=len(asks), desc=f'mtbench judge {mode}', unit='rating', leave=False, dynamic_ncols=True,
                 disable=jax.process_index() != 0) as bar:

    def rate(k: int) -> int | None:
      turn, n = asks[k]
      rating = judge.rate(*judge_prompt(questions[n], turn, (first[n], second[n]), prompts))
      bar.update()
      return rating

    # Each process rates its share (a collective under several): no rating is asked twice.
    rated = distributed.run_owned(rate, range(len(asks)), len(asks))
  return figures(questions, {turn: rated[i * len(questions):(i + 1) * len(questions)]
                             for i, turn in enumerate(TURNS)})
