"""LLM-judge fallback: a binary verdict where rule verifiers cannot decide (docs/rl.md). Off by default.

Rule verifiers always run first; a judge is asked only what they leave open,
e.g. whether two answers are equivalent beyond what math-verify can prove, or
whether a mixed Korean/English response is Korean. A judge is a callable

    verdict = judge(question, reference, candidate, criterion='equivalent')  # True / False / None

None means the judge failed (timeout, server error, an answer that is neither
YES nor NO): it is counted in `judge.stats.failures` (the metric judge/failures), by
reason in `judge.failure_reasons`, its message (naming the server) in
`judge.last_failure` and the log, and must never be read as False.

A judge also rates: `judge.rate(system_prompt, user_prompt)` is MT-Bench's 1-10 score of an
answer the prompt shows (`engine.mtbench`, docs/evaluation.md), None on failure, counted the same way.

Backends share the prompts, the parsing and an LRU cache of verdicts and ratings; they differ only in
how a prompt becomes text:

- `HttpJudge`: an OpenAI-compatible `/v1/chat/completions` endpoint, e.g. a
  vLLM server of our exported checkpoint (`vllm serve out/hf --port 8000`).
- `ModelJudge`: any `generate_fn(prompt_text) -> text`, e.g. a loaded luckystar
  model's greedy generate.

Build one from the config with `make_judge(config.judge)`; `{'backend': 'none'}`
(the default) gives None, and callers then skip the judge. A stage builds its judge
with `luckystar.engine.judging.make`, which also loads a 'model' backend's
`config.judge.init_from` and keeps the verdict cache in the workdir across runs.

`guided_choice` (default on) asks the server to constrain its answer to YES or NO
with vLLM's structured-choice extension: a judge then never wastes a request on a
verdict it cannot parse (a chatty "The candidate..." cut at max_tokens), and a
reasoning model cannot spend max_tokens thinking. A rating is the choice among
RATING_CHOICES, `[[1]]` … `[[10]]`: the most likely rating replaces MT-Bench's free-text
explanation ending in "[[rating]]", for the same reasons (no tokens spent on the
explanation, never an unparseable reply). vLLM and `python -m luckystar.serve`
accept it; a server without it (OpenAI's own API) refuses the request with a 400,
counted as a failure: set `config.judge.guided_choice=False` for one.

A judge server is outside input like any file (issue 54): one attempt has `timeout_s` in all, however
slowly the server drips its reply; a reply over MAX_REPLY_BYTES is cut off unread; the body must be UTF-8
JSON within `luckystar.files.loads`' depth and text checks. Each of these is a failure (None), never an
exception that ends a rejection-sampling run.
"""

import collections
import dataclasses
import hashlib
import http.client
import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Mapping, Sequence

from absl import logging

from luckystar import files

CRITERIA = {
    'equivalent': (
        'Does the candidate answer give the same final answer as the reference answer to the question? '
        'Ignore formatting, units written differently, rounding in the last digit and extra explanation; '
        'a different value, a missing part or a hedge between several answers is not the same.'),
    'language': (
        'Is the candidate response written in {reference}? Judge the language of its sentences; '
        'names, numbers, code, SQL and table or column names do not count.'),
}
PROMPT = """You are a strict grader. {instruction}

[Question]
{question}

[Reference]
{reference}

[Candidate]
{candidate}

Answer with one word: YES or NO."""

_VERDICT_WORDS = {'yes': True, 'true': True, '예': True, '네': True,
                  'no': False, 'false': False, '아니오': False, '아니요': False, '아니': False}
