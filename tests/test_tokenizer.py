"""Bundled tokenizer: exact round-trip, no <unk>, chat template render → parse, loss masks."""

import pytest

from luckystar import tokenizer as tokenizer_lib

pytestmark = pytest.mark.fast

BILINGUAL = [
    '안녕하세요! 오늘 서울의 날씨는 맑습니다.',
    'The quick brown fox jumps over the lazy dog.',
    "SELECT d.name, AVG(e.salary) FROM employees e JOIN departments d ON e.dept_id = d.id "
    "WHERE e.hired >= '2024-01-01' GROUP BY d.name HAVING COUNT(*) > 3;",
    '{"tool_name": "execute_sql", "parameters": {"query": "SELECT 1", "limit": 10}}',
    '3.14159 × 2 = 6.28318; 1,234,567원; -42; 0x1F; 1e-9',
    'emoji 😀👍🏽🇰🇷 and symbols ☃ € ¥ ∑ √',
    '  indented\n\tcode\r\n  trailing spaces   ',
    '받침 있는 단어: 책을, 사과를, 물이, 학교가; 똠방각하 쀍 ㄱㄴㄷ ㅏㅑ',
    '혼합 mixed 文字 テキスト текст نص',
    '',
]


@pytest.fixture(scope='module')
def tok():
  return tokenizer_lib.default()


@pytest.mark.parametrize('text', BILINGUAL)
def test_exact_round_trip_and_no_unk(tok, text):
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert tok.sp.unk_id() not in ids
  assert not set(ids) & set(tok.special_ids.values())


def test_special_tokens_are_single_ids_never_produced_from_text(tok):
  assert len(set(tok.special_ids.values())) == len(tokenizer_lib.SPECIAL_TOKENS)
  for token in tokenizer_lib.SPECIAL_TOKENS:
    assert not set(tok.encode(f'hi {token} there')) & set(tok.special_ids.values())


def test_common_hangul_and_ascii_are_pieces_not_bytes(tok):
  for text in ('안녕하세요', '입니다', 'SELECT', '2+3*4=[14]'):
    pieces = [tok.sp.id_to_piece(i) for i in tok.encode(text)]
    assert not any(p.startswith('<0x') for p in pieces), pieces


CONVERSATION = [
    {'role': 'system', 'content': 'Database schema: employees(id, name, salary)'},
    {'role': 'user', 'content': '급여가 가장 높은 직원은 누구인가요?'},
    {'role': 'assistant', 'thinking': 'I should query the employees table ordered by salary.',
     'action': '{"tool_name": "execute_sql", "parameters": {"query": "SELECT name FROM employees '
               'ORDER BY salary DESC LIMIT 1"}}'},
    {'role': 'tool', 'content': '[["김민수"]]'},
    {'role': 'assistant', 'thinking': 'The top earner is 김민수.', 'response': '급여가 가장 높은 직원은 김민수입니다.'},
]


@pytest.mark.parametrize('mode', tokenizer_lib.MODES)
def test_loss_mask_covers_exactly_the_assistant_tokens(tok, mode):
  ids, mask = tok.render(CONVERSATION, mode)
  assert len(ids) == len(mask)
  expected = []  # rebuild the mask turn by turn from the role tokens
  role, position = None, 0
  start, assistant = tok.special_ids[tokenizer_lib.START_OF_TURN], tok.special_ids['<|ASSISTANT|>']
  for i, token in enumerate(ids):
    if token == start:
      role, position = ids[i + 1], 0
    expected.append(int(role == assistant and position >= 2))
    position += 1
  assert mask == expected
  assert sum(mask) > 0
  # Every masked span decodes to exactly the assistant sections, tool and user text stay unmasked.
  masked_text = tok.decode([t for t, m in zip(ids, mask) if m])
  assert '김민수입니다' in masked_text and 'SELECT name' in masked_text
  assert '[["김민수"]]' not in masked_text and '누구인가요' not in masked_text


def test_modes_differ_only_in_the_preamble(tok):
  reasoning, _ = tok.render(CONVERSATION[:2], 'reasoning')
  concise, _ = tok.render(CONVERSATION[:2], 'concise')
  assert reasoning != concise
  assert tok.decode(reasoning).startswith(tokenizer_lib.PREAMBLES['reasoning'])
  assert tok.decode(concise).startswith(tokenizer_lib.PREAMBLES['concise'])
  assert tok.decode(reasoning).endswith(CONVERSATION[1]['content'])


@pytest.mark.parametrize('turn', [m for m in CONVERSATION if m['role'] == 'assistant'] + [
    {'role': 'assistant', 'response': 'Paris.'},
    {'role': 'assistant', 'thinking': '2 + 3 = 5', 'response': '정답은 5입니다.'},
])
def test_render_then_parse_returns_the_sections(tok, turn):
  prompt, _ = tok.render(CONVERSATION[:2], 'reasoning', add_generation_prompt=True)
  full, _ = tok.render(CONVERSATION[:2] + [turn], 'reasoning')
  assert full[:len(prompt)] == prompt
  parsed = tok.parse_assistant(full[len(prompt):])
  assert parsed.ended
  for section in ('thinking', 'action', 'response'):
    assert getattr(parsed, section) == turn.get(section)


def test_parse_tolerates_unfinished_generation(tok):
  start, end = tokenizer_lib.SECTION_TOKENS['thinking']
  ids = [tok.special_ids[start], *tok.encode('step one'), tok.special_ids[end],
         tok.special_ids['<|START_RESPONSE|>'], *tok.encode('partial')]
  parsed = tok.parse_assistant(ids)
  assert parsed == tokenizer_lib.AssistantTurn(thinking='step one', response='partial', ended=False)


def test_render_rejects_bad_conversations(tok):
  with pytest.raises(ValueError, match='unknown mode'):
    tok.render(CONVERSATION, 'verbose')
  with pytest.raises(ValueError, match='system message'):
    tok.render([CONVERSATION[1], CONVERSATION[0]], 'concise')
  with pytest.raises(ValueError, match='none of the sections'):
    tok.render([{'role': 'assistant', 'content': 'hi'}], 'concise')


def test_retraining_is_deterministic(tok):
  from luckystar.data import corpus
  lines = list(corpus.tokenizer_corpus(seed=0, num_lines=2000))
  assert lines == list(corpus.tokenizer_corpus(seed=0, num_lines=2000))
  assert tokenizer_lib.train(lines, vocab_size=1000) == tokenizer_lib.train(lines, vocab_size=1000)
