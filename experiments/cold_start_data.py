"""The NL2SQL cold start's own data (experiments/cold_start.md, experiments/copy_probe.md), registered with
`luckystar.data.sources` on import:

- SFT data (`bundled:<name>` in `config.sft.sources`), one name per copy drill (`DRILL_SOURCES`): 'copy' (the
  quoted drill), 'copy_plain', 'copy_named', 'copy_schema';
- RL prompts (`bundled:<name>` in `config.rlvr.sources`): 'nl2sql_rl_only' (RL-only NL2SQL questions over 16 more training-wording
  databases per domain, `rl_suite`) and 'nl2sql_rl_only_1' (one per domain).

experiments/cold_start_pipeline.py imports it, so the pipeline's stages find these names.
"""

import functools
import pathlib
import random
import sqlite3
from typing import Iterator

import faker
import numpy as np

from luckystar import tokenizer as tokenizer_lib
from luckystar.data import conversations, nl2sql, sources
from luckystar.data.examples import Example, dedupe
from luckystar.tokenizer import Tokenizer

# ---- the copy drill (experiments/copy_probe.md) -------------------------------------------------

# `tiny-base` has no circuit that copies a word out of its prompt, and grows one only after a few hundred
# steps of a task that needs nothing else (experiments/copy_probe.md); the teacher needs it to carry a
# question's values into its query. The drills (`COPY_DRILLS`), a new word every conversation:
# - 'plain', the probe's: `Repeat: <made-up word>` → `It is <word>`, after a space in prompt and reply alike
#   (the same tokens in both). It grows a circuit that copies made-up words, not real names (0 of 32 NL2SQL
#   values), and the teacher started from it copied none of the student's values.
# - 'quoted', the NL2SQL spelling (`nl2sql.spell`): `Repeat: '<word>'` or `'<word>': repeat it` → `It is
#   '<word>'`, the word a made-up one or, half the time, a database-like value (a Korean or English person or
#   company, `value_like`) that no student question names. Questions quote their values the same way,
#   so the copy it trains (after a quote, what followed the earlier quote) is the one a query needs; the
#   second prompt form puts the quote at the text start, as Korean questions that open with their value do.
# Varied drills learned slower: asking for `'word'` after an unquoted prompt (other tokens) grew no circuit in
# 400 steps, and five prompt and three reply templates with vocabulary words half the time reached 16% in 800.
# - 'named', the quoted drill in the reasoning traces' own form: a request that quotes a word (and, a third of
#   the time, a year after it) → thinking `The question names '<word>'[, <year>].` (`conversations.naming`, the
#   line an NL2SQL trace opens with) and the reply `It is '<word>'`. The student of the cold start learns its
#   query from a hundred traces; copied in the concise `It is` form only, its thinking line named a memorised
#   value for every question (experiments/cold_start.md). Its requests are not NL2SQL's: no schema, no database
#   words. Measured there: the student names 14 of 32 real values in these requests after 1500 steps, but 3 of
#   48 in NL2SQL prompts, whose schema (100-200 tokens) comes before the question.
# - 'schema', the named drill behind that context: an NL2SQL question over a training database, in its
#   template's wording, with made-up or person/company values for its text slots (`drill_questions`),
#   after the database's schema as its system text; the row is the prompt and the trace's thinking
#   (`conversations.nl2sql_thinking`) and stops at the thinking's end, so no reply competes with the query the
#   traces teach. 600 steps of it after 'named': the thinking names 25 of 144 held-out NL2SQL questions' values
#   (2 before).
HANGUL_SYLLABLES = tuple('가나다라마바사아자차카타파하고노도로모보소오조호구누두루무부수우주추리미비시이지기니디')
LATIN_SYLLABLES = tuple(c + v for c in 'bdfgklmnprstvz' for v in 'aeiou')
COPY_COUNTS = {'train': 40_000, 'heldout': 512, 'teacher': 40_000}
COPY_DRILLS = ('plain', 'quoted', 'named', 'schema')
DRILL_SOURCES = {'copy': 'quoted', 'copy_plain': 'plain', 'copy_named': 'named', 'copy_schema': 'schema'}
NAMED_REQUESTS = (('What can you tell me about {0}?', '{0}에 대해 알려 주세요.'),
                  ('Please find the record of {0}.', '{0}의 기록을 찾아 주세요.'),
                  ('Is {0} mentioned anywhere?', '{0} 관련 정보가 있나요?'))
NAMED_YEAR_REQUESTS = (('What happened with {0} in {1}?', '{1}년에 {0}에게 무슨 일이 있었나요?'),
                       ('Show the notes on {0} from {1}.', '{0}의 {1}년 기록을 보여 주세요.'))


