"""OpenAI-compatible chat completions over anything `luckystar.load` reads (docs/training.md), queried the way a
vLLM deployment of our export is.

    python -m luckystar.serve --init_from=tiny-sft --port=8000 [--host=127.0.0.1] [--model_name=NAME]
        [--chat_format=auto] [--tools] [--max_tokens=256] [--max_request_bytes=4194304]

Loads the model, compiles it once (a greedy reply, a sampled one and a guided choice), then prints one line,
`luckystar.serve: <model> on http://HOST:PORT`, and serves (`--port=0` picks a free port; the line names it):

- `POST /v1/chat/completions`: OpenAI's request and response. Non-standard fields: `mode` ('reasoning' or
  'concise', also read from vLLM's `chat_template_kwargs`), and vLLM's `guided_choice: [...]` /
  `structured_outputs: {"choice": [...]}`, which score each choice instead of sampling (`Model.reply_logprobs`).
- `GET /v1/models` (the one served name) and `GET /health` (200: the model is loaded and compiled).

Decisions (docs/serving.md says them to users):
- The mode comes from `mode`, else `chat_template_kwargs.mode`, else `chat_template_kwargs.enable_thinking`
  (vLLM's switch: true is reasoning), else a first system message that is one of the two preambles (dropped,
  so the preamble is not rendered twice), else concise (`tokenizer.CLIENT_DEFAULT_MODE`, as the exported chat
  template). Any other system message follows the mode's preamble, and `tools` (function schemas) come
  between them, as `Tokenizer.render` and the exported chat template lay them out: a vLLM server of our export
  renders the same prompt.
- Sampling defaults are OpenAI's and vLLM's on our export (its generation_config.json sets none):
  temperature 1, top_p 1; `temperature: 0` is greedy. A guided choice never samples.
- Refused with 400 rather than ignored: `stop` sequences (the model stops at the end of its turn), `n` past
  MAX_N. Other OpenAI fields (penalties, logprobs, response_format, tool_choice) are accepted and ignored.
- `stream: true` is server-sent events of chat.completion.chunk objects, a delta per decode chunk holding only
  text later tokens cannot change (`_stable`), so the deltas add up to the non-streamed reply.
- One scheduler thread owns the model: it runs the request first in line as a continuous-batching rollout, and
  the requests behind it with equal sampling settings join it as slots free up (at the next decode chunk; the
  slots grow to MAX_SLOTS when needed), each answered as soon as its rows end; each row with its own conversation, mode,
  budget, seed and row id (`Model.chat`), so a reply does not depend on what else was asked at the same moment.
  A request that cannot join (other settings, a guided choice, a prompt past the rollout's cache) waits first in
  line. `n` choices are n rows. A request whose client hung up is skipped, and a reply being generated stops at
  the next decode chunk (DECODE_CHUNK tokens); `/health` and `/v1/models` answer on the event loop, never behind
  the queue.
- Bounded work per request: the body is at most --max_request_bytes (413), nested at most
  `files.MAX_JSON_DEPTH` deep, its strings valid Unicode (400 naming the field); the prompt, prompt + budget
  and prompt + each guided choice fit the context, and a guided choice has at most MAX_CHOICES choices (400
  naming the field and the limit). Sampling values are traced (`sampling.SamplingSettings`) and the decode
  loop runs in fixed chunks over a power-of-two cache, so new temperatures and budgets reuse a few compiled
  programs instead of compiling (and keeping) one each.
- Without `--tools` an action comes back as OpenAI `tool_calls` (finish_reason 'tool_calls'); with it, the
  built-in calculator runs inside the reply (`sampling.agent_tools`) and the final answer comes back, with the
  calls that ran and their results in the non-standard `executed_tool_calls`.
"""

import asyncio
import collections
import dataclasses
import http
import json
import queue
import secrets
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable, Literal

from absl import app
from absl import flags
from absl import logging
import anyio
import fastapi
import fastapi.exceptions
import fastapi.responses
import fastapi.routing
import pydantic
import starlette.concurrency
import starlette.exceptions
import starlette.requests
import starlette.responses
import uvicorn

from luckystar import errors
from luckystar import files
from luckystar import sampling
from luckystar import tokenizer as tokenizer_lib
from luckystar.engine import loading
from luckystar.tools import calls as calls_lib
from luckystar.tokenizer import formats

DEFAULT_MAX_TOKENS = 256
MAX_REQUEST_BYTES = 4 << 20     # a full 128k-token context is ~0.5 MB of text; the default --max_request_bytes
MAX_CHOICES = 128               # a judge asks 2; each choice is a forward pass of prompt + choice
MAX_N = 16                      # choices per request (`n`): each is a row of the batch
MAX_SLOTS = 16                  # rows one rollout decodes at once (more requests wait for a free slot)
DECODE_CHUNK = 32               # tokens between checks that the client still waits (and the decode program's width)
GREEDY_BELOW = 1e-5             # vLLM's: a smaller temperature is greedy (dividing by it overflows the logits)
DEFAULT_MODE = tokenizer_lib.CLIENT_DEFAULT_MODE
_PREAMBLE_MODES = {text: mode for mode, text in tokenizer_lib.PREAMBLES.items()}
_ERROR_TYPES = {400: 'BadRequestError', 404: 'NotFoundError', 405: 'MethodNotAllowedError',
                499: 'ClientClosedRequestError', 500: 'InternalServerError'}   # 499: nginx's; the client is gone