_VERDICT_RE = re.compile(r'\b(' + '|'.join(sorted(_VERDICT_WORDS, key=len, reverse=True)) + r')\b', re.IGNORECASE)
_THINKING_RE = re.compile(r'<think>.*?(?:</think>|\Z)', re.DOTALL | re.IGNORECASE)
VERDICT_CHOICES = ('YES', 'NO')   # what guided_choice lets the server answer
RATINGS = range(1, 11)            # MT-Bench's scale
RATING_CHOICES = tuple(f'[[{rating}]]' for rating in RATINGS)   # FastChat's output format, as guided choices
_RATING_RE = re.compile(r'\[\[(\d+)\]\]')
_RATING_BACKUP_RE = re.compile(r'\[(\d+)\]')   # FastChat's backup pattern: a judge that drops a bracket
_RATING_TEXTS = {str(rating): rating for rating in RATINGS}
BACKENDS = ('none', 'http', 'model')
# config.judge: every key with its default (luckystar.config.base); 'http' reads base_url, model, guided_choice,
# timeout_s, retries, backoff_s, api_key_env; 'model' reads init_from; both read max_tokens and cache_size.
DEFAULTS = dict(backend='none', base_url='', model='', init_from='', guided_choice=True, timeout_s=10.0, retries=2,
                backoff_s=0.5, api_key_env='', max_tokens=8, cache_size=4096)
CONFIG_KEYS = tuple(DEFAULTS)
_LOOPBACK = ('127.0.0.1', 'localhost', '::1')
MAX_REPLY_BYTES = 4 << 20   # a verdict's reply is under 1 KB; logprobs or a long <think> stay far below this
MAX_RETRIES = 10            # backoff doubles per retry: 10 already waits backoff_s · 1023 in all
_READ_BYTES = 64 << 10
_ERROR_DETAIL_BYTES = 300   # of an HTTP error's body, quoted in the failure message


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN


_DOMAINS = {  # key: (what it must be, test)
    'backend': (f'one of {BACKENDS}', lambda v: v in BACKENDS),
    'base_url': ('a str', lambda v: isinstance(v, str)),
    'model': ('a str', lambda v: isinstance(v, str)),
    'init_from': ('a str', lambda v: isinstance(v, str)),
    'api_key_env': ('a str', lambda v: isinstance(v, str)),
    'guided_choice': ('True or False', lambda v: isinstance(v, bool)),
    'timeout_s': ('a number > 0', lambda v: _is_number(v) and v > 0),
    'retries': (f'an integer ≥ 0 and ≤ {MAX_RETRIES}', lambda v: _is_int(v) and 0 <= v <= MAX_RETRIES),
    'backoff_s': ('a number ≥ 0', lambda v: _is_number(v) and v >= 0),
    'max_tokens': ('an integer ≥ 1', lambda v: _is_int(v) and v >= 1),
    'cache_size': ('an integer ≥ 0 (0: no cache)', lambda v: _is_int(v) and v >= 0),
}


def config_problems(config: Mapping[str, Any] | None, where: str = 'config.judge', *,
                    require_init_from: bool = True) -> list[str]:
  """What is wrong with a judge config, one message per key naming `<where>.<key>`; [] when it is usable.

  Checked up front (`luckystar.config.check`) and again by `make_judge`: unknown keys, a backend
  outside BACKENDS, values outside their domain, the keys the backend needs (http: base_url, model;
  model: init_from, unless `require_init_from` is False because the caller brings its own generate_fn),
  and an api_key_env naming an unset environment variable."""
  if config is None:
    return []
  if not hasattr(config, 'items'):
    return [f'{where}={config!r} is not a dict of judge settings (keys: {CONFIG_KEYS})']
  config = dict(config.to_dict() if hasattr(config, 'to_dict') else config)
  problems = [f'{where}.{key} is not a judge setting (unknown key; known keys: {", ".join(CONFIG_KEYS)})'
              for key in sorted(set(config) - set(CONFIG_KEYS))]
  problems += [f'{where}.{key}={value!r} is not {_DOMAINS[key][0]}' for key, value in config.items()
               if key in _DOMAINS and not _DOMAINS[key][1](value)]
  backend = config.get('backend', 'none')
  if backend == 'http':
    if not config.get('base_url'):
      problems.append(f"{where}.backend='http' needs {where}.base_url (e.g. 'http://127.0.0.1:8000')")
    if not config.get('model'):
      problems.append(f"{where}.backend='http' needs {where}.model (the served model name, as the server "
                      f'lists it at /v1/models)')
    base_url = config.get('base_url')
    if isinstance(base_url, str) and base_url and not base_url.startswith(('http://', 'https://')):
      problems.append(f'{where}.base_url={base_url!r} must start with http:// or https://')
    api_key_env = config.get('api_key_env')
    if isinstance(api_key_env, str) and api_key_env and not os.environ.get(api_key_env):
      problems.append(f'{where}.api_key_env={api_key_env!r}, but that environment variable is empty or unset')
  if backend == 'model' and require_init_from and not config.get('init_from'):
    problems.append(f"{where}.backend='model' needs {where}.init_from (a bundled model name such as 'tiny-sft', "
                    f'a luckystar run directory or a transformers directory)')
  return problems