def made_up_word(rng: random.Random) -> str:
  """Two or three Hangul syllables, or two to four capitalised Latin ones."""
  if rng.random() < 0.5:
    return ''.join(rng.choice(HANGUL_SYLLABLES) for _ in range(rng.randint(2, 3)))
  return ''.join(rng.choice(LATIN_SYLLABLES) for _ in range(rng.randint(2, 4))).capitalize()


def value_like(rng: random.Random, exclude: frozenset[str] = frozenset()) -> Iterator[str]:
  """Endless values like the databases' open-vocabulary ones (a Korean or English person, or a company),
  from `rng`'s own fakers, skipping `exclude`: the quoted and named drills' words."""
  fake_ko, fake_en = faker.Faker('ko_KR'), faker.Faker('en_US')
  fake_ko.seed_instance(rng.getrandbits(32))
  fake_en.seed_instance(rng.getrandbits(32))
  while True:
    if rng.random() < 0.7:   # a person, drawn as the databases draw their people
      value = fake_ko.name() if rng.random() < 0.6 else fake_en.name()
    else:
      value = (fake_ko if rng.random() < 0.5 else fake_en).company()
    if value not in exclude:
      yield value


@functools.lru_cache(maxsize=None)   # the drill asks once per split, and building the suite takes seconds
def student_values(seed: int = 0) -> frozenset[str]:
  """Every value a question of the student's splits (train, held-out) names."""
  return frozenset(v for e in nl2sql.suite(seed=seed) if e.split != 'teacher' for v in e.meta['values'])


def drill_questions(rng: random.Random, words: Iterator[str], seed: int = 0) -> Iterator[tuple[str, str, list]]:
  """Endless (system, question, values) in the templates' own wording over the student's training databases,
  every text value replaced by the next of `words` and numbers drawn as the template draws them: the 'schema'
  drill. The question has no query (its values name nothing in the database); templates without a text value
  are skipped."""
  train = {name: path for name, path in sorted(nl2sql.build_databases(seed=seed).items())
           if nl2sql.INSTANCES[int(name.rsplit('_', 1)[1])][0] == 'train'}
  systems = {name: nl2sql.context(name, path) for name, path in train.items()}
  conns = {name: sqlite3.connect(f'file:{path}?mode=ro', uri=True) for name, path in train.items()}
  try:
    while True:
      name = rng.choice(list(train))
      domain, instance = name.rsplit('_', 1)
      template = rng.choice([t for t in nl2sql.TEMPLATES if t.domain == domain])
      values = template.values(rng, conns[name], nl2sql.names(domain, int(instance)))
      if any(v is None for v in values.values()) or not any(isinstance(v, str) for v in values.values()):
        continue
      values = {key: next(words) if isinstance(value, str) else value for key, value in values.items()}
      text = template.en if rng.random() < 0.5 else template.ko
      yield (systems[name], text.format(**{key: nl2sql.spell(v) for key, v in values.items()}),
             list(values.values()))
  finally:
    for conn in conns.values():
      conn.close()


def copy_messages(word: str, form: int = 0, quoted: bool = False) -> list[dict]:
  """The copy drill's conversation (concise mode); `quoted`: the word spelled as in NL2SQL, and `form` 1 puts
  it at the prompt's start."""
  shown = nl2sql.spell(word) if quoted else word
  request = f'{shown}: repeat it' if form else f'Repeat: {shown}'
  return [{'role': 'user', 'content': request}, {'role': 'assistant', 'response': f'It is {shown}'}]


def named_messages(word: str, rng: random.Random) -> list[dict]:
  """The 'named' drill's conversation (reasoning mode): a request naming `word` (a third of the time a year
  too), in English or Korean, drawn from `rng`."""
  year = rng.randint(2010, 2025) if rng.random() < 1 / 3 else None
  values = [word, year] if year else [word]
  request = rng.choice(NAMED_YEAR_REQUESTS if year else NAMED_REQUESTS)[rng.randrange(2)]
  return [{'role': 'user', 'content': request.format(*map(nl2sql.spell, values))},
          {'role': 'assistant', 'thinking': conversations.naming(values), 'response': f'It is {nl2sql.spell(word)}'}]


