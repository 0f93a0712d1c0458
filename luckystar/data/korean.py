"""Korean particles chosen by the final consonant (받침) of the preceding word.

The one place that knows the rule; the generators and the KoBALT-style
particle questions both use it.
"""

# kind → (after a final consonant, after a vowel)
PARTICLES = {
    'topic': ('은', '는'),
    'subject': ('이', '가'),
    'object': ('을', '를'),
    'with': ('과', '와'),
    'direction': ('으로', '로'),   # ㄹ-final words take 로 (서울로), see `particle`
    'copula': ('이에요', '예요'),
    'vocative': ('아', '야'),
}
_RIEUL = 8  # index of ㄹ among the 28 final-consonant slots


def final_consonant(word: str) -> int | None:
  """Index (1–27) of the last Hangul syllable's final consonant, 0 if it ends in a vowel,
  None if the word does not end in a Hangul syllable (digits and Latin letters need readings)."""
  if not word or not '가' <= word[-1] <= '힣':
    return None
  return (ord(word[-1]) - ord('가')) % 28


def particle(word: str, kind: str) -> str:
  """The particle of `kind` that fits `word`, e.g. particle('사과', 'object') == '를'."""
  after_consonant, after_vowel = PARTICLES[kind]
  final = final_consonant(word)
  if final is None:
    raise ValueError(f'cannot choose a particle for {word!r}: it does not end in a Hangul syllable')
  if kind == 'direction' and final == _RIEUL:
    return after_vowel
  return after_consonant if final else after_vowel


def attach(word: str, kind: str) -> str:
  return word + particle(word, kind)