def prompt_digest() -> str:
  """What a cached verdict depends on besides the backend: the prompt, the criteria and the cache key's form.
  Another digest means other questions were asked, so verdicts cached under it are not reused."""
  return hashlib.sha256(json.dumps(['cache key v1', PROMPT, CRITERIA], sort_keys=True).encode()).hexdigest()[:16]


def cache_key(question: str, reference: str, candidate: str, criterion: str) -> str:
  """A verdict's key in the cache (and in the workdir's persisted cache)."""
  return hashlib.sha256(json.dumps([criterion, question, reference, candidate]).encode()).hexdigest()


def rating_cache_key(system_prompt: str, user_prompt: str, guided: bool) -> str:
  """A rating's key in the same cache: the whole prompt, and whether the choice was guided (the most likely
  rating and a free-text one are different measurements)."""
  return hashlib.sha256(json.dumps(['rating', system_prompt, user_prompt, guided]).encode()).hexdigest()


class JudgeError(Exception):
  """The backend produced no usable text (network, server or payload failure). `reason` is its key in
  `Judge.failure_reasons`: timeout, connection, http_status, too_large, invalid_reply, not_a_verdict or
  not_a_rating."""

  def __init__(self, message: str, reason: str = 'invalid_reply'):
    super().__init__(message)
    self.reason = reason


class _Retryable(JudgeError):
  """A failure that may pass: timeout, connection error, 429 or 5xx."""


def render_prompt(question: str, reference: str, candidate: str, criterion: str) -> str:
  """The one prompt both backends send."""
  if criterion not in CRITERIA:
    raise ValueError(f'unknown judge criterion {criterion!r}; expected one of {tuple(CRITERIA)} '
                     f'(add a template to luckystar.rewards.judge.CRITERIA for a new one)')
  instruction = CRITERIA[criterion].format(reference=reference)
  return PROMPT.format(instruction=instruction, question=question or '(none)', reference=reference,
                       candidate=candidate)


def parse_verdict(text: str | None) -> bool | None:
  """YES/NO (also 예/네, 아니오/아니요, true/false) → bool; None when absent or contradictory.

  The first word decides ("No. The candidate..."); otherwise a verdict word
  anywhere counts if all such words agree ("The answer is YES."). A reasoning
  model's <think> block is skipped.
  """
  if not isinstance(text, str):
    return None
  text = _THINKING_RE.sub(' ', text).strip()
  first = re.match(r'[\W_]*(\w+)', text)
  if first and first.group(1).lower() in _VERDICT_WORDS:
    return _VERDICT_WORDS[first.group(1).lower()]
  found = {_VERDICT_WORDS[word.lower()] for word in _VERDICT_RE.findall(text)}
  return found.pop() if len(found) == 1 else None


