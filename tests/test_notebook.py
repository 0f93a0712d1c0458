"""notebooks/quickstart.ipynb runs top to bottom (nbclient + ipykernel), as a user would run it."""

import os
import pathlib

import nbclient
import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / 'notebooks' / 'quickstart.ipynb'


def test_quickstart_notebook_executes(monkeypatch, tmp_path):
  monkeypatch.delenv('XLA_FLAGS', raising=False)   # the kernel gets one CPU device, not conftest's 8
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setenv('PYTHONPATH', os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]).rstrip(os.pathsep))
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', str(tmp_path / 'jax_cache'))
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbclient.NotebookClient(notebook, timeout=600, kernel_name='python3',
                          resources={'metadata': {'path': str(NOTEBOOK.parent)}}).execute()
  outputs = [o for cell in notebook.cells if cell.cell_type == 'code' for o in cell.outputs]
  assert not [o for o in outputs if o.output_type == 'error']
  text = ''.join(o.get('text', '') for o in outputs)
  assert 'max |logit difference|' in text and '[concise]' in text and 'actions:' in text
  assert any('image/png' in o.get('data', {}) for o in outputs)   # the reward plot
