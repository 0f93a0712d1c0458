"""experiments/cold_start_probe.py's grouping: a question's template and whether RL's prompts name its values."""

import types

from luckystar.data import nl2sql, suites

import cold_start_probe


def test_template_and_value_coverage():
  examples = suites.load('nl2sql', 'train')
  assert {cold_start_probe.template(e).split()[0] for e in examples} <= set(nl2sql.DOMAINS)
  for example in examples[::3]:
    domain, index = cold_start_probe.template(example).split()
    assert example.meta['db_id'].startswith(domain + '_')
    wording = [t for t in nl2sql.TEMPLATES if t.domain == domain][int(index)]
    text = wording.en if example.language == 'en' else wording.ko
    assert example.prompt.startswith(text.split('{')[0])   # the question is that template's
    values = set(example.meta['values'])
    assert cold_start_probe.covered(example, values | {'elsewhere'})
    assert cold_start_probe.covered(example, set()) == (not values)
    assert not values or not cold_start_probe.covered(example, values - {min(values)})
  verdict = lambda correct, format_ok: types.SimpleNamespace(correct=correct, format_ok=format_ok)
  groups = cold_start_probe.grouped([('sales 3', verdict(1.0, True)), ('hr 4', verdict(0.0, False)),
                                     ('sales 3', verdict(0.0, True)), ('sales 3', verdict(1.0, False))])
  assert dict(groups) == {'sales 3': ([True, False, True], [True, True, False]), 'hr 4': ([False], [False])}
  assert cold_start_probe.table([('sales 3', *groups['sales 3'])]) == ['| sales 3 | 3 | 2 | 2 |']