def parse_rating(text: str | None) -> int | None:
  """MT-Bench's "[[rating]]" → 1..10; None when absent or off the scale (0, 11, 8.5).

  FastChat's patterns: `[[n]]`, else `[n]`. The last one counts, not FastChat's first: a judge may
  echo the prompt's example "Rating: [[5]]" before its own. A <think> block is skipped.
  """
  if not isinstance(text, str):
    return None
  text = _THINKING_RE.sub(' ', text)
  found = _RATING_RE.findall(text) or _RATING_BACKUP_RE.findall(text)
  # A lookup, not int(): a hostile reply's thousand-digit "rating" is just off the scale.
  return _RATING_TEXTS.get(found[-1].lstrip('0')) if found else None


@dataclasses.dataclass
class JudgeStats:
  """Counters for metrics: calls = verdicts and ratings asked for, requests = backend attempts (retries
  included)."""
  calls: int = 0
  cache_hits: int = 0
  requests: int = 0
  failures: int = 0

  def as_metrics(self, prefix: str = 'judge') -> dict[str, int]:
    return {f'{prefix}/{field.name}': getattr(self, field.name) for field in dataclasses.fields(self)}


class Judge:
  """Prompts, cache, parsing and counters; a backend implements `_complete(prompt, system=, choices=) -> text`."""
  guided_choice = False   # whether the backend constrains its answer to the choices (HttpJudge: a setting)

  def __init__(self, *, cache_size: int = 4096):
    if cache_size < 0:
      raise ValueError(f'cache_size must be ≥ 0 (0 disables the cache), got {cache_size}')
    self.cache_size = cache_size
    self.stats = JudgeStats()
    self._cache: collections.OrderedDict[str, bool | int] = collections.OrderedDict()   # verdicts and ratings
    self._lock = threading.Lock()  # rollouts may judge from several threads
    self.cache_version = 0     # answers cached so far: a persisted cache is rewritten only when it moved
    # Why verdicts and ratings failed (JudgeError.reason → count; they sum to stats.failures), the last message.
    self.failure_reasons: collections.Counter[str] = collections.Counter()
    self.last_failure: str | None = None
    # What makes two judges' verdicts interchangeable (backend, server and model, prompt digest): set by
    # luckystar.engine.judging.make, the fingerprint of the cache it keeps in the workdir.
    self.identity: dict[str, Any] | None = None

  def _complete(self, prompt: str, *, system: str | None = None, choices: Sequence[str] = VERDICT_CHOICES) -> str:
    """The backend's reply to `prompt` (after `system`, a system message where the backend has one); a guided
    backend answers one of `choices`. A JudgeError when there is no usable text."""
    raise NotImplementedError

  def __call__(self, question: str, reference: str, candidate: str, *, criterion: str) -> bool | None:
    """True/False verdict on `candidate` under `criterion`; None if the judge failed (counted)."""
    prompt = render_prompt(question, reference, candidate, criterion)
    return self._answer(cache_key(question, reference, candidate, criterion), lambda: self._complete(prompt),
                        parse_verdict, 'not_a_verdict', 'the judge answered neither YES nor NO')

  def rate(self, system_prompt: str, user_prompt: str) -> int | None:
    """MT-Bench's rating, 1..10, of the answer `user_prompt` shows (a FastChat judge prompt, rendered); None if
    the judge failed (counted, reason 'not_a_rating' for a reply without one).

    Guided (HttpJudge's default), the server picks among RATING_CHOICES; otherwise the judge writes
    FastChat's explanation and `parse_rating` reads its "[[rating]]": give it the tokens for that
    (config.judge.max_tokens; FastChat allows 2048), or its reply is cut before the rating."""
    return self._answer(
        rating_cache_key(system_prompt, user_prompt, self.guided_choice),
        lambda: self._complete(user_prompt, system=system_prompt or None, choices=RATING_CHOICES),
        parse_rating, 'not_a_rating', 'the judge gave no rating [[1]] to [[10]] (cut at max_tokens?)')

  def _answer(self, key: str, complete: Callable[[], str], parse: Callable[[str], Any], reason: str,
              complaint: str) -> Any:
    """The cached answer under `key`, else `parse(complete())`; None (counted under `reason` when the text does
    not parse) if it fails."""
    with self._lock:
      self.stats.calls += 1
      if key in self._cache:
        self.stats.cache_hits += 1
        self._cache.move_to_end(key)
        return self._cache[key]
    try:
      text = complete()
    except JudgeError as error:
      self._count_failure(error.reason, str(error))
      return None
    answer = parse(text)
    if answer is None:
      self._count_failure(reason, f'{complaint}: {text[:200]!r}')
      return None
    with self._lock:
      if self.cache_size:  # only answers are cached: a failure is retried on the next call
        self._cache[key] = answer
        self.cache_version += 1
        while len(self._cache) > self.cache_size:
          self._cache.popitem(last=False)
    return answer

  def verdicts(self) -> dict[str, bool | int]:
    """The cached verdicts (by `cache_key`) and ratings (by `rating_cache_key`), least recently used first:
    what engine.judging persists."""
    with self._lock:
      return dict(self._cache)

  def preload(self, verdicts: Mapping[str, bool | int]) -> None:
    """Verdicts and ratings an earlier run of the same judge cached (`verdicts()`), oldest first; asked again,
    they are answered from the cache and count as cache hits. Entries that are neither str → bool nor
    str → a rating in RATINGS are skipped."""
    with self._lock:
      for key, answer in verdicts.items():
        answer_ok = isinstance(answer, bool) or (_is_int(answer) and answer in RATINGS)
        if isinstance(key, str) and answer_ok and self.cache_size:
          self._cache[key] = answer
          self._cache.move_to_end(key)
      while len(self._cache) > self.cache_size:
        self._cache.popitem(last=False)

  def _count_request(self) -> None:
    with self._lock:
      self.stats.requests += 1

  def _count_failure(self, reason: str, message: str) -> None:
    with self._lock:
      self.stats.failures += 1
      self.failure_reasons[reason] += 1
      self.last_failure = message
      failures = self.stats.failures
    logging.warning('judge failed (%s failures so far, reason %s): %s', failures, reason, message)