class _Body(pydantic.BaseModel):
  model_config = pydantic.ConfigDict(extra='ignore')   # OpenAI fields we do not use are accepted


class TextPart(_Body):
  type: Literal['text']
  text: str


class Function(_Body):
  name: str
  arguments: str      # JSON text of an object, as OpenAI writes it


class ToolCall(_Body):
  id: str | None = None
  type: Literal['function'] = 'function'
  function: Function


class Tool(_Body):
  """A function the model may call: its schema is rendered as the client sent it (keys and order kept)."""
  type: Literal['function'] = 'function'
  function: dict[str, Any]


class Message(_Body):
  role: str
  content: str | list[TextPart] | None = None
  reasoning_content: str | None = None    # an assistant turn's thinking section (vLLM's name)
  tool_calls: list[ToolCall] | None = None


class StructuredOutputs(_Body):
  model_config = pydantic.ConfigDict(extra='allow')   # json / regex / grammar: refused by name below
  choice: list[str] | None = None


class StreamOptions(_Body):
  include_usage: bool = False


class ChatRequest(_Body):
  """The body of POST /v1/chat/completions."""
  model: str | None = None
  messages: list[Message] = pydantic.Field(min_length=1)
  mode: str | None = None
  chat_template_kwargs: dict[str, Any] | None = None
  tools: list[Tool] | None = None
  temperature: float | None = pydantic.Field(None, ge=0, allow_inf_nan=False)   # 1e400 parses as inf
  top_p: float | None = pydantic.Field(None, gt=0, le=1, allow_inf_nan=False)
  top_k: int | None = pydantic.Field(None, ge=-1)          # vLLM's; -1 and 0 are off
  max_tokens: int | None = pydantic.Field(None, ge=1)
  max_completion_tokens: int | None = pydantic.Field(None, ge=1)   # OpenAI's newer name; wins over max_tokens
  seed: int | None = None
  n: int = pydantic.Field(1, ge=1, le=MAX_N)
  stop: str | list[str] | None = None
  stream: bool | None = None
  stream_options: StreamOptions | None = None
  guided_choice: list[str] | None = None
  structured_outputs: StructuredOutputs | None = None


