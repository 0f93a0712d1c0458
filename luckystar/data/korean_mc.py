"""KoBALT-style Korean linguistics multiple choice: 10 options (A–J), one letter answer.

Particle choice decided by the final consonant (받침): the question names the
grammatical function (목적격, 주격, 보조사, 부사격, 접속), so exactly one of the ten
particles is correct — the allomorph that fits the noun's last syllable.
"""

import random
import string
from typing import Iterator

from luckystar.data import korean
from luckystar.data.examples import Example, dedupe, split_of

NUM_OPTIONS = 10
LETTERS = string.ascii_uppercase[:NUM_OPTIONS]
OPTIONS = ('을', '를', '이', '가', '은', '는', '과', '와', '으로', '로')

NOUNS = ('사과', '책', '물', '커피', '우유', '빵', '신문', '편지', '음악', '영화', '그림', '가방', '연필', '시계',
         '노래', '바다', '하늘', '학교', '회사', '도서관', '병원', '시장', '공원', '서울', '부산', '제주도', '집', '교실',
         '강아지', '고양이', '동생', '선생님', '친구', '사람', '기차', '자전거', '지하철', '비행기', '컴퓨터', '전화',
         '과일', '김치', '라면', '국수', '떡', '케이크', '꽃', '나무', '산', '강', '길', '문', '창문', '의자', '책상',
         '노트북', '카메라', '냉장고', '모자', '신발', '옷', '달', '별', '눈', '비', '바람', '숙제', '시험', '여행', '운동')

# (function name shown in the question, particle kind, sentence frame with {noun} and a blank)
FRAMES = (
    ('목적격 조사', 'object', ('나는 매일 {noun}( ) 본다.', '동생이 {noun}( ) 좋아한다.', '우리는 어제 {noun}( ) 샀다.')),
    ('주격 조사', 'subject', ('{noun}( ) 정말 크다.', '저기에 {noun}( ) 있다.', '오늘은 {noun}( ) 필요하다.')),
    ('보조사(주제)', 'topic', ('{noun}( ) 어디에 있나요?', '{noun}( ) 내가 제일 좋아하는 것이다.')),
    ('접속 조사', 'with', ('{noun}( ) 우유를 샀다.', '{noun}( ) 책이 책상 위에 있다.')),
    ('부사격 조사(방향)', 'direction', ('다음 주에 {noun}( ) 가요.', '모두 {noun}( ) 모였다.')),
)
PROMPT = ('다음 문장의 빈칸 ( )에 들어갈 {function}로 알맞은 것을 고르시오.\n\n문장: {sentence}\n\n{options}\n\n'
          '정답을 A부터 J 중 하나의 알파벳으로 답하시오.')


def generate(seed: int = 0, count: int = 1500) -> Iterator[Example]:
  rng = random.Random(f'korean_mc:{seed}')
  for _ in range(count):
    function, kind, frames = rng.choice(FRAMES)
    noun = rng.choice(NOUNS)
    sentence = rng.choice(frames).format(noun=noun)
    correct = korean.particle(noun, kind)
    options = list(OPTIONS)
    rng.shuffle(options)
    letter = LETTERS[options.index(correct)]
    prompt = PROMPT.format(function=function, sentence=sentence,
                           options='\n'.join(f'{l}. {o}' for l, o in zip(LETTERS, options)))
    filled = sentence.replace('( )', correct)
    yield Example(
        # Split by the sentence, not the prompt: the same sentence with other option orders stays in one split.
        id=f'kmc-{kind}-{rng.getrandbits(32):08x}', task='korean_mc', language='ko',
        split=split_of(f'{function}:{sentence}', seed),
        prompt=prompt, answer=letter, response=f'{filled} 정답: {letter}',  # the filled sentence, then the letter
        thinking=(f'The noun "{noun}" ends in "{noun[-1]}", which '
                  f'{"has" if korean.final_consonant(noun) else "has no"} final consonant, so the {kind} particle '
                  f'is "{correct}": "{filled}". That is option {letter}.'),
        meta={'phenomenon': f'particle/{kind}', 'options': options})


def suite(seed: int = 0, count: int = 1500) -> list[Example]:
  return dedupe(generate(seed, count))