class ModelJudge(Judge):
  """A judge backed by any `generate_fn(prompt_text) -> text` (greedy decoding expected), and for ratings
  optionally `choose_fn(prompt_text, choices) -> choice` (the most likely choice, as a server's guided choice;
  a small model rarely spells FastChat's "[[rating]]" itself).

  It has no system message: a rating's system prompt goes before its prompt. Without choose_fn the rating
  is read from the reply. Errors raised by generate_fn propagate: an in-process model failing is a bug to
  see, not a flaky network to retry.
  """

  def __init__(self, generate_fn: Callable[[str], str], *, choose_fn: Callable[[str, Sequence[str]], str] | None = None,
               cache_size: int = 4096):
    super().__init__(cache_size=cache_size)
    if not callable(generate_fn):
      raise TypeError(f'generate_fn must be a callable prompt_text -> text, got {type(generate_fn).__name__}')
    self.generate_fn, self.choose_fn = generate_fn, choose_fn
    self.guided_choice = choose_fn is not None

  def _complete(self, prompt: str, *, system: str | None = None, choices: Sequence[str] = VERDICT_CHOICES) -> str:
    self._count_request()
    prompt = f'{system}\n\n{prompt}' if system else prompt
    if self.choose_fn is not None and choices is RATING_CHOICES:
      return self.choose_fn(prompt, choices)
    text = self.generate_fn(prompt)
    if not isinstance(text, str):
      raise JudgeError(f'generate_fn returned {type(text).__name__}, expected str')
    return text


