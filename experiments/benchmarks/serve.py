"""`luckystar.serve` answering CLIENTS concurrent clients against the same requests sent one at a time, in one run.

    python experiments/benchmarks/serve.py [--clients=16] [--requests=64] [--max_tokens=64]

A random model of the `bench` shape (vocab 8000, hidden 256, 4 layers; `model.get('bench')`) with the bundled
tokenizer, served in-process (`serve.build_app` under FastAPI's test client: no sockets, so the numbers are the
server's, not the network's). Every request is greedy with a fixed budget of --max_tokens tokens (random weights
rarely end a turn, so each reply runs its whole budget; the prompts differ). Sequential: one request after another.
Concurrent: --clients threads sending their share at once, which the scheduler decodes in one continuous-batching
rollout (each request joins at the next decode chunk). Both after a warm-up that compiles the programs each needs
(twice the concurrent run: which slot counts and admission sizes occur depends on timing). Prints requests/s and completion tokens/s of each and the
ratio; the goal (docs/serving.md) is >= 4x at 16 clients.
"""

import argparse
import concurrent.futures
import time

from fastapi.testclient import TestClient
import jax

from luckystar import model as model_lib
from luckystar import serve
from luckystar import tokenizer as tokenizer_lib
from luckystar.engine import loading


def requests(count: int, max_tokens: int) -> list[dict]:
  return [{'messages': [{'role': 'user', 'content': f'Question {i}: what is {i} + {2 * i}?'}], 'temperature': 0,
           'max_tokens': max_tokens} for i in range(count)]


def run(client: TestClient, bodies: list[dict], clients: int) -> tuple[float, int, list[str]]:
  """(seconds, completion tokens, replies) of sending `bodies` from `clients` threads (1: one at a time)."""
  def send(body):
    response = client.post('/v1/chat/completions', json=body)
    assert response.status_code == 200, response.text
    reply = response.json()
    return reply['usage']['completion_tokens'], reply['choices'][0]['message']['content']

  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(clients) as pool:
    results = list(pool.map(send, bodies))
  return time.perf_counter() - start, sum(tokens for tokens, _ in results), [text for _, text in results]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--clients', type=int, default=16)
  parser.add_argument('--requests', type=int, default=64)
  parser.add_argument('--max_tokens', type=int, default=64)
  args = parser.parse_args()
  config = model_lib.get('bench')
  model = loading.Model(config, model_lib.init(config, jax.random.key(0)), tokenizer_lib.default())
  client = TestClient(serve.build_app(model, 'bench'))
  bodies = requests(args.requests, args.max_tokens)
  run(client, bodies[:2], 1)                                  # compiles the one-row programs
  for _ in range(2):   # and the batched ones: the slots grow 1, 2, ... 16 and admit a varying number of rows
    run(client, bodies, args.clients)
  sequential_s, sequential_tokens, sequential_replies = run(client, bodies, 1)
  concurrent_s, concurrent_tokens, concurrent_replies = run(client, bodies, args.clients)
  same = sum(a == b for a, b in zip(sequential_replies, concurrent_replies))
  print(f'bench model, {args.requests} greedy requests of {args.max_tokens} tokens; jax {jax.__version__} on '
        f'{jax.devices()[0].platform} ({jax.device_count()} devices)')
  print('| clients | s | requests/s | tokens/s |')
  print('|---|---|---|---|')
  for clients, seconds, tokens in ((1, sequential_s, sequential_tokens), (args.clients, concurrent_s,
                                                                          concurrent_tokens)):
    print(f'| {clients} | {seconds:.1f} | {args.requests / seconds:.2f} | {tokens / seconds:.0f} |')
  print(f'concurrent / sequential: {sequential_s / concurrent_s:.2f}x requests/s; replies equal: {same}/{len(bodies)}')


if __name__ == '__main__':
  main()