def copy_sources(tokenizer: Tokenizer, *, seed: int = 0, split: str = 'train', count: int | None = None,
                 drill: str = 'plain') -> tuple[dict[str, list], dict[str, float]]:
  """({'copy': [...]}, {'copy': 1.0}): `count` (default COPY_COUNTS[split]) rendered copy drills of kind
  `drill` (COPY_DRILLS), `conversations.render_example`'s dicts, each split's words drawn from its own seed."""
  if drill not in COPY_DRILLS:
    raise ValueError(f'copy drill {drill!r}; expected one of {COPY_DRILLS}')
  rng, drills = random.Random(f'copy:{seed}:{split}' + ('' if drill == 'plain' else f':{drill}')), []
  if drill != 'plain':
    values = value_like(random.Random(f'copy-values:{seed}:{split}'), exclude=student_values(seed))
    words = (next(values) if rng.random() < 0.5 else made_up_word(rng) for _ in iter(int, 1))
  if drill == 'schema':
    questions = drill_questions(rng, words, seed)
  for _ in range(COPY_COUNTS[split] if count is None else count):
    if drill == 'plain':
      messages, mode = copy_messages(made_up_word(rng)), 'concise'
    elif drill == 'quoted':
      messages, mode = copy_messages(next(words), form=rng.randrange(2), quoted=True), 'concise'
    elif drill == 'named':
      messages, mode = named_messages(next(words), rng), 'reasoning'
    else:
      system, question, named = next(questions)
      messages, mode = [{'role': 'system', 'content': system}, {'role': 'user', 'content': question},
                        {'role': 'assistant', 'thinking': conversations.nl2sql_thinking(named)}], 'reasoning'
    ids, mask = tokenizer.render(messages, mode)
    if drill == 'schema':  # up to the thinking's end: the turn would close where a trace calls the SQL tool
      ids, mask = ids[:-1], mask[:-1]
    drills.append({'tokens': np.asarray(ids, np.int32), 'loss_mask': np.asarray(mask, np.int32)})
  return {'copy': drills}, {'copy': 1.0}


def _drill_data(name: str, drill: str):
  """SFT data `name`: the `drill` drill alone, as one source named `name` (`bundled:<name>`)."""
  def build(tokenizer: Tokenizer, *, seed: int, split: str) -> tuple[dict[str, list], dict[str, float]]:
    return {name: copy_sources(tokenizer, seed=seed, split=split, drill=drill)[0]['copy']}, {name: 1.0}
  return build


# ---- RL-only databases ------------------------------------------------------------------------------
# The three training databases per domain hold 596 curated questions; RS takes a quarter of them, the cold
# start's held-out eval (with every question sharing its gold SQL) over half of the rest, and at k = 8 about
# 1 in 7 of the 216 left has a pass rate in [1/8, 7/8] for the tiny student: RL then trained on 14–31 prompts,
# learnt them and did not carry to new questions (experiments/cold_start.md). RL-only databases in the
# training wording, each with rows of its own (people, companies, places, dates), give RL as many prompts as
# it asks for, whose values no SFT row had: `--config.rlvr.sources=bundled:nl2sql,bundled:nl2sql_rl_only` adds them to RL's
# train pool; never RS prompts nor the eval's. They need a student that copies values from the question: the
# tiny one had a correct rollout at k = 8 on 3 of 280 (16 of 104 on the training databases, whose rows its
# traces showed).
RL_ONLY_SOURCES = {'nl2sql_rl_only': 16, 'nl2sql_rl_only_1': 1}   # name → RL-only databases per domain


def rl_suite(directory: str | pathlib.Path | None = None, *, count: int, per_template: int = 6, seed: int = 0
             ) -> list[Example]:
  """Questions (split 'train') over `count` RL-only databases per domain in the training split's wording,
  `<dir>/<domain>_r<k>/`; question texts of every student split and of the teacher's suite are dropped, so
  no RL-only prompt is one the SFT, the teacher or the held-out eval has."""
  directory = pathlib.Path(directory or nl2sql.default_dir())
  taken = {e.prompt for e in nl2sql.suite(nl2sql.build_databases(directory, seed), seed=seed)}  # every split's
  taken |= {e.prompt for e in nl2sql.teacher_suite(directory, seed=seed)}   # and the teacher's
  train = next(instance for instance, (split, _) in nl2sql.INSTANCES.items() if split == 'train')
  rng = random.Random(f'nl2sql-rl-questions:{seed}')
  examples = []
  for domain in nl2sql.DOMAINS:
    databases = [(f'r{k}', nl2sql.names(domain, train)) for k in range(count)]
    examples += nl2sql.extra_questions(directory, domain, databases, 'train', rng, per_template, seed)
  return [e for e in dedupe(examples) if e.prompt not in taken]


@functools.lru_cache(maxsize=None)   # RL's pool and its eval pool both ask; building takes seconds
def rl_only(count: int, seed: int = 0) -> tuple[Example, ...]:
  """`rl_suite`'s questions, curated as the suites' are (`nl2sql.curate`), under `nl2sql.default_dir()`."""
  tokenizer = tokenizer_lib.default()
  return tuple(nl2sql.curate(rl_suite(count=count, seed=seed), lambda text: len(tokenizer.encode(text)))[0])


for _name, _drill in DRILL_SOURCES.items():
  sources.register_sft(_name, _drill_data(_name, _drill))
for _name, _count in RL_ONLY_SOURCES.items():
  sources.register_prompts(_name, functools.partial(rl_only, _count))