class _Deadline:
  """Shuts a request's connection down when its time is up, wherever the request then waits (headers, body,
  an error body): a socket timeout bounds each read, so a server dripping a byte per read would outlive it."""

  def __init__(self, seconds: float):
    self.expired = False
    self._sockets: list[socket.socket] = []
    self._lock = threading.Lock()
    self._timer = threading.Timer(seconds, self._expire)
    self._timer.daemon = True

  def __enter__(self) -> '_Deadline':
    self._timer.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._timer.cancel()

  def watch(self, sock: socket.socket) -> None:
    with self._lock:
      self._sockets.append(sock)
      if self.expired:   # connected just as time ran out
        _shut(sock)

  def _expire(self) -> None:
    with self._lock:
      self.expired = True
      for sock in self._sockets:
        _shut(sock)


def _shut(sock: socket.socket) -> None:
  try:   # the reading thread then sees the end of the stream; it closes the socket itself
    sock.shutdown(socket.SHUT_RDWR)
  except OSError:
    pass   # already closed


class _DeadlineHandler:
  """Opens connections whose TCP socket the deadline watches (the raw socket, under TLS too)."""

  def __init__(self, deadline: _Deadline, **kwargs):
    super().__init__(**kwargs)
    self._deadline = deadline

  def do_open(self, http_class, request, **connection_args):
    deadline = self._deadline

    def connection(host, **kwargs):
      conn = http_class(host, **kwargs)
      create = conn._create_connection   # pylint: disable=protected-access  (http.client's socket factory)

      def create_watched(*args, **create_kwargs):
        sock = create(*args, **create_kwargs)
        deadline.watch(sock)
        return sock

      conn._create_connection = create_watched   # pylint: disable=protected-access
      return conn

    return super().do_open(connection, request, **connection_args)


class _HTTPHandler(_DeadlineHandler, urllib.request.HTTPHandler):
  pass


class _HTTPSHandler(_DeadlineHandler, urllib.request.HTTPSHandler):
  pass


def chat_completions_url(base_url: str) -> str:
  """'http://host:8000', '.../v1' or the full endpoint → the chat-completions endpoint."""
  url = base_url.rstrip('/')
  if url.endswith('/chat/completions'):
    return url
  return url + ('/chat/completions' if url.endswith('/v1') else '/v1/chat/completions')


