"""OpenAI-compatible chat completions over anything `luckystar.load` reads (DESIGN §8), queried the way a
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
- The mode comes from `mode`, else `chat_template_kwargs.mode`, else a first system message that is one of
  the two preambles (dropped, so the preamble is not rendered twice), else DEFAULT_MODE. Any other system
  message follows the mode's preamble, as `Tokenizer.render` lays it out.
- Sampling defaults are OpenAI's and vLLM's on our export (its generation_config.json sets none):
  temperature 1, top_p 1; `temperature: 0` is greedy. A guided choice never samples.
- Refused with 400 rather than ignored: `n` > 1, `stream`, `stop` sequences (the model stops at the end of
  its turn). Other OpenAI fields (penalties, logprobs, response_format, tools) are accepted and ignored.
- Model calls run one at a time under a lock: the sampler is batched, but the server's replies are not
  gathered into batches (simple, and a reply does not depend on what else was asked at the same moment).
  A request whose client hung up is skipped when its turn comes, and a reply being generated stops at the
  next decode chunk (DECODE_CHUNK tokens); `/health` and `/v1/models` answer on the event loop, never behind
  the queue.
- Bounded work per request: the body is at most --max_request_bytes (413), nested at most
  `files.MAX_JSON_DEPTH` deep, its strings valid Unicode (400 naming the field); the prompt, prompt + budget
  and prompt + each guided choice fit the context, and a guided choice has at most MAX_CHOICES choices (400
  naming the field and the limit). Sampling values are traced (`sampling.SamplingSettings`) and the decode
  loop runs in fixed chunks over a power-of-two cache, so new temperatures and budgets reuse a few compiled
  programs instead of compiling (and keeping) one each.
- Without `--tools` an action comes back as OpenAI `tool_calls` (finish_reason 'tool_calls'); with it, the
  built-in calculator runs inside the reply (`sampling.agent_tools`) and the final answer comes back.
"""

import http
import json
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
from luckystar import tokenizer as tokenizer_lib
from luckystar.engine import loading
from luckystar.tools import calls as calls_lib
from luckystar.tokenizer import formats

DEFAULT_MODE = 'concise'        # API clients (a judge, a chat UI) want the answer, not the trace
DEFAULT_MAX_TOKENS = 256
MAX_REQUEST_BYTES = 4 << 20     # a full 128k-token context is ~0.5 MB of text; the default --max_request_bytes
MAX_CHOICES = 128               # a judge asks 2; each choice is a forward pass of prompt + choice
DECODE_CHUNK = 32               # tokens between checks that the client still waits (and the decode program's width)
GREEDY_BELOW = 1e-5             # vLLM's: a smaller temperature is greedy (dividing by it overflows the logits)
ROLES = ('system', 'developer', 'user', 'assistant', 'tool')   # developer: OpenAI's newer name for system
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


class Message(_Body):
  role: str
  content: str | list[TextPart] | None = None
  reasoning_content: str | None = None    # an assistant turn's thinking section (vLLM's name)
  tool_calls: list[ToolCall] | None = None


class StructuredOutputs(_Body):
  model_config = pydantic.ConfigDict(extra='allow')   # json / regex / grammar: refused by name below
  choice: list[str] | None = None


class ChatRequest(_Body):
  """The body of POST /v1/chat/completions."""
  model: str | None = None
  messages: list[Message] = pydantic.Field(min_length=1)
  mode: str | None = None
  chat_template_kwargs: dict[str, Any] | None = None
  temperature: float | None = pydantic.Field(None, ge=0, allow_inf_nan=False)   # 1e400 parses as inf
  top_p: float | None = pydantic.Field(None, gt=0, le=1, allow_inf_nan=False)
  top_k: int | None = pydantic.Field(None, ge=-1)          # vLLM's; -1 and 0 are off
  max_tokens: int | None = pydantic.Field(None, ge=1)
  max_completion_tokens: int | None = pydantic.Field(None, ge=1)   # OpenAI's newer name; wins over max_tokens
  seed: int | None = None
  n: int | None = None
  stop: str | list[str] | None = None
  stream: bool | None = None
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