class ServeError(Exception):
  """A request the server answers with an HTTP error and an OpenAI error body."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status


def error_response(status: int, message: str) -> fastapi.responses.JSONResponse:
  """OpenAI's (and vLLM's) error body."""
  error_type = _ERROR_TYPES.get(status) or http.HTTPStatus(status).phrase.replace(' ', '') + 'Error'
  return fastapi.responses.JSONResponse(
      {'error': {'message': message, 'type': error_type, 'param': None, 'code': status}}, status_code=status)


def _no_tools(row: int, action: str) -> None:
  """The tool_fn without --tools: every action ends the reply and goes back as tool_calls."""
  return None


def conversation(request: ChatRequest) -> tuple[str, list[dict]]:
  """(mode, messages as `Tokenizer.render` reads them) of a request (module docstring: how the mode is chosen)."""
  mode, kwargs = request.mode, request.chat_template_kwargs or {}
  if mode is None:
    mode = kwargs.get('mode')
  if mode is None and kwargs.get('enable_thinking') is not None:
    if not isinstance(kwargs['enable_thinking'], bool):
      raise ServeError(400, f'chat_template_kwargs.enable_thinking: true or false, got '
                            f'{json.dumps(kwargs["enable_thinking"])[:100]}')
    mode = tokenizer_lib.mode_of(kwargs['enable_thinking'])
  if mode is not None and mode not in tokenizer_lib.MODES:
    raise ServeError(400, f'mode: unknown mode {mode!r}; expected one of {list(tokenizer_lib.MODES)}')
  try:   # the one conversion Model.chat makes too; its errors name the field
    messages = tokenizer_lib.from_openai([message.model_dump(exclude_none=True) for message in request.messages])
  except ValueError as e:
    raise ServeError(400, str(e)) from None
  if messages and messages[0]['role'] == 'system' and messages[0]['content'].strip() in _PREAMBLE_MODES:
    mode = mode or _PREAMBLE_MODES[messages[0]['content'].strip()]
    messages = messages[1:]
  tools = [tool.model_dump() for tool in request.tools or ()]
  return mode or DEFAULT_MODE, tokenizer_lib.with_tools(messages, tools)


def _choices(request: ChatRequest) -> tuple[str, list[str] | None]:
  """(the field it came in, the guided choice) of a request (vLLM's older `guided_choice` or newer
  `structured_outputs.choice`)."""
  structured = request.structured_outputs
  if structured is not None and (other := sorted(structured.model_extra or {})):
    raise ServeError(400, f'structured_outputs: only "choice" is supported, not {other}')
  # A client may send both spellings, to reach old and new vLLM alike (our judge does); they must agree.
  if (structured is not None and structured.choice is not None and request.guided_choice is not None
      and structured.choice != request.guided_choice):
    raise ServeError(400, 'guided_choice and structured_outputs.choice give different choices; give one')
  field, choices = (('guided_choice', request.guided_choice) if request.guided_choice is not None else
                    ('structured_outputs.choice', structured and structured.choice))
  if choices is not None and not choices:
    raise ServeError(400, 'the guided choice is empty; give at least one choice')
  if choices is not None and len(choices) > MAX_CHOICES:
    raise ServeError(400, f'{field}: {len(choices)} choices, more than the {MAX_CHOICES} a request may give; '
                          f'split them over several requests')
  return field, choices


def _tool_calls(calls: list[dict]) -> list[dict]:
  return [{'id': f'call_{uuid.uuid4().hex[:24]}', 'type': 'function',
           'function': {'name': call['tool_name'], 'arguments': json.dumps(call['parameters'], ensure_ascii=False)}}
          for call in calls]


def reply_message(generation: loading.Generation, ran_tools: bool = False) -> tuple[dict, str]:
  """(OpenAI message, finish_reason) of a generated reply: content is the response section (a reply without
  one: its decoded text, or '' where it holds only thinking); reasoning_content the thinking; an action the
  tools did not answer comes back as tool_calls. ran_tools (--tools): the message also has `executed_tool_calls`,
  the calls that ran inside the reply, in order, each as a tool_call with its `result`."""
  rollout = generation.rollout
  calls = (calls_lib.parse_calls(generation.actions[-1])
           if rollout.stop_reason in ('action', 'tool_limit') else None)
  if generation.response is not None or calls is not None:
    content = generation.response
  else:
    content = '' if rollout.final_turn.thinking is not None else generation.text
  message = {'role': 'assistant', 'content': content, 'reasoning_content': generation.thinking,
             'tool_calls': _tool_calls(calls) if calls is not None else []}
  finish = 'length' if rollout.overlong else 'tool_calls' if calls is not None else 'stop'
  if ran_tools:
    message['executed_tool_calls'] = [
        {**call, 'result': result}
        for action, result in zip(generation.actions, rollout.tool_results)
        for call in _tool_calls(calls_lib.parse_calls(action) or [])]
  return message, finish


@dataclasses.dataclass
class _Job:
  """One request's work for the scheduler: `rows` replies to one conversation (n), or a guided choice."""
  messages: list[dict]
  mode: str
  rows: int = 1
  prompt_tokens: int = 0
  max_new_tokens: int = 0
  settings: tuple = ()                # (temperature, top_k, top_p): requests with equal settings decode together
  seed: int = 0
  choices: list[str] | None = None
  gone: threading.Event = dataclasses.field(default_factory=threading.Event)
  follow: Callable[[int, sampling.Rollout], Any] | None = None   # a streamed reply: (choice index, reply so far)
  done: threading.Event = dataclasses.field(default_factory=threading.Event)
  result: Any = None
  error: BaseException | None = None

  def finish(self, result: Any = None, error: BaseException | None = None) -> None:
    if error is None and self.gone.is_set():
      error = ServeError(499, 'the client closed the connection before its reply was ready')
    self.result, self.error = result, error
    self.done.set()


