"""Concise chat Q&A with short reference answers, in Korean and English.

The concise mode's data: questions a post-trained assistant answers in a few
words. A response is correct when it gives the reference answer and no other
answer of its kind (`luckystar.rewards.chat`).

Each fact is asked in several phrasings, and splits go by the prompt text, so a
held-out question asks a fact the train split teaches in other words — what an
evaluation of a post-trained model's knowledge looks like. Knowledge kinds are
drawn far more often than arithmetic (`_DRAWS`): sums alone would otherwise
yield most distinct prompts after deduplication, and the suite would measure
two-digit addition rather than recall. `meta['kind']` names the kind; the arithmetic
kinds also carry `meta['expression']`, the calculator expression that computes the answer.
"""

import random
from typing import Iterator

from luckystar.data import korean
from luckystar.data.examples import Example, dedupe, split_of

CAPITALS = (('France', 'Paris', '프랑스', '파리'), ('Japan', 'Tokyo', '일본', '도쿄'), ('Korea', 'Seoul', '한국', '서울'),
            ('Germany', 'Berlin', '독일', '베를린'), ('Italy', 'Rome', '이탈리아', '로마'),
            ('Spain', 'Madrid', '스페인', '마드리드'), ('Egypt', 'Cairo', '이집트', '카이로'),
            ('Canada', 'Ottawa', '캐나다', '오타와'), ('Australia', 'Canberra', '호주', '캔버라'),
            ('Thailand', 'Bangkok', '태국', '방콕'), ('Vietnam', 'Hanoi', '베트남', '하노이'),
            ('Russia', 'Moscow', '러시아', '모스크바'), ('China', 'Beijing', '중국', '베이징'),
            ('England', 'London', '영국', '런던'), ('Mexico', 'Mexico City', '멕시코', '멕시코시티'))
DAYS = (('Monday', '월요일'), ('Tuesday', '화요일'), ('Wednesday', '수요일'), ('Thursday', '목요일'),
        ('Friday', '금요일'), ('Saturday', '토요일'), ('Sunday', '일요일'))
# Country → (language, continent), English and Korean; countries of CAPITALS with one clear answer.
COUNTRY_FACTS = (('France', '프랑스', 'French', '프랑스어', 'Europe', '유럽'),
                 ('Japan', '일본', 'Japanese', '일본어', 'Asia', '아시아'),
                 ('Korea', '한국', 'Korean', '한국어', 'Asia', '아시아'),
                 ('Germany', '독일', 'German', '독일어', 'Europe', '유럽'),
                 ('Italy', '이탈리아', 'Italian', '이탈리아어', 'Europe', '유럽'),
                 ('Spain', '스페인', 'Spanish', '스페인어', 'Europe', '유럽'),
                 ('Egypt', '이집트', 'Arabic', '아랍어', 'Africa', '아프리카'),
                 ('Thailand', '태국', 'Thai', '태국어', 'Asia', '아시아'),
                 ('Vietnam', '베트남', 'Vietnamese', '베트남어', 'Asia', '아시아'),
                 ('China', '중국', 'Chinese', '중국어', 'Asia', '아시아'),
                 ('England', '영국', 'English', '영어', 'Europe', '유럽'),
                 ('Mexico', '멕시코', 'Spanish', '스페인어', 'North America', '북아메리카'),
                 ('Australia', '호주', 'English', '영어', 'Oceania', '오세아니아'))
MONTHS = ('January', 'February', 'March', 'April', 'May', 'June', 'July', 'August', 'September', 'October',
          'November', 'December')
OPPOSITES = (('hot', 'cold', '뜨겁다', '차갑다'), ('big', 'small', '크다', '작다'), ('fast', 'slow', '빠르다', '느리다'),
             ('high', 'low', '높다', '낮다'), ('long', 'short', '길다', '짧다'), ('light', 'heavy', '가볍다', '무겁다'))


# Every answer of each knowledge kind, as groups of its spellings in both languages ('Paris', '파리'): the
# candidates a hedge would list (`rewards.chat`). The arithmetic kinds' answers are numbers, checked otherwise.
ANSWERS = {
    'capital': frozenset(frozenset(row[1::2]) for row in CAPITALS),
    'next_day': frozenset(frozenset(row) for row in DAYS),
    'opposite': frozenset(frozenset(row[i::2]) for row in OPPOSITES for i in (0, 1)),
    'language': frozenset(frozenset(row[2:4]) for row in COUNTRY_FACTS),
    'continent': frozenset(frozenset(row[4:6]) for row in COUNTRY_FACTS),
    'next_month': frozenset(frozenset((month, f'{i}월')) for i, month in enumerate(MONTHS, 1)),
}


def _capital(rng):
  en, capital, ko, capital_ko = rng.choice(CAPITALS)
  return (rng.choice((f'What is the capital of {en}?', f'Which city is the capital of {en}?',
                      f'Name the capital city of {en}.', f'{en} has which city as its capital?')),
          capital, f'The capital of {en} is {capital}.',
          rng.choice((f'{ko}의 수도는 어디인가요?', f'{ko}의 수도는 어느 도시인가요?', f'{ko}의 수도를 알려 주세요.',
                      f'{ko}의 수도 이름은 무엇인가요?')),
          capital_ko, f'{ko}의 수도는 {capital_ko}입니다.')