def _text(content: str | list[TextPart] | None) -> str | None:
  return content if content is None or isinstance(content, str) else ''.join(part.text for part in content)


def _assistant_turn(message: Message, where: str) -> dict:
  """An OpenAI assistant message → our sections: reasoning_content → thinking, tool_calls → action, content →
  response."""
  turn = {'role': 'assistant', 'thinking': message.reasoning_content, 'response': _text(message.content)}
  if message.tool_calls:
    calls = []
    for j, call in enumerate(message.tool_calls):
      field = f'{where}.tool_calls[{j}].function.arguments'
      try:   # bounded: the arguments are JSON text inside the body, as deep as a client likes
        parameters = files.loads(call.function.arguments, field)
      except errors.InvalidFile as e:
        raise ServeError(400, f'{e}; function.arguments of {call.function.name[:200]!r} must be the JSON text of '
                              f'an object') from None
      if not isinstance(parameters, dict):
        raise ServeError(400, f'{field}: function.arguments of {call.function.name[:200]!r} must be the JSON text '
                              f'of an object, got {call.function.arguments[:200]!r}')
      calls.append({'tool_name': call.function.name, 'parameters': parameters})
    turn['action'] = json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)
  if all(turn.get(name) is None for name in formats.SECTIONS):
    raise ServeError(400, f'{where}: an assistant message needs content, reasoning_content or tool_calls')
  return turn


def conversation(request: ChatRequest) -> tuple[str, list[dict]]:
  """(mode, messages as `Tokenizer.render` reads them) of a request (module docstring: how the mode is chosen)."""
  mode = request.mode
  if mode is None and request.chat_template_kwargs:
    mode = request.chat_template_kwargs.get('mode')
  if mode is not None and mode not in tokenizer_lib.MODES:
    raise ServeError(400, f'mode: unknown mode {mode!r}; expected one of {list(tokenizer_lib.MODES)}')
  messages = []
  for i, message in enumerate(request.messages):
    where = f'messages[{i}]'
    if message.role not in ROLES:
      raise ServeError(400, f'{where}.role: unknown role {message.role!r}; expected one of {list(ROLES)}')
    if message.role == 'assistant':
      messages.append(_assistant_turn(message, where))
      continue
    if (text := _text(message.content)) is None:
      raise ServeError(400, f'{where}: a {message.role} message needs content')
    messages.append({'role': 'system' if message.role == 'developer' else message.role, 'content': text})
  if messages and messages[0]['role'] == 'system' and messages[0]['content'].strip() in _PREAMBLE_MODES:
    mode = mode or _PREAMBLE_MODES[messages[0]['content'].strip()]
    messages = messages[1:]
  return mode or DEFAULT_MODE, messages


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


def reply_message(generation: loading.Generation) -> tuple[dict, str]:
  """(OpenAI message, finish_reason) of a generated reply: content is the response section (a reply without
  one: its decoded text, or '' where it holds only thinking); reasoning_content the thinking; an action the
  tools did not answer comes back as tool_calls."""
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
  return message, finish