class _Completions:
  """The endpoints' work on one model. A scheduler thread owns the model and runs one continuous-batching
  rollout at a time, which the waiting requests of its sampling settings join as slots free up (`_generate`),
  so concurrent requests share the decode slots."""

  def __init__(self, model: loading.Model, model_name: str, tools: bool, max_tokens: int):
    self.model, self.model_name, self.max_tokens, self.tools = model, model_name, max_tokens, tools
    self.tool_fn = None if tools else _no_tools      # None: Model.chat's built-in calculator
    self.created = int(time.time())
    self.lock = threading.Lock()      # held while the scheduler runs a batch (a test holds it to fill the queue)
    self.waiting: queue.SimpleQueue[_Job] = queue.SimpleQueue()
    self.scheduler: threading.Thread | None = None
    self.starting = threading.Lock()
    self.held: collections.deque[_Job] = collections.deque()   # taken from the queue, first in line (scheduler's)
    self.running: list[_Job] = []     # the jobs of the scheduler's current rollout

  def models(self) -> dict:
    return {'object': 'list', 'data': [{
        'id': self.model_name, 'object': 'model', 'created': self.created, 'owned_by': 'luckystar',
        'root': self.model_name, 'parent': None, 'max_model_len': self.model.config.max_position_embeddings}]}

  def prepare(self, request: ChatRequest) -> tuple[_Job, int]:
    """(the job of a request, its prompt's token count), checked within every bound; a ServeError if not."""
    if request.model is not None and request.model != self.model_name:
      raise ServeError(404, f'The model `{request.model[:200]}` does not exist; this server serves '
                            f'`{self.model_name}`.')
    if request.stop:
      raise ServeError(400, 'stop: stop sequences are not supported; the model stops at the end of its turn')
    mode, messages = conversation(request)
    field, choices = _choices(request)
    try:
      prompt, _ = self.model.tokenizer.render(messages, mode, add_generation_prompt=True)
    except ValueError as e:   # a system message after the first, a tool turn where it cannot go
      raise ServeError(400, f'messages: {e}') from None
    context = self.model.config.max_position_embeddings
    requested = request.max_completion_tokens or request.max_tokens
    budget_field = 'max_completion_tokens' if request.max_completion_tokens else 'max_tokens'
    if requested is not None and len(prompt) + requested > context:
      raise ServeError(400, f"{budget_field}: This model's maximum context length is {context} tokens. However, you "
                            f'requested {len(prompt) + requested} tokens ({len(prompt)} in the messages, {requested} '
                            f'in the completion). Please reduce the length of the messages or completion.')
    if len(prompt) >= context:
      raise ServeError(400, f"messages: This model's maximum context length is {context} tokens; the messages "
                            f'alone take {len(prompt)}. Please reduce the length of the messages.')
    if choices is not None:
      self._check_choices(messages, mode, field, choices)
      return _Job(messages, mode, rows=request.n, prompt_tokens=len(prompt), choices=choices), len(prompt)
    temperature = 1.0 if request.temperature is None else request.temperature
    temperature = 0.0 if temperature < GREEDY_BELOW else temperature
    # top_k at or past the vocabulary keeps everything: off (one program rather than one per value)
    top_k = request.top_k if request.top_k and 0 < request.top_k < self.model.config.vocab_size else 0
    top_p = 1.0 if request.top_p is None else request.top_p
    # No seed: a fresh draw per request, as OpenAI does (greedy replies ignore it).
    seed = (secrets.randbits(31) if request.seed is None else request.seed % 2**31) if temperature else 0
    settings = (0.0, 0, 1.0) if not temperature else (temperature, top_k, top_p)
    return _Job(messages, mode, rows=request.n, prompt_tokens=len(prompt), settings=settings, seed=seed,
                max_new_tokens=requested or min(self.max_tokens, context - len(prompt))), len(prompt)

  def submit(self, job: _Job) -> _Job:
    """Queues the job for the scheduler (started on the first job)."""
    with self.starting:
      if self.scheduler is None:
        self.scheduler = threading.Thread(target=self._schedule, name='luckystar.serve scheduler', daemon=True)
        self.scheduler.start()
    self.waiting.put(job)
    return job

  def complete(self, request: ChatRequest, gone: threading.Event | None = None) -> dict:
    """The reply to `request`; gone: set once its client hung up (the work then stops where it can)."""
    if gone is not None and gone.is_set():
      raise ServeError(499, 'the client closed the connection before its reply was ready')
    job, prompt_tokens = self.prepare(request)
    if request.stream:
      raise ServeError(400, 'stream: this call answers whole replies; the endpoint streams')
    job.gone = gone or job.gone
    self.submit(job).done.wait()
    if job.error is not None:
      raise job.error
    choices, completion_tokens = [], 0
    for index, result in enumerate(job.result):
      message, finish, tokens = result
      choices.append({'index': index, 'message': message, 'logprobs': None, 'finish_reason': finish})
      completion_tokens += tokens
    return {'id': f'chatcmpl-{uuid.uuid4().hex}', 'object': 'chat.completion', 'created': int(time.time()),
            'model': self.model_name, 'choices': choices,
            'usage': {'prompt_tokens': prompt_tokens, 'completion_tokens': completion_tokens,
                      'total_tokens': prompt_tokens + completion_tokens}}

  def _next(self) -> _Job | None:
    """The job first in line (held back by a rollout it could not join, else the queue's), None if none waits."""
    if self.held:
      return self.held.popleft()
    try:
      return self.waiting.get_nowait()
    except queue.Empty:
      return None

  def _schedule(self) -> None:
    """The scheduler thread: once the model is free, runs the job first in line, the jobs behind it joining its
    rollout as slots free up (`_generate`)."""
    while True:
      first = self.held.popleft() if self.held else self.waiting.get()
      with self.lock:
        self.running = [first]
        try:
          self._run(first)
        except BaseException as e:   # never leave a request waiting
          logging.exception('luckystar.serve: the scheduler failed')
          for job in self.running:
            if not job.done.is_set():
              job.finish(error=e)

  def _run(self, first: _Job) -> None:
    if first.gone.is_set():   # a client that left while its request queued: skipped
      logging.warning('luckystar.serve: stopped a queued request before it ran: its client left')
      first.finish()
    elif first.choices is not None:
      try:
        first.finish(self._choose(first.messages, first.mode, first.choices) * first.rows)
      except Exception as e:
        first.finish(error=e)
    else:
      self._generate(first)

  def _generate(self, first: _Job) -> None:
    """The replies of `first` and of the jobs behind it with its sampling settings, as one continuous-batching
    rollout: a job joins at the next decode chunk once slots are free, and is answered as soon as its rows end.
    Each row decodes with its own conversation, mode, budget, seed and row id (`Model.chat`), so each reply is
    the one it would be alone. The slots grow to MAX_SLOTS once the rows outnumber them."""
    owners = [(first, row) for row in range(first.rows)]
    replies: dict[int, list] = {id(first): [None] * first.rows}

    def more(free: int, cache: int) -> list[tuple]:
      added = []
      while (job := self._next()) is not None:
        if job.gone.is_set():
          logging.warning('luckystar.serve: stopped a queued request before it ran: its client left')
          job.finish()
          continue
        if (job.choices is not None or job.settings != first.settings or job.rows > free
            or job.prompt_tokens + job.max_new_tokens > cache):
          self.held.appendleft(job)   # first in line: no job behind it joins before it runs
          break
        free -= job.rows
        self.running.append(job)
        replies[id(job)] = [None] * job.rows
        owners.extend((job, row) for row in range(job.rows))
        added += [(job.messages, job.mode, job.max_new_tokens, job.seed, row) for row in range(job.rows)]
      return added

    def done(index: int, generation: loading.Generation) -> None:
      job, row = owners[index]
      try:
        replies[id(job)][row] = (*reply_message(generation, self.tools), len(generation.rollout.token_ids))
      except Exception as e:   # this job's failure, not its neighbours'
        job.finish(error=e)
      if not job.done.is_set() and all(reply is not None for reply in replies[id(job)]):
        job.finish(replies[id(job)])

    def check():
      if all(job.gone.is_set() for job in self.running if not job.done.is_set()):
        logging.warning('luckystar.serve: stopped %d replies at a decode chunk: their clients left', len(owners))
        raise ServeError(499, 'the client closed the connection before its reply was ready')

    def follow(index: int, so_far: sampling.Rollout) -> bool:
      job, row = owners[index]
      if job.gone.is_set():
        logging.warning('luckystar.serve: stopped a reply after %d tokens: its client left', len(so_far.token_ids))
        return False
      if job.follow is not None:
        job.follow(row, so_far)
      return True

    temperature, top_k, top_p = first.settings
    try:
      check()
      self.model.chat(
          [first.messages] * first.rows, first.mode, max_new_tokens=first.max_new_tokens, temperature=temperature,
          top_k=top_k, top_p=top_p, seed=first.seed, tools=self.tool_fn, decode_chunk=DECODE_CHUNK, check=check,
          follow=follow, slots=MAX_SLOTS, more=more, done=done)
    except Exception as e:
      for job in self.running:
        if not job.done.is_set():
          job.finish(error=e)

  def _check_choices(self, messages: list[dict], mode: str, field: str, choices: list[str]) -> None:
    """Each choice as the reply must fit the context (scoring one past it fails, and a huge one costs memory)."""
    context = self.model.config.max_position_embeddings
    for i, choice in enumerate(choices):
      length = len(self.model.tokenizer.render([*messages, {'role': 'assistant', 'response': choice}], mode)[0])
      if length > context:
        raise ServeError(400, f"{field}[{i}]: This model's maximum context length is {context} tokens; the "
                              f'messages with this choice as the reply take {length}. Please shorten the choice or '
                              f'the messages.')

  def _choose(self, messages: list[dict], mode: str, choices: list[str]) -> list[tuple[dict, str, int]]:
    """The most likely choice (the first of equals), scored as the whole reply (every one of n the same)."""
    best = choices[int(self.model.reply_logprobs(messages, choices, mode).argmax())]
    _, reply_mask = self.model.tokenizer.render([{'role': 'assistant', 'response': best}], mode)
    message = {'role': 'assistant', 'content': best, 'reasoning_content': None, 'tool_calls': []}
    return [(message, 'stop', sum(reply_mask))]   # the tokens of the reply's turn after its header

  def warm_up(self) -> None:
    """Compiles the programs a short greedy reply, a sampled one and a two-way choice use."""
    hello = [Message(role='user', content='Hello')]
    self.complete(ChatRequest(messages=hello, temperature=0))
    self.complete(ChatRequest(messages=hello, temperature=1, max_tokens=DECODE_CHUNK))
    self.complete(ChatRequest(messages=hello, guided_choice=['YES', 'NO']))


