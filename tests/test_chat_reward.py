"""Concise chat verifier (`rewards.chat`): the reference answer as a word of its own, and no other candidate."""

import pytest

from luckystar.data import suites
from luckystar.data.examples import Example
from luckystar.rewards import chat, reward
from luckystar.tokenizer import AssistantTurn

pytestmark = pytest.mark.fast


@pytest.mark.parametrize('prompt,answer,response', [
    ('12월 다음 달은 몇 월인가요?', '1월', '11월입니다.'),          # a digit runs into the answer
    ('What is 40 + 2?', '42', '142.'),
    ('What is 40 + 2?', '42', '42.5'),
    ('3시간은 몇 분인가요?', '180', '1800분입니다.'),
    ('3시간은 몇 분인가요?', '180', '180분 또는 240분입니다.'),     # a numeric hedge: the last number decides
    ('What day comes after Sunday?', 'Monday', 'Monday, Tuesday, Wednesday, Thursday, Friday, Saturday or Sunday.'),
    ('일본의 수도는 어디인가요?', '도쿄', '서울, 도쿄, 베이징, 파리 중 하나입니다.'),
    ('Which continent is Korea in?', 'Asia', 'Asia or Europe.'),
    ('What language is spoken in Spain?', 'Spanish', 'Spanish or English.'),
    ('What is the capital of Japan?', 'Tokyo', 'Tokyoite.'),
])
def test_wrong_answers_a_substring_test_passed_are_wrong(prompt, answer, response):
  example = Example(id='c', task='chat', language='en', split='heldout', prompt=prompt, answer=answer)
  assert not chat.is_correct(response, answer, prompt=prompt)
  assert reward.score(example, AssistantTurn(response=response, ended=True)).correct is False


@pytest.mark.parametrize('prompt,answer,response', [
    ('What day comes after Sunday?', 'Monday', 'The day after Sunday is Monday.'),   # restates the prompt's day
    ('"가볍다"의 반의어를 알려 주세요.', '무겁다', '"가볍다"의 반대는 "무겁다"입니다.'),
    ('12월 다음 달은 몇 월인가요?', '1월', '12월 다음 달은 1월입니다.'),
    ('What is the capital of Mexico?', 'Mexico City', 'mexico-city'),
    ('19시간은 몇 분인가요?', '1140', '1,140분입니다.'),
    ('How many minutes are in 7 hours?', '420', '7 hours is 420 minutes.'),
    ('What language is spoken in Korea?', 'Korean', 'Koreans speak Korean.'),
    ('일본의 수도는 어디인가요?', '도쿄', '일본의 수도는 도쿄입니다.'),
    ('대한민국의 수도는 어디입니까?', 'Seoul', '서울 (Seoul)입니다.'),       # one answer in both languages
])
def test_right_answers_stay_right(prompt, answer, response):
  assert chat.is_correct(response, answer, prompt=prompt)


def test_every_reference_reply_of_the_suite_is_correct():
  """The suite's own reference replies ('The capital of France is Paris.', '"차갑다"입니다.') pass, in both splits."""
  examples = [e for split in ('train', 'heldout') for e in suites.load('chat', split)]
  assert len(examples) > 300
  wrong = [e for e in examples if not chat.is_correct(e.response, e.answer, prompt=e.prompt)]
  assert not wrong, [(e.prompt, e.answer, e.response) for e in wrong[:3]]
