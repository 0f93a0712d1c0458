"""Option-letter extraction reads what a response chooses, and refuses to guess when it hedges."""

import hypothesis
import hypothesis.strategies as st
import pytest

from luckystar.rewards import choice

pytestmark = pytest.mark.fast


@pytest.mark.parametrize('response, expected', [
    # Bare and wrapped letters.
    ('B', 'B'),
    ('(C)', 'C'),
    ('**G**', 'G'),
    ('c', 'C'),
    ('Ｃ', 'C'),                                   # full-width
    ('Ⓓ', 'D'),                                   # circled
    # Answer markers, English.
    ('The answer is F.', 'F'),
    ('Answer: **E**', 'E'),
    ('The answer is probably H', 'H'),
    ('The correct option is B', 'B'),
    ('I choose option J', 'J'),
    ("I'd go with C", 'C'),
    ('\\boxed{J}', 'J'),
    ('A is correct.', 'A'),
    ('The answer is A because it is red', 'A'),    # 'A' after a marker is the option, not an article
    # Answer markers, Korean.
    ('정답: D', 'D'),
    ('답은 E입니다', 'E'),
    ('정답은 (C)번입니다', 'C'),
    ('C가 정답입니다. A는 틀렸습니다.', 'C'),
    ('정답은 C입니다. 설명: A와 B는 틀림', 'C'),
    ('정답은 A가 아니라 B입니다', 'B'),
    ('A는 틀렸고 B가 맞습니다', 'B'),
    # Option text after the letter.
    ('G. 사과를 먹는다', 'G'),
    ('A. 사과', 'A'),
    ('D입니다.', 'D'),
    # English words made of capitals.
    ('I think the answer is C', 'C'),
    ('A good choice is D', 'D'),
    ('I think (B) is right', 'B'),
    ("It's C", 'C'),
    ('The answer: I think it is E', 'E'),
    ('H2O is water; the answer is D', 'D'),
    ('저는 C라고 생각합니다', 'C'),
    ('B and C are plausible, but the answer is C', 'C'),
    ('Option A and option B are wrong, the answer is C', 'C'),
    ('The answer is C, I think.', 'C'),
])
def test_extracts_the_chosen_letter(response, expected):
  assert choice.extract_choice(response) == expected


@pytest.mark.parametrize('response', [
    'A or B',
    'A, B, or C',
    '답: A/B',
    '정답은 C 또는 D',
    'The answer is A. Wait, the answer is B.',    # two different assertions
    'A B C D E F G H I J',                        # naming every option wins nothing
    'The answer is K',                            # past the 10 options
    'C는 정답이 아닙니다',                          # named only to be ruled out
    "I don't know",
    '모르겠습니다',
    'DNA replication',
    '',
    '   ',
])
def test_no_letter_or_ambiguous_is_none(response):
  assert choice.extract_choice(response) is None


@pytest.mark.parametrize('response', [
    # A second letter chained on, softened or in brackets.
    'The answer is A (or B).',
    'The answer is A, or possibly B.',
    'The answer is A or maybe option B',
    'Answer: A, perhaps B',
    '정답은 A 또는 아마 B',
    '정답은 A (혹은 B)입니다',
    # A second letter offered in a sentence or clause of its own.
    'The answer is A. Or B.',
    'The answer is A. Alternatively, B.',
    'The answer is A; if not, B.',
    '정답은 A입니다. 아니면 B일 수도 있습니다.',
    '정답은 C입니다. 혹은 D',
    # ... or with a modal or 'also'.
    'The answer is A, but it could also be B.',
    'The answer is A; B might also be correct.',
    'The answer is A, though B is also possible.',
    'The answer is C. B is correct too.',
    '정답은 A일 수도 있고 B일 수도 있습니다.',
    '정답은 A입니다. B도 정답일 수 있습니다.',
    '정답: C번. D번도 가능합니다.',
])
def test_a_hedge_is_no_choice_and_scores_as_wrong(response):
  assert choice.extract_choice(response) is None
  for gold in 'ABCD':
    assert choice.is_correct(response, gold) is False   # False, not None: wrong, never unscorable


@pytest.mark.parametrize('response, expected', [
    ('Option A or B would require more, but the answer is C', 'C'),   # discussed, not offered
    ('The answer is C. I considered A or B, but they fail.', 'C'),
    ('The answer is C. A might seem right, but it is not.', 'C'),
    ('Maybe A is tempting, but the answer is C', 'C'),
    ('The answer could be C.', 'C'),                                  # tentative, but one letter
    ('The answer is C, not D.', 'C'),
    ('The answer is C. Or rather, C.', 'C'),                          # the same letter twice is no hedge
])
def test_naming_other_letters_is_not_a_hedge(response, expected):
  assert choice.extract_choice(response) == expected


def test_option_count_bounds_the_letters():
  assert choice.extract_choice('The answer is E', num_options=4) is None
  assert choice.extract_choice('The answer is D', num_options=4) == 'D'
  assert choice.extract_choice('The answer is J', num_options=10) == 'J'
  with pytest.raises(ValueError, match='num_options'):
    choice.extract_choice('A', num_options=27)


def test_is_correct():
  assert choice.is_correct('정답: D', 'D')
  assert choice.is_correct('The answer is (D).', ' d')   # gold letters are normalised
  assert not choice.is_correct('The answer is C', 'D')
  assert not choice.is_correct('C or D', 'D')                                  # a hedge is not a hit
  assert not choice.is_correct('', 'A')
  with pytest.raises(ValueError, match='check the data file'):
    choice.is_correct('A', 'K')
  with pytest.raises(TypeError, match="pass ''"):
    choice.is_correct(None, 'A')


def test_junk_responses_stay_cheap_and_none():
  # These run in the trainer process: the patterns must stay linear on long junk.
  for junk in ['answer' + ' ' * 100_000, 'answer is ' + '*' * 100_000, '정답은 ' + '(' * 100_000,
               'x' * 1_000_000, ']C' * 100_000 + ' D']:
    assert choice.extract_choice(junk) is None


_CHOICE_CHARACTERS = st.sampled_from(list('ABCDEFGHIJKLMNOPQRSTUVWXYZabcxyz (),.:*/정답은는이가아니또'))


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(response=st.text(alphabet=_CHOICE_CHARACTERS | st.characters(), max_size=80),
                  num_options=st.integers(1, 26))
def test_any_text_yields_a_valid_letter_or_none(response, num_options):
  letter = choice.extract_choice(response, num_options)
  assert letter is None or letter in choice.option_letters(num_options)