def _next_day(rng):
  i = rng.randrange(7)
  (en, ko), (next_en, next_ko) = DAYS[i], DAYS[(i + 1) % 7]
  return (rng.choice((f'What day comes after {en}?', f'Which day follows {en}?', f'If today is {en}, what day is '
                      f'tomorrow?')), next_en, f'{next_en}.',
          rng.choice((f'{ko} 다음 날은 무슨 요일인가요?', f'오늘이 {ko}이면 내일은 무슨 요일인가요?',
                      f'{ko} 다음에 오는 요일은?')), next_ko, f'{next_ko}입니다.')


def _opposite(rng):
  en, opposite, ko, opposite_ko = rng.choice(OPPOSITES)
  return (rng.choice((f'What is the opposite of "{en}"?', f'Give the antonym of "{en}".',
                      f'Which word means the opposite of "{en}"?')), opposite, f'"{opposite}".',
          rng.choice((f'"{ko}"의 반대말은 무엇인가요?', f'"{ko}"와 뜻이 반대인 말은?', f'"{ko}"의 반의어를 알려 주세요.')),
          opposite_ko, f'"{opposite_ko}"입니다.')


def _language(rng):
  en, ko, language, language_ko, _, _ = rng.choice(COUNTRY_FACTS)
  return (rng.choice((f'What language is spoken in {en}?', f'Which language do people in {en} speak?',
                      f'What is the main language of {en}?')), language, f'{language}.',
          rng.choice((f'{ko}에서는 어떤 언어를 쓰나요?', f'{ko} 사람들은 무슨 언어로 말하나요?', f'{ko}의 주요 언어는?')),
          language_ko, f'{language_ko}입니다.')


def _continent(rng):
  en, ko, _, _, continent, continent_ko = rng.choice(COUNTRY_FACTS)
  return (rng.choice((f'Which continent is {en} in?', f'On what continent is {en}?',
                      f'{en} is part of which continent?')), continent, f'{continent}.',
          rng.choice((f'{korean.attach(ko, "topic")} 어느 대륙에 있나요?', f'{korean.attach(ko, "subject")} 속한 대륙은?',
                      f'{korean.attach(ko, "topic")} 무슨 대륙의 나라인가요?')),
          continent_ko, f'{continent_ko}입니다.')


def _next_month(rng):
  i = rng.randrange(12)
  month, following = MONTHS[i], MONTHS[(i + 1) % 12]
  month_ko, following_ko = f'{i + 1}월', f'{(i + 1) % 12 + 1}월'
  return (rng.choice((f'Which month comes after {month}?', f'What month follows {month}?',
                      f'If this month is {month}, what is next month?')), following, f'{following}.',
          rng.choice((f'{month_ko} 다음 달은 몇 월인가요?', f'{month_ko} 다음에 오는 달은?',
                      f'이번 달이 {month_ko}이면 다음 달은?')), following_ko, f'{following_ko}입니다.')


def _minutes(rng):
  hours = rng.randint(2, 48)
  minutes = str(hours * 60)
  return (rng.choice((f'How many minutes are in {hours} hours?', f'Convert {hours} hours to minutes.')), minutes,
          f'{minutes} minutes.', rng.choice((f'{hours}시간은 몇 분인가요?', f'{hours}시간을 분으로 바꾸면?')),
          minutes, f'{minutes}분입니다.', f'{hours} × 60')


def _sum(rng):
  a, b = rng.randint(2, 99), rng.randint(2, 99)
  return (rng.choice((f'What is {a} + {b}?', f'Add {a} and {b}.')), str(a + b), f'{a + b}.',
          rng.choice((f'{a} 더하기 {b}는 얼마인가요?', f'{a}와 {b}를 더하면?')), str(a + b), f'{a + b}입니다.',
          f'{a} + {b}')


# (kind, weight): each knowledge kind has at most a few dozen distinct prompts, which dedupe keeps;
# arithmetic has thousands, so it is drawn rarely to stay a small share of the suite.
_DRAWS = ((_capital, 1.0), (_language, 1.0), (_continent, 1.0), (_next_month, 1.0), (_next_day, 1.0),
          (_opposite, 1.0), (_minutes, 0.3), (_sum, 0.3))


def generate(seed: int = 0, count: int = 1500) -> Iterator[Example]:
  rng = random.Random(f'chat:{seed}')
  draws, weights = zip(*_DRAWS)
  for _ in range(count):
    draw, = rng.choices(draws, weights)
    en, en_answer, en_response, ko, ko_answer, ko_response, *expression = draw(rng)
    split = split_of(en, seed)
    for language, prompt, answer, response in (('en', en, en_answer, en_response), ('ko', ko, ko_answer, ko_response)):
      yield Example(id=f'chat-{draw.__name__[1:]}-{language}-{rng.getrandbits(32):08x}', task='chat',
                    language=language, split=split, prompt=prompt, answer=answer, response=response,
                    meta={'kind': draw.__name__[1:]} | ({'expression': expression[0]} if expression else {}))


def suite(seed: int = 0, count: int = 1500) -> list[Example]:
  return dedupe(generate(seed, count))