class HttpJudge(Judge):
  """A judge behind an OpenAI-compatible chat-completions server (vLLM, SGLang, TGI, ...).

  Temperature 0 and a few output tokens; with `guided_choice`, the answer constrained to YES or NO, or a
  rating to RATING_CHOICES (vLLM's structured-choice extension, both its older `guided_choice` and newer
  `structured_outputs` spelling). Timeouts, connection errors, 429 and 5xx are retried `retries`
  (≤ MAX_RETRIES) times with exponential backoff (backoff_s, 2·backoff_s, ...): a refused connection
  fails at once, it waits for the backoff only, never for timeout_s. Other 4xx errors are the request's
  fault (wrong model name, bad key, an unknown extension) and fail at once. A server on this machine
  (127.0.0.1, localhost) is reached directly, whatever http_proxy says.

  `timeout_s` is each attempt's deadline in all (connect, headers and body), not per read: a verdict
  returns within (retries + 1)·timeout_s plus the backoff. A reply over MAX_REPLY_BYTES, or one that is
  not UTF-8 JSON within `files.loads`' bounds, fails at once, not retried: the server would send it again.
  """

  def __init__(self, base_url: str, model: str, *, timeout_s: float = 10.0, retries: int = 2,
               backoff_s: float = 0.5, api_key: str | None = None, max_tokens: int = 8,
               guided_choice: bool = True, cache_size: int = 4096):
    super().__init__(cache_size=cache_size)
    if not base_url or not model:
      raise ValueError(f'HttpJudge needs base_url and model (the served model name), got '
                       f'base_url={base_url!r}, model={model!r}')
    if not 0 <= retries <= MAX_RETRIES or timeout_s <= 0 or backoff_s < 0:
      raise ValueError(f'need 0 ≤ retries ≤ {MAX_RETRIES}, timeout_s > 0, backoff_s ≥ 0; got retries={retries}, '
                       f'timeout_s={timeout_s}, backoff_s={backoff_s}')
    self.url = chat_completions_url(base_url)
    self.model = model
    self.timeout_s = timeout_s
    self.retries = retries
    self.backoff_s = backoff_s
    self.api_key = api_key
    self.max_tokens = max_tokens
    self.guided_choice = guided_choice
    self._loopback = urllib.parse.urlsplit(self.url).hostname in _LOOPBACK

  def payload(self, prompt: str, *, system: str | None = None, choices: Sequence[str] = VERDICT_CHOICES
              ) -> dict[str, Any]:
    messages = ([{'role': 'system', 'content': system}] if system else []) + [{'role': 'user', 'content': prompt}]
    payload = {'model': self.model, 'messages': messages, 'temperature': 0, 'max_tokens': self.max_tokens}
    if self.guided_choice:  # both spellings: vLLM before and after it renamed the extension
      payload['guided_choice'] = list(choices)
      payload['structured_outputs'] = {'choice': list(choices)}
    return payload

  def _opener(self, deadline: _Deadline) -> urllib.request.OpenerDirector:
    """An opener whose connections `deadline` watches; one per attempt, as requests may run in parallel."""
    handlers = [_HTTPHandler(deadline), _HTTPSHandler(deadline)]
    if self._loopback:
      handlers.append(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener(*handlers)

  def _request(self, body: bytes) -> str:
    """One attempt. Raises _Retryable for what may pass, JudgeError for what will not."""
    headers = {'Content-Type': 'application/json'}
    if self.api_key:
      headers['Authorization'] = f'Bearer {self.api_key}'
    request = urllib.request.Request(self.url, data=body, headers=headers, method='POST')
    self._count_request()
    with _Deadline(self.timeout_s) as deadline:
      try:
        with self._opener(deadline).open(request, timeout=self.timeout_s) as response:
          raw = self._read_capped(response)
      except urllib.error.HTTPError as error:
        self._raise_http_error(error, deadline)
      except (OSError, http.client.HTTPException) as error:   # URLError, socket timeouts, resets, TLS errors
        raise self._transport_error(error, deadline) from error
      if deadline.expired:   # the body ended because the deadline shut the connection
        raise self._transport_error(None, deadline)
    return self._content(raw)

  def _read_capped(self, response) -> bytes:
    """The body, read in chunks; a JudgeError past MAX_REPLY_BYTES, announced or sent."""
    length = response.getheader('Content-Length') or ''
    if length.strip().isdigit() and int(length) > MAX_REPLY_BYTES:
      raise JudgeError(f'{self.url}: the reply is larger than {MAX_REPLY_BYTES:,} bytes (Content-Length: '
                       f'{int(length):,}); not read', 'too_large')
    chunks, size = [], 0
    while chunk := response.read(min(_READ_BYTES, MAX_REPLY_BYTES + 1 - size)):
      chunks.append(chunk)
      size += len(chunk)
      if size > MAX_REPLY_BYTES:
        raise JudgeError(f'{self.url}: the reply is larger than {MAX_REPLY_BYTES:,} bytes; reading stopped there',
                         'too_large')
    return b''.join(chunks)

  def _raise_http_error(self, error: urllib.error.HTTPError, deadline: _Deadline):
    try:
      detail = error.read(_ERROR_DETAIL_BYTES).decode('utf-8', 'replace')
    except (OSError, http.client.HTTPException):
      detail = ''   # the status is the message; a body cut short by the deadline adds nothing
    finally:
      error.close()
    if deadline.expired:
      raise self._transport_error(error, deadline) from error
    message = f'{self.url}: HTTP {error.code} {detail}'
    if error.code == 429 or error.code >= 500:
      raise _Retryable(message, 'http_status') from error
    hint = (', or set config.judge.guided_choice=False for a server without vLLM\'s structured-choice '
            'extension' if self.guided_choice else '')
    raise JudgeError(f'{message} (not retried: check the model name {self.model!r} and the API key{hint})',
                     'http_status') from error

  def _transport_error(self, error: BaseException | None, deadline: _Deadline) -> _Retryable:
    if deadline.expired or isinstance(error, (socket.timeout, TimeoutError)) or (
        isinstance(error, urllib.error.URLError) and isinstance(error.reason, (socket.timeout, TimeoutError))):
      return _Retryable(f'{self.url}: no complete reply within timeout_s={self.timeout_s} s (a deadline for '
                        f'the whole request, not each read)', 'timeout')
    return _Retryable(f'{self.url}: {error}', 'connection')

  def _content(self, raw: bytes) -> str:
    """The completion's text, from a body that must be UTF-8 JSON within files.loads' bounds."""
    try:
      text = raw.decode('utf-8')
    except UnicodeDecodeError as error:
      raise JudgeError(f'{self.url}: the reply is not UTF-8 text (byte {error.start}: '
                       f'{raw[error.start:error.start + 4]!r})') from None
    try:
      reply = files.loads(text, f'{self.url} reply')
    except ValueError as error:   # nested too deep, not JSON, NaN, a lone surrogate: the message says which
      raise JudgeError(str(error)) from None
    try:
      content = reply['choices'][0]['message']['content']
    except (KeyError, IndexError, TypeError):
      content = None
    if not isinstance(content, str):
      raise JudgeError(f'{self.url}: not a chat-completions response (no choices[0].message.content text): '
                       f'{text[:200]!r}')
    return content

  def _complete(self, prompt: str, *, system: str | None = None, choices: Sequence[str] = VERDICT_CHOICES) -> str:
    body = json.dumps(self.payload(prompt, system=system, choices=choices)).encode()
    for attempt in range(self.retries):
      try:
        return self._request(body)
      except _Retryable as error:
        logging.info('judge request failed, retrying: %s', error)
        time.sleep(self.backoff_s * 2 ** attempt)
    try:
      return self._request(body)
    except _Retryable as error:
      raise JudgeError(f'{error} (gave up after {self.retries + 1} attempts)', error.reason) from error


def make_judge(config: Mapping[str, Any] | None, *, generate_fn: Callable[[str], str] | None = None,
               choose_fn: Callable[[str, Sequence[str]], str] | None = None) -> Judge | None:
  """A judge from `config.judge`, or None when it is off (`backend: 'none'`, the default).

  Keys (DEFAULTS; a key left out takes its default): backend ('none' | 'http' | 'model'); for 'http':
  base_url, model, guided_choice, timeout_s, retries, backoff_s, max_tokens, api_key_env (the name
  of the environment variable holding the key, so the key never lands in config.json); cache_size for
  both. 'model' needs `generate_fn`, e.g. a loaded model's greedy generate (engine.judging.make builds
  it from init_from and max_tokens) and optionally `choose_fn` (ModelJudge), and ignores the http keys (a
  config may define them all).
  A config `config_problems` finds fault with is a ValueError naming every faulty key.
  """
  if config is None:
    return None
  if problems := config_problems(config, require_init_from=False):
    raise ValueError('; '.join(problems))
  config = {**DEFAULTS, **(config.to_dict() if hasattr(config, 'to_dict') else config)}
  backend = config['backend']
  if backend == 'none':
    return None
  if backend == 'model':
    if generate_fn is None:
      raise ValueError("config.judge.backend='model' needs generate_fn= (a callable prompt_text -> text, "
                       "e.g. a loaded luckystar model's greedy generate; luckystar.engine.judging.make builds it "
                       'from config.judge.init_from)')
    return ModelJudge(generate_fn, choose_fn=choose_fn, cache_size=config['cache_size'])
  api_key = os.environ.get(config['api_key_env']) if config['api_key_env'] else None
  return HttpJudge(config['base_url'], config['model'], api_key=api_key,
                   **{key: config[key] for key in ('timeout_s', 'retries', 'backoff_s', 'max_tokens', 'guided_choice',
                                                   'cache_size')})
