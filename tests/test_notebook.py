"""notebooks/quickstart.ipynb runs top to bottom (nbclient + ipykernel), as a user would run it."""

import os
import pathlib
import tempfile

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
  assert 'max |logit difference|' in text and '[concise]' in text
  # The SQL cell: an execute_sql action the model wrote itself and the sandbox ran (a result with rows).
  assert 'actions: [\'{"tool_name": "execute_sql"' in text and 'rows)\nresponse:' in text, text
  assert any('image/png' in o.get('data', {}) for o in outputs)   # the correctness chart
  # No machine paths in what a reader sees (warnings, printed workdirs, database files).
  machine_paths = [p for p in (str(ROOT), tempfile.gettempdir(), os.path.expanduser('~')) if len(p) > 1]
  assert not [p for p in machine_paths if p in text], [p for p in machine_paths if p in text]