def _sse(value: dict) -> bytes:
  return b'data: ' + json.dumps(value, ensure_ascii=False).encode() + b'\n\n'


def _stable(text: str | None) -> str:
  """The part of a partly decoded text that more tokens cannot change: without a trailing replacement character
  (the first bytes of a multi-byte UTF-8 character whose last bytes are still to come)."""
  return (text or '').rstrip('\ufffd')


class _Deltas:
  """A streamed choice: what of its reasoning and content the client has, and the delta that brings it up to a
  reply so far (only text every later decoding extends, so the deltas add up to the whole reply)."""

  def __init__(self):
    self.sent = {'reasoning_content': '', 'content': ''}

  def delta(self, reasoning: str | None, content: str | None) -> dict:
    out = {}
    for name, text in (('reasoning_content', reasoning), ('content', content)):
      if text and text.startswith(self.sent[name]) and len(text) > len(self.sent[name]):
        out[name], self.sent[name] = text[len(self.sent[name]):], text
    return out


async def stream_completion(completions: _Completions, request: ChatRequest, gone: threading.Event
                            ) -> Any:
  """The server-sent events of a streamed reply (OpenAI's chat.completion.chunk): a chunk with the role, deltas
  of reasoning_content and content as the decode chunks come, a last chunk per choice with its tool_calls and
  finish_reason, usage if stream_options.include_usage, then [DONE]."""
  job, prompt_tokens = await starlette.concurrency.run_in_threadpool(completions.prepare, request)
  loop = asyncio.get_running_loop()
  updates: asyncio.Queue = asyncio.Queue()
  job.gone = gone
  job.follow = lambda row, so_far: loop.call_soon_threadsafe(
      updates.put_nowait, (row, _stable(so_far.thinking), _stable(so_far.final_turn.response)))
  finished = lambda: loop.call_soon_threadsafe(updates.put_nowait, None)

  async def events():
    head = {'id': f'chatcmpl-{uuid.uuid4().hex}', 'object': 'chat.completion.chunk', 'created': int(time.time()),
            'model': completions.model_name}
    chunk = lambda choices, **more: _sse({**head, 'choices': choices, **more})
    yield chunk([{'index': i, 'delta': {'role': 'assistant', 'content': ''}, 'logprobs': None, 'finish_reason': None}
                 for i in range(job.rows)])
    deltas = [_Deltas() for _ in range(job.rows)]
    waiter = threading.Thread(target=lambda: (job.done.wait(), finished()), daemon=True)
    completions.submit(job)
    waiter.start()
    while (update := await updates.get()) is not None:
      row, reasoning, content = update
      if delta := deltas[row].delta(reasoning, content):
        yield chunk([{'index': row, 'delta': delta, 'logprobs': None, 'finish_reason': None}])
    if job.error is not None:
      status = getattr(job.error, 'status', 500)
      if status == 500:
        logging.error('luckystar.serve: a streamed reply failed: %r', job.error)
      yield _sse({'error': {'message': str(job.error)[:300], 'type': _ERROR_TYPES.get(status, 'InternalServerError'),
                            'param': None, 'code': status}})
      return
    completion_tokens = 0
    for row, (message, finish, tokens) in enumerate(job.result):
      completion_tokens += tokens
      delta = deltas[row].delta(message['reasoning_content'], message['content'])
      if message['tool_calls']:
        delta['tool_calls'] = [{'index': i, **call} for i, call in enumerate(message['tool_calls'])]
      if 'executed_tool_calls' in message:
        delta['executed_tool_calls'] = message['executed_tool_calls']
      yield chunk([{'index': row, 'delta': delta, 'logprobs': None, 'finish_reason': finish}])
    if request.stream_options is not None and request.stream_options.include_usage:
      yield chunk([], usage={'prompt_tokens': prompt_tokens, 'completion_tokens': completion_tokens,
                             'total_tokens': prompt_tokens + completion_tokens})
    yield b'data: [DONE]\n\n'

  return _EventStream(events(), gone)


