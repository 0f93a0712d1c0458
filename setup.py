"""luckystar: the LuckyStar 111B recipe in one small JAX codebase.

Install (the CPU torch wheel first, so pip never pulls a CUDA build; README.md has the full steps):
    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    pip install -e ".[test,torch,serve,tensorboard]"
"""

import setuptools

setuptools.setup(
    name='luckystar',
    version='0.1.0',
    description='Hybrid SFT, RLVR (RLOO), DPO and int4 export for Korean/English tool-using agents, in JAX.',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    python_requires='>=3.11',
    packages=setuptools.find_packages(include=['luckystar', 'luckystar.*']),
    package_data={'luckystar': ['assets/*.model', 'assets/**/*']},
    install_requires=[
        'jax>=0.10,<0.11',        # newer jax needs Python >= 3.12
        'flax>=0.12.8,<0.13',
        'optax>=0.2.6,<0.3',
        'orbax-checkpoint>=0.12,<0.13',
        'grain>=0.2.18,<0.3',
        'tensorstore>=0.1.70',
        'sentencepiece>=0.2,<0.3',
        'tokenizers>=0.22,<0.24',  # a checkpoint's own tokenizer.json (luckystar.tokenizer.codecs)
        'huggingface-hub>=0.34,<3',  # 'org/name' from the local hub cache, offline; the `hf` CLI; tokenizers needs it too
        'ml-collections>=1.1,<2',
        'chex>=0.1.90',
        'aqtp>=0.9,<0.10',        # imports as aqt.jax.v2; the PyPI package `aqt` is unrelated
        'math-verify>=0.9,<0.10',
        'sqlglot>=30',
        'absl-py>=2',
        'numpy>=2',
        'safetensors>=0.6',
        'faker>=40',              # real Korean/English names, addresses, companies for generated data
        'tqdm>=4.66',
        'matplotlib>=3.9',
        'tensorboardX>=2.6',
    ],
    extras_require={
        'test': ['pytest>=8', 'openai>=1.40', 'pytest-xdist>=3.5', 'hypothesis>=6.100', 'nbclient>=0.10', 'nbformat>=5.10',
                 'ipykernel>=6', 'champ-dataset>=1.0',   # CHAMP competition math for the eval stage (MIT)
                 'cohere-melody>=0.15,<0.16'],   # Cohere's own renderer: the oracle of our Cohere layout (MIT)
        # torch stays a range that the local CPU wheel torch==2.13.0 satisfies.
        'torch': ['torch>=2.4,<2.15', 'transformers>=5,<6', 'compressed-tensors>=0.20'],
        # `python -m luckystar.serve` (tested: fastapi 0.165, starlette 1.10, uvicorn 0.55); httpx2 is the client
        # that Starlette's TestClient runs on (tests/test_serve.py, docs/serving.md).
        'serve': ['fastapi>=0.165,<1', 'uvicorn>=0.30,<1', 'httpx2>=2,<3'],
        # The same-run peer of experiments/benchmarks/rlvr_step.py (TRL's RLOOTrainer), pinned so that
        # measurements compare against one release.
        'bench': ['trl==1.16.0'],
        # `tensorboard --logdir=DIR`, the curves every run's summary points to (the events are tensorboardX's).
        'tensorboard': ['tensorboard>=2.18'],
    },
)
