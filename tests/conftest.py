"""Test session setup: 8 fake CPU devices so sharding tests run in-process (docs/models.md)."""

import os

os.environ['XLA_FLAGS'] = ' '.join(
    [os.environ.get('XLA_FLAGS', ''), '--xla_force_host_platform_device_count=8']).strip()
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_VERBOSITY', 'error')


import pytest  # noqa: E402  (after the environment above, which jax reads at import)


@pytest.fixture(scope='session')
def cohere_dir(tmp_path_factory):
  """A Cohere-format checkpoint directory (tests/cohere_checkpoint.py), built once per test process."""
  import cohere_checkpoint
  return cohere_checkpoint.build(tmp_path_factory.mktemp('cohere') / 'checkpoint')