class _EventStream(starlette.responses.StreamingResponse):
  """Server-sent events whose `gone` is set once the response ends, finished or cut off by the client (the
  scheduler then drops its rows at the next decode chunk)."""

  def __init__(self, events: Any, gone: threading.Event):
    super().__init__(events, media_type='text/event-stream', headers={'Cache-Control': 'no-cache'})
    self.gone = gone

  async def __call__(self, scope, receive, send) -> None:
    try:
      await super().__call__(scope, receive, send)
    finally:
      self.gone.set()


def _problem(error: dict) -> str:
  """One of pydantic's errors about the body as 'messages[0].content: what is wrong'."""
  if error['type'] == 'json_invalid':
    return f'the body is not valid JSON: {error.get("ctx", {}).get("error", error["msg"])}'
  where = ''.join(f'[{part}]' if isinstance(part, int) else f'.{part}' for part in error['loc'][1:]).lstrip('.')
  return f'{where or "body"}: {error["msg"]}'


def _unencodable_field(value: Any) -> tuple[str, str] | None:
  """(where, the string) of the first string in a parsed body that is not valid Unicode (a lone surrogate, which
  JSON's \\ud800 escape carries and the tokenizer cannot take), as 'messages[1].content'; None if there is none."""
  if files.unencodable(value) is None:
    return None
  stack = [('', value)]
  while stack:
    where, item = stack.pop()
    if isinstance(item, str) and files.unencodable(item) is not None:
      return where or 'body', item
    if isinstance(item, dict):
      for key, child in reversed(item.items()):
        if files.unencodable(key) is not None:
          return f'{where or "body"} (a key)', key
        stack.append((f'{where}.{key}' if where else key, child))
    elif isinstance(item, list):
      stack.extend((f'{where}[{i}]', child) for i, child in reversed(list(enumerate(item))))
  return None