class _Completions:
  """The endpoints' work on one model, one model call at a time."""

  def __init__(self, model: loading.Model, model_name: str, tools: bool, max_tokens: int):
    self.model, self.model_name, self.max_tokens = model, model_name, max_tokens
    self.tool_fn = None if tools else _no_tools      # None: Model.chat's built-in calculator
    self.created = int(time.time())
    self.lock = threading.Lock()

  def models(self) -> dict:
    return {'object': 'list', 'data': [{
        'id': self.model_name, 'object': 'model', 'created': self.created, 'owned_by': 'luckystar',
        'root': self.model_name, 'parent': None, 'max_model_len': self.model.config.max_position_embeddings}]}

  def complete(self, request: ChatRequest, gone: threading.Event | None = None) -> dict:
    """The reply to `request`; gone: set once its client hung up (the work then stops where it can)."""
    def check():
      if gone is not None and gone.is_set():
        raise ServeError(499, 'the client closed the connection before its reply was ready')

    check()
    if request.model is not None and request.model != self.model_name:
      raise ServeError(404, f'The model `{request.model[:200]}` does not exist; this server serves '
                            f'`{self.model_name}`.')
    if request.n not in (None, 1):
      raise ServeError(400, f'n: only n=1 is supported, got {request.n}; send the request {request.n} times')
    if request.stream:
      raise ServeError(400, 'stream: streaming is not supported; send "stream": false')
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
    with self.lock:
      check()   # its client left while it queued: skipped
      if choices is not None:
        message, finish, completion_tokens = self._choose(messages, mode, choices)
      else:
        message, finish, completion_tokens = self._generate(
            messages, mode, request, max_new_tokens=requested or min(self.max_tokens, context - len(prompt)),
            check=check)
    return {'id': f'chatcmpl-{uuid.uuid4().hex}', 'object': 'chat.completion', 'created': int(time.time()),
            'model': self.model_name,
            'choices': [{'index': 0, 'message': message, 'logprobs': None, 'finish_reason': finish}],
            'usage': {'prompt_tokens': len(prompt), 'completion_tokens': completion_tokens,
                      'total_tokens': len(prompt) + completion_tokens}}

  def _check_choices(self, messages: list[dict], mode: str, field: str, choices: list[str]) -> None:
    """Each choice as the reply must fit the context (scoring one past it fails, and a huge one costs memory)."""
    context = self.model.config.max_position_embeddings
    for i, choice in enumerate(choices):
      length = len(self.model.tokenizer.render([*messages, {'role': 'assistant', 'response': choice}], mode)[0])
      if length > context:
        raise ServeError(400, f"{field}[{i}]: This model's maximum context length is {context} tokens; the "
                              f'messages with this choice as the reply take {length}. Please shorten the choice or '
                              f'the messages.')

  def _generate(self, messages: list[dict], mode: str, request: ChatRequest, max_new_tokens: int,
                check: Callable[[], None]) -> tuple[dict, str, int]:
    temperature = 1.0 if request.temperature is None else request.temperature
    temperature = 0.0 if temperature < GREEDY_BELOW else temperature
    # top_k at or past the vocabulary keeps everything: off (one program rather than one per value)
    top_k = request.top_k if request.top_k and 0 < request.top_k < self.model.config.vocab_size else 0
    # No seed: a fresh draw per request, as OpenAI does (greedy replies ignore it).
    seed = (secrets.randbits(31) if request.seed is None else request.seed % 2**31) if temperature else 0
    generation = self.model.chat(
        messages, mode, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
        top_p=1.0 if request.top_p is None else request.top_p, seed=seed, tools=self.tool_fn,
        decode_chunk=DECODE_CHUNK, check=check)
    message, finish = reply_message(generation)
    return message, finish, len(generation.rollout.token_ids)

  def _choose(self, messages: list[dict], mode: str, choices: list[str]) -> tuple[dict, str, int]:
    """The most likely choice (the first of equals), scored as the whole reply."""
    best = choices[int(self.model.reply_logprobs(messages, choices, mode).argmax())]
    _, reply_mask = self.model.tokenizer.render([{'role': 'assistant', 'response': best}], mode)
    message = {'role': 'assistant', 'content': best, 'reasoning_content': None, 'tool_calls': []}
    return message, 'stop', sum(reply_mask)   # the tokens of the reply's turn after its header

  def warm_up(self) -> None:
    """Compiles the programs a short greedy reply, a sampled one and a two-way choice use."""
    hello = [Message(role='user', content='Hello')]
    self.complete(ChatRequest(messages=hello, temperature=0))
    self.complete(ChatRequest(messages=hello, temperature=1, max_tokens=DECODE_CHUNK))
    self.complete(ChatRequest(messages=hello, guided_choice=['YES', 'NO']))


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
  async def chat_completions(body: ChatRequest, request: fastapi.Request) -> dict:
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