def parse_body(body: bytes) -> Any:
  """A request body's JSON within `files.loads`' bounds (depth, no NaN), its strings valid Unicode; a 400
  ServeError naming the problem (and the field) otherwise."""
  try:
    value = files.loads(body, 'body', check_text=False)
  except errors.InvalidFile as e:
    raise ServeError(400, str(e).replace('body: invalid JSON:', 'the body is not valid JSON:', 1)) from None
  if (bad := _unencodable_field(value)) is not None:
    where, text = bad
    raise ServeError(400, f'{where}: not valid Unicode text (a lone surrogate, in {ascii(text[:40])}); send UTF-8 '
                          f'text')
  return value


class _ParsedRequest(starlette.requests.Request):
  """A request whose body was read and parsed already (`_BoundedBodyRoute`)."""

  def __init__(self, request: starlette.requests.Request, body: bytes, value: Any):
    super().__init__(request.scope, request.receive)
    self._read = body, value

  async def body(self) -> bytes:
    return self._read[0]

  async def json(self) -> Any:
    return self._read[1]


class _BoundedBodyRoute(fastapi.routing.APIRoute):
  """A route that reads its JSON body within the app's size limit and parses it with `parse_body` before FastAPI
  validates it: FastAPI's own json.loads recurses once per nesting level (a deep body is a RecursionError, a
  500) and passes lone surrogates on (the tokenizer's cast error, a 500)."""

  def get_route_handler(self) -> Callable:
    handler = super().get_route_handler()

    async def bounded(request: starlette.requests.Request) -> starlette.responses.Response:
      limit = request.app.state.max_request_bytes
      too_large = ServeError(413, f'the body is larger than {limit:,} bytes, the most this server reads '
                                  f'(--max_request_bytes); send a shorter request')
      declared = request.headers.get('content-length', '')
      if declared.isdigit() and int(declared) > limit:
        raise too_large
      chunks, size = [], 0
      try:
        async for chunk in request.stream():
          size += len(chunk)
          if size > limit:
            raise too_large
          chunks.append(chunk)
      except starlette.requests.ClientDisconnect:
        raise ServeError(499, 'the client closed the connection before sending the whole body') from None
      body = b''.join(chunks)
      value = await starlette.concurrency.run_in_threadpool(parse_body, body) if body else None
      return await handler(_ParsedRequest(request, body, value))

    return bounded


async def _unless_gone(request: starlette.requests.Request, work: Callable, *args: Any) -> Any:
  """work(*args, gone) on a worker thread, `gone` set once the client disconnects (the work checks it)."""
  gone = threading.Event()

  async def watch():   # the body is read: the next message is the disconnect
    while (await request.receive())['type'] != 'http.disconnect':
      pass
    gone.set()

  result = failure = None
  async with anyio.create_task_group() as watching:
    watching.start_soon(watch)
    try:
      result = await starlette.concurrency.run_in_threadpool(work, *args, gone)
    except Exception as e:   # raised here, not wrapped in the task group's ExceptionGroup
      failure = e
    finally:
      watching.cancel_scope.cancel()
  if failure is not None:
    raise failure
  return result


def build_app(model: loading.Model, model_name: str, *, tools: bool = False, max_tokens: int = DEFAULT_MAX_TOKENS,
              max_request_bytes: int = MAX_REQUEST_BYTES) -> fastapi.FastAPI:
  """The ASGI app serving `model` as `model_name` (module docstring): run it under uvicorn, or call it
  in-process with `fastapi.testclient.TestClient(build_app(...))`. tools: run the built-in calculator inside
  replies. max_tokens: a reply's token budget where the request names none. max_request_bytes: the largest
  body read (413 past it)."""
  if model.tokenizer is None:
    raise errors.UserError(f'{model_name}: this model has no tokenizer, so it cannot chat; copy its tokenizer '
                           f'files (tokenizer.json or our tokenizer.model) into its directory')
  completions = _Completions(model, model_name, tools, max_tokens)
  api = fastapi.FastAPI(title='luckystar.serve', description=f'OpenAI-compatible chat completions: {model_name}')
  api.state.completions = completions
  api.state.max_request_bytes = max_request_bytes

  @api.exception_handler(ServeError)
  def serve_error(request, error: ServeError):
    return error_response(error.status, str(error))

  @api.exception_handler(fastapi.exceptions.RequestValidationError)
  def invalid_body(request, error: fastapi.exceptions.RequestValidationError):
    return error_response(400, '; '.join(map(_problem, error.errors())) or 'invalid request body')

  @api.exception_handler(starlette.exceptions.HTTPException)
  def http_error(request, error: starlette.exceptions.HTTPException):
    return error_response(error.status_code, f'{request.method} {request.url.path}: {error.detail}')

  @api.exception_handler(Exception)
  def internal_error(request, error: Exception):
    logging.exception('luckystar.serve: %s %s failed', request.method, request.url.path)
    return error_response(500, f'internal error ({type(error).__name__}: {str(error)[:300]}); the server log '
                               f'has the details')

  # async: the endpoints run on the event loop; only the model's work goes to a worker thread
  bounded = fastapi.APIRouter(route_class=_BoundedBodyRoute)

  @bounded.post('/v1/chat/completions')
  async def chat_completions(body: ChatRequest, request: fastapi.Request) -> Any:
    if body.stream:
      return await stream_completion(completions, body, threading.Event())
    return await _unless_gone(request, completions.complete, body)

  api.include_router(bounded)

  @api.get('/v1/models')
  async def models() -> dict:
    return completions.models()

  @api.get('/health')
  async def health() -> dict:
    return {'status': 'ok'}

  return api


# ---- the command line --------------------------------------------------------------------------

_INIT_FROM = flags.DEFINE_string('init_from', None, 'What `luckystar.load` reads: a bundled name (tiny-sft, ...), '
                                 'a luckystar run directory or a transformers directory (float or int4).')
_PORT = flags.DEFINE_integer('port', 8000, 'Port to listen on; 0 picks a free one (the ready line names it).',
                             lower_bound=0, upper_bound=65535)
_HOST = flags.DEFINE_string('host', '127.0.0.1', 'Address to listen on (0.0.0.0: every interface).')
_MODEL_NAME = flags.DEFINE_string('model_name', None, 'The served model name; default the last part of --init_from.')
_CHAT_FORMAT = flags.DEFINE_enum('chat_format', 'auto', formats.CHOICES, 'The tokenizer\'s chat format.')
_TOOLS = flags.DEFINE_bool('tools', False, 'Run the built-in calculator inside replies instead of returning '
                           'actions as tool_calls.')
_MAX_TOKENS = flags.DEFINE_integer('max_tokens', DEFAULT_MAX_TOKENS, 'A reply\'s token budget where the request '
                                   'names none.', lower_bound=1)
_MAX_REQUEST_BYTES = flags.DEFINE_integer('max_request_bytes', MAX_REQUEST_BYTES, 'The largest request body read; '
                                          'a larger one is a 413.', lower_bound=1)
flags.mark_flags_as_required(['init_from'])


def default_model_name(init_from: str) -> str:
  """'tiny-sft' → 'tiny-sft'; 'runs/sft/' → 'sft'."""
  return str(init_from).rstrip('/').rsplit('/', 1)[-1] or str(init_from)


def listening_socket(host: str, port: int) -> socket.socket:
  """A socket bound to (host, port), not yet listening; a UserError naming the flags if it cannot be."""
  family = socket.AF_INET6 if ':' in host else socket.AF_INET
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
  except OSError as e:
    sock.close()
    raise errors.UserError(f'--host={host} --port={port}: cannot listen there ({e.strerror or e}); choose another '
                           f'--port (0 picks a free one) or --host') from None
  return sock


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f'error: unexpected arguments {argv[1:]}; flags are written --name=value')
  name = _MODEL_NAME.value or default_model_name(_INIT_FROM.value)
  try:
    sock = listening_socket(_HOST.value, _PORT.value)   # first: a taken port fails before a long load
    model = loading.load(_INIT_FROM.value, chat_format=_CHAT_FORMAT.value)
    api = build_app(model, name, tools=_TOOLS.value, max_tokens=_MAX_TOKENS.value,
                    max_request_bytes=_MAX_REQUEST_BYTES.value)
  except (ValueError, OSError, errors.UserError) as e:
    raise SystemExit(f'error: {e}') from None
  api.state.completions.warm_up()
  sock.listen()   # connections from here on wait in the backlog until uvicorn accepts them
  host, port = sock.getsockname()[:2]
  print(f'luckystar.serve: {name} on http://{f"[{host}]" if ":" in host else host}:{port}', flush=True)
  uvicorn.Server(uvicorn.Config(api, log_level='info')).run(sockets=[sock])


def parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(f'error: {e}\nUsage: python -m luckystar.serve --init_from=NAME_OR_DIR [--port=8000] '
             f'[--host=127.0.0.1] [--model_name=NAME] [--chat_format=auto] [--tools] [--max_tokens=256] '
             f'[--max_request_bytes={MAX_REQUEST_BYTES}]')


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
