"""Loading a model by name or path → `Model`: bundled names, luckystar run directories, transformers
directories (float or int4), Hugging Face repo ids in the local hub cache. `luckystar.load` (the api
facade) is `load` here."""

import collections
import dataclasses
import functools
import os
import pathlib
import re
from typing import Any, Callable, Mapping, Sequence

import huggingface_hub
from huggingface_hub import errors as hub_errors
import jax
import jax.numpy as jnp
import numpy as np

from luckystar import errors
from luckystar import model as model_lib
from luckystar import quant
from luckystar import sampling
from luckystar import tokenizer as tokenizer_lib
from luckystar.engine import checkpoint
from luckystar.interop import hf

BUNDLED_DIR = pathlib.Path(__file__).parents[1] / 'assets' / 'models'
BUNDLED_MODELS = ('tiny-base', 'tiny-sft', 'tiny-rlvr', 'tiny-teacher')

_logits = jax.jit(model_lib.apply, static_argnums=0)
_SCORED_LOGITS = 1 << 27   # the most logits one `reply_logprobs` forward pass holds (512 MiB of float32)


@functools.partial(jax.jit, static_argnums=0)
def _next_token_logprobs(config: model_lib.ModelConfig, params: Any, token_ids: jax.Array) -> jax.Array:
  """token_ids [B, T] → log P(token_ids[:, t + 1] | the tokens up to t) [B, T - 1] float32."""
  logits = model_lib.apply(config, params, token_ids)[:, :-1]
  return jnp.take_along_axis(logits, token_ids[:, 1:, None], axis=-1)[..., 0] - jax.nn.logsumexp(logits, -1)


@dataclasses.dataclass(frozen=True)
class Generation:
  """One generated reply. `text` is the response section when there is one, else the decoded text of
  the whole final assistant turn (special tokens dropped), so a malformed reply is still readable."""
  text: str
  thinking: str | None
  response: str | None
  actions: list[str]           # every action (tool call) in order, across tool turns
  finished: bool               # the turn ended (END_OF_TURN, or an action with no tool to run)
  overlong: bool               # max_new_tokens ran out first
  rollout: sampling.Rollout    # the token-level record: ids, loss mask, log-probs


Tools = sampling.ToolFn | str | os.PathLike | Sequence['str | os.PathLike | None'] | None


def _render_chats(tokenizer: tokenizer_lib.Tokenizer, conversations: Sequence[Sequence[dict]], modes: Sequence[str],
                  single: bool) -> list[list[int]]:
  """Each conversation rendered for the assistant's next turn in its mode; a malformed one is a ValueError naming
  its index (none for a single conversation)."""
  rendered = []
  for k, (messages, mode) in enumerate(zip(conversations, modes)):
    try:
      rendered.append(tokenizer.render(tokenizer_lib.from_openai(messages), mode, add_generation_prompt=True)[0])
    except ValueError as e:
      raise ValueError(str(e) if single else f'conversations[{k}]: {e}') from None
  return rendered


def _rendered_more(tokenizer: tokenizer_lib.Tokenizer, more: Callable | None) -> Callable | None:
  """`Model.chat`'s more (conversations) as `sampling.rollout`'s (rendered prompts and keys)."""
  if more is None:
    return None
  return lambda free, cache: [
      (tokenizer.render(tokenizer_lib.from_openai(messages), mode, add_generation_prompt=True)[0], budget,
       jax.random.key(seed), row_id) for messages, mode, budget, seed, row_id in more(free, cache)]


@dataclasses.dataclass
class Model:
  """A loaded model: architecture, params (a pytree of arrays), tokenizer (None if unknown) and the dtype its
  float weights were stored in (`save_hf`'s default)."""
  config: model_lib.ModelConfig
  params: Any
  tokenizer: tokenizer_lib.Tokenizer | None = None
  source_dtype: str | None = None

  def logits(self, token_ids: Any) -> jax.Array:
    """token_ids [B, T] int → logits [B, T, V] float32."""
    token_ids = jnp.asarray(token_ids)
    if token_ids.ndim != 2 or not jnp.issubdtype(token_ids.dtype, jnp.integer):
      raise ValueError(f'token_ids must be an int array [batch, length], got {token_ids.dtype}{token_ids.shape}')
    if token_ids.size and (int(token_ids.min()) < 0 or int(token_ids.max()) >= self.config.vocab_size):
      raise ValueError(f'token ids must lie in [0, {self.config.vocab_size}); got '
                       f'[{int(token_ids.min())}, {int(token_ids.max())}]')
    return _logits(self.config, self.params, token_ids)

  def generate(self, prompts: str | Sequence[str], mode: str = 'reasoning', *, max_new_tokens: int = 256,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, tools: Tools = None,
               system: str | None = None, max_tool_turns: int = 4, max_tool_result_tokens: int = 512
               ) -> 'Generation | list[Generation]':
    """Chat replies through the chat template: a str gives one Generation, a list gives a list.

    mode: 'reasoning' or 'concise' (the system preamble). temperature 0 is greedy. tools: None (the
    `calculator` only; any other action ends the reply), SQLite database path(s), one for all prompts
    or one per prompt, to run `execute_sql` actions on as well, or your own
    tool_fn(prompt_index, action_text) -> result text or None.
    max_new_tokens bounds each reply, tool turns included. `chat` is this for whole conversations.
    """
    single = isinstance(prompts, str)
    system_messages = [{'role': 'system', 'content': system}] if system is not None else []
    conversations = [[*system_messages, {'role': 'user', 'content': text}]
                     for text in ([prompts] if single else prompts)]
    generations = self.chat(conversations, mode, max_new_tokens=max_new_tokens, temperature=temperature,
                            top_k=top_k, top_p=top_p, seed=seed, tools=tools, max_tool_turns=max_tool_turns,
                            max_tool_result_tokens=max_tool_result_tokens)
    return generations[0] if single else generations

  def chat(self, conversations: Sequence[dict] | Sequence[Sequence[dict]], mode: str | Sequence[str] = 'reasoning',
           *, max_new_tokens: int | Sequence[int] = 256, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 1.0, seed: int | Sequence[int] = 0, tools: Tools = None, max_tool_turns: int = 4,
           max_tool_result_tokens: int = 512, decode_chunk: int | None = None,
           check: Callable[[], Any] | None = None, follow: Callable[[int, sampling.Rollout], bool] | None = None,
           slots: int | None = None, more: Callable[[int, int], Sequence[tuple]] | None = None,
           done: Callable[[int, Generation], Any] | None = None) -> 'Generation | list[Generation]':
    """The assistant's next turn after whole conversations: one conversation (a list of message dicts:
    system / developer / user / assistant / tool, assistant turns in OpenAI's shape, `content`,
    `reasoning_content`, `tool_calls`, or ours, `thinking` / `action` / `response`; `tokenizer.from_openai`)
    gives one Generation, a list of conversations a list, sampled together. Function schemas for the model to
    see (an OpenAI request's `tools`): `tokenizer.with_tools(messages, tools)`.

    mode picks the system preamble (a system message's content follows it); the other arguments are
    `generate`'s, and decode_chunk and check `sampling.rollout`'s (a server: a few programs for any budget, and
    a way to stop a reply nobody waits for), follow `sampling.rollout`'s too (each row's reply so far, before each
    decode call; False drops the row). A malformed conversation (an unknown role, a system message after the
    first) is a ValueError before any sampling.

    Conversations sampled together (a server's concurrent requests) may differ in mode, max_new_tokens and seed:
    a list gives one per conversation. The k-th conversation with seed s draws as row k of a call with
    seed=s, so each reply is the one its own call would give.

    Continuous batching (a server; needs decode_chunk, and tools None or a tool_fn): with slots free and no
    conversation waiting, more(free slots, cache length) gives conversations to add to the running batch, each
    (conversation, mode, max_new_tokens, seed, row id), its rendered prompt + max_new_tokens at most the cache
    length; done(index, Generation) is called as each reply ends (indices count on past the given
    conversations, in the order more gave them). slots: `sampling.rollout`'s slot count.
    """
    tokenizer = self._chat_tokenizer()
    single = bool(conversations) and isinstance(conversations[0], Mapping)
    conversations = [conversations] if single else list(conversations)
    per_row = lambda value, name: ([value] * len(conversations) if isinstance(value, (str, int)) else
                                   _one_each(value, len(conversations), name))
    modes, seeds = per_row(mode, 'mode'), per_row(seed, 'seed')
    rendered = _render_chats(tokenizer, conversations, modes, single)
    earlier = collections.Counter()
    row_ids = [earlier.update([s]) or earlier[s] - 1 for s in seeds]
    rng = (jax.random.key(seeds[0]) if len(set(seeds)) == 1 and more is None else
           jnp.stack([jax.random.key(s) for s in seeds]))
    tool_fn = _tool_fn(tools, len(rendered))
    if more is not None:
      if tools is not None and not callable(tools):
        raise ValueError('more: give tools as None or a tool_fn (database paths are per conversation)')
      tool_fn = tools or sampling.agent_tools(collections.defaultdict(lambda: None))   # any row: no database
    added = _rendered_more(tokenizer, more)
    budgets = per_row(max_new_tokens, 'max_new_tokens')
    settings = sampling.RolloutSettings(   # max_new_tokens: the largest budget (each row's own: budgets)
        max_new_tokens=max(budgets, default=1), temperature=temperature, top_k=top_k, top_p=top_p,
        max_tool_turns=max_tool_turns, max_tool_result_tokens=max_tool_result_tokens, slots=slots,
        decode_chunk=decode_chunk)
    hooks = sampling.RolloutHooks(
        check=check, follow=follow, more=added,
        done=(lambda index, rollout: done(index, self._generation(rollout))) if done is not None else None)
    rollouts = sampling.rollout(self.config, self.params, tokenizer, rendered, rng=rng, settings=settings,
                                budgets=budgets, tool_fn=tool_fn, row_ids=row_ids, hooks=hooks)
    generations = [self._generation(r) for r in rollouts]
    return generations[0] if single else generations

  def reply_logprobs(self, messages: Sequence[dict], replies: Sequence[str], mode: str = 'reasoning'
                     ) -> np.ndarray:
    """log P(reply) [len(replies)] float64: each reply scored as the assistant's whole next turn after
    `messages` in `mode`, a response section holding exactly that text and nothing before it (no thinking,
    no action), then the turn's end; the sum of its token log-probs (the tokens `render`'s loss mask marks).

    The end tokens make a reply that is a prefix of another ("YES" and "YESTERDAY") its own choice, and the
    section and turn markers every reply shares cancel between replies, so argmax picks among them
    whatever the mode: a constrained choice (`luckystar.serve`'s guided_choice) without sampling. A reply that
    with the messages does not fit the model's context is a ValueError.
    """
    tokenizer = self._chat_tokenizer()
    if not replies:
      raise ValueError('replies is empty; give at least one reply to score')
    messages = tokenizer_lib.from_openai(messages)
    rendered = [tokenizer.render([*messages, {'role': 'assistant', 'response': reply}], mode) for reply in replies]
    context = self.config.max_position_embeddings
    if (longest := max(len(ids) for ids, _ in rendered)) > context:
      raise ValueError(f'a reply with the messages takes {longest} tokens, more than the context of {context}')
    # Right padding never reaches the real tokens (attention is causal); shapes rounded to powers of two reuse a
    # few programs, and a forward pass holds at most _SCORED_LOGITS logits (many long replies: several passes).
    length = max(64, 1 << (longest - 1).bit_length())
    fitting = max(_SCORED_LOGITS // (length * self.config.vocab_size), 1)   # rows per pass, rounded down below
    rows = min(1 << (len(rendered) - 1).bit_length(), 1 << fitting.bit_length() - 1)
    token_ids = np.zeros((-(-len(rendered) // rows) * rows, length), np.int32)
    scored = np.zeros(token_ids.shape, bool)
    for row, (ids, mask) in enumerate(rendered):
      token_ids[row, :len(ids)], scored[row, :len(mask)] = ids, mask
    chosen = np.concatenate([np.asarray(_next_token_logprobs(self.config, self.params, token_ids[start:start + rows]),
                                        np.float64) for start in range(0, len(token_ids), rows)])
    return np.where(scored[:, 1:], chosen, 0.0).sum(axis=1)[:len(replies)]

  def quantize(self, *, group_size: int = 128, scale_dtype: str = 'bfloat16', bits: int = 4) -> 'Model':
    """This model with int weights (AQT CONVERT → SERVE, luckystar/quant): symmetric, weight-only, one
    scale per `group_size` input features (0: per output channel), scales rounded to `scale_dtype`
    (the export dtype). `logits`, `generate` and `save_hf` run from the int values; the embedding
    stays float."""
    config, params = quant.convert(self.config, self.params, bits=bits, group_size=group_size,
                                   scale_dtype=scale_dtype)
    return Model(config, params, self.tokenizer, self.source_dtype)

  def save_hf(self, path: str | os.PathLike, *, dtype: str | None = None, quantization: str | None = None,
              group_size: int = 128) -> None:
    """A transformers Cohere2 directory (config, safetensors in `dtype`, default the dtype the model was loaded
    from, else its param_dtype; with a tokenizer, also
    its tokenizer files with our chat template for its format, so `AutoTokenizer` encodes and
    `apply_chat_template(messages, tools=..., enable_thinking=...)` renders as we do, and a
    generation config); `luckystar.load(path)` reads it back.

    quantization='int4': compressed-tensors pack-quantized (W4A16) Linears, which transformers (with
    compressed-tensors) and vLLM load. A float model is quantized first (`quantize(group_size=...,
    scale_dtype=dtype)`); an already quantized one (`quantize()`, or loaded from an int4 directory) is
    written from its own int values and scales, bit for bit. A quantization-aware (TRAIN mode) model
    converts with its own settings.
    """
    config, params = self.config, self.params
    dtype = dtype or self.source_dtype or config.param_dtype
    if quantization not in (None, 'int4'):
      raise ValueError(f'quantization must be None or "int4", got {quantization!r}')
    if quantization is None and quant.is_served(config):
      raise ValueError('this model is quantized; save it with quantization="int4" (its int values and scales)')
    if quantization is None:
      config = config.replace(quant=None)   # a quantization-aware (TRAIN mode) model's float kernels
    elif not quant.is_served(config):
      config, params = quant.convert(config, params, group_size=group_size, scale_dtype=dtype)
    hf.save_hf(path, config, params, dtype=dtype, tokenizer=self.tokenizer)

  def _chat_tokenizer(self) -> tokenizer_lib.Tokenizer:
    if self.tokenizer is None:
      raise ValueError('this model has no tokenizer (its directory has neither tokenizer.json nor a tokenizer.model '
                       'with our chat tokens); copy its tokenizer files into it, or set model.tokenizer')
    return self.tokenizer

  def _generation(self, rollout: sampling.Rollout) -> Generation:
    turn = rollout.final_turn
    if turn.response is not None:
      text = turn.response
    else:  # the final turn's ids: after the last spliced (mask 0) token
      generated = np.flatnonzero(rollout.loss_mask == 0)
      text = self.tokenizer.decode(rollout.token_ids[generated[-1] + 1 if generated.size else 0:])
    return Generation(text=text, thinking=rollout.thinking, response=turn.response, actions=rollout.actions,
                      finished=rollout.finished, overlong=rollout.overlong, rollout=rollout)


def _one_each(values: Sequence[Any], count: int, name: str) -> list[Any]:
  if len(values := list(values)) != count:
    raise ValueError(f'{name}: {len(values)} values for {count} conversations; give one, or one per conversation')
  return values


def _tool_fn(tools: Tools, num_prompts: int) -> sampling.ToolFn:
  """The tool_fn of `Model.generate`'s `tools`; a database path that does not exist is a FileNotFoundError
  here, before any sampling (the sandbox would report it only as an SQL error inside each reply)."""
  if callable(tools):
    return tools
  if tools is None:
    return sampling.agent_tools([None] * num_prompts)
  if isinstance(tools, (str, os.PathLike)):
    paths = [os.fspath(tools)] * num_prompts
  else:
    paths = [None if p is None else os.fspath(p) for p in tools]
    if len(paths) != num_prompts:
      raise ValueError(f'tools has {len(paths)} database paths for {num_prompts} prompts; give one per prompt '
                       f'or a single path for all')
  if missing := sorted({p for p in paths if p is not None and not os.path.isfile(p)}):
    raise FileNotFoundError(f'tools: no such SQLite database file: {", ".join(missing)}')
  return sampling.agent_tools(paths)


def _dir_tokenizer(path: pathlib.Path, chat_format: str, config: model_lib.ModelConfig
                   ) -> tokenizer_lib.Tokenizer | None:
  """The tokenizer a transformers directory carries (`tokenizer.from_dir`), None if it has none; checked to
  make only ids that `config` embeds."""
  try:
    tokenizer = tokenizer_lib.from_dir(path, chat_format)
  except (ValueError, OSError) as e:   # names the directory and what its tokenizer lacks
    raise errors.InvalidFile(str(e) if str(path) in str(e) else f'{path}: {e}') from None
  _check_vocab(tokenizer, path, config, f'{path / "config.json"} gives')
  return tokenizer


def _check_vocab(tokenizer: tokenizer_lib.Tokenizer | None, directory: pathlib.Path, config: model_lib.ModelConfig,
                 gives: str) -> None:
  """An InvalidFile naming the tokenizer file in `directory` when it makes ids the model has no embedding for
  (a tokenizer of another model): they would index past the embedding, silently, on an accelerator."""
  if tokenizer is None or tokenizer.vocab_size <= config.vocab_size:
    return
  file = directory / ('tokenizer.model' if tokenizer.codec.backend == 'sentencepiece' else 'tokenizer.json')
  raise errors.InvalidFile(f'{file}: the tokenizer makes ids up to {tokenizer.vocab_size - 1}, but {gives} '
                           f'vocab_size={config.vocab_size}; it is the tokenizer of another model')


def _model_type_note(path: pathlib.Path) -> str:
  """Why a directory with a config.json is not a transformers directory we read, if that is why."""
  if not (path / 'config.json').is_file():
    return ''
  return (f'; its config.json has model_type {hf.read_json_object(path / "config.json").get("model_type")!r}, '
          f'not one of {hf.MODEL_TYPES}')


# A Hugging Face repo id, optionally at a revision (branch, tag or commit): 'org/name', 'org/name@v1'.
_HUB_PART = r'[A-Za-z0-9_](?:[\w.-]*[A-Za-z0-9_])?'
HUB_REPO_ID = re.compile(rf'(?P<repo>{_HUB_PART}/{_HUB_PART})(?:@(?P<revision>[\w./-]+))?')


def hub_cache_dir() -> pathlib.Path:
  """The Hugging Face hub cache as `hf download` run now would use it: $HF_HUB_CACHE, else $HF_HOME/hub, else
  ~/.cache/huggingface/hub (read at each call, not at import as huggingface_hub.constants does)."""
  if cache := os.environ.get('HF_HUB_CACHE') or os.environ.get('HUGGINGFACE_HUB_CACHE'):
    return pathlib.Path(cache).expanduser()
  home = os.environ.get('HF_HOME') or os.path.join(os.environ.get('XDG_CACHE_HOME') or '~/.cache', 'huggingface')
  return pathlib.Path(home).expanduser() / 'hub'


def _hub_snapshot(name: str, repo: str, revision: str | None) -> pathlib.Path:
  """The cached snapshot directory of `repo` at `revision` (default: main), never touching the network; a
  MissingFile naming the cache and the download command if it is not there."""
  cache = hub_cache_dir()
  try:
    return pathlib.Path(huggingface_hub.snapshot_download(repo, revision=revision, cache_dir=cache,
                                                          local_files_only=True))
  except hub_errors.LocalEntryNotFoundError as e:
    incomplete = isinstance(e, getattr(hub_errors, 'IncompleteSnapshotError', ()))
    found = 'only partly' if incomplete else 'not'
    command = f'hf download {repo}' + (f' --revision {revision}' if revision else '')
    raise errors.MissingFile(
        f'{name}: no such bundled model or directory, and {found} in the Hugging Face cache {cache} '
        f'(revision {revision or "main"}); download it with `{command}` (luckystar never downloads)') from None


def resolve(name_or_path: str | pathlib.Path) -> pathlib.Path:
  """The directory of a bundled model name, a path, or a Hugging Face repo id ('org/name[@revision]') in the
  local hub cache (`hub_cache_dir`); a MissingFile if there is none. A bundled name or an existing path wins."""
  name = str(name_or_path)
  path = BUNDLED_DIR / name if name in BUNDLED_MODELS else pathlib.Path(name_or_path)
  if path.exists():
    return path
  if isinstance(name_or_path, str) and (repo_id := HUB_REPO_ID.fullmatch(name)):
    return _hub_snapshot(name, repo_id['repo'], repo_id['revision'])
  raise errors.MissingFile(f'{path}: no such bundled model or directory; bundled models: {BUNDLED_MODELS}')


def open_hf(name_or_path: str | pathlib.Path, chat_format: str = 'auto', **config_overrides: Any
            ) -> tuple[model_lib.ModelConfig, dict[str, hf.TensorHeader], tokenizer_lib.Tokenizer | None] | None:
  """(config, tensor headers, tokenizer) of a float transformers directory, checked but with no tensor data
  read (`hf.load_sharded` streams it onto a mesh); None for anything else (a run directory, an int4
  checkpoint), which `load` reads whole."""
  path = resolve(name_or_path)
  if checkpoint.is_run_dir(path) or not hf.is_hf_dir(path):
    return None
  config, headers = hf.read_config(path, **config_overrides)
  return None if quant.is_served(config) else (config, headers, _dir_tokenizer(path, chat_format, config))


def load(name_or_path: str | pathlib.Path, chat_format: str = 'auto', **config_overrides: Any) -> Model:
  """A bundled model name (`tiny-sft`, ...), a luckystar run/checkpoint directory (its latest
  checkpoint's params), or a transformers Cohere2/Cohere directory, float or int4 (compressed-tensors
  pack-quantized, as `Model.save_hf(..., quantization="int4")` writes it: served from its int values),
  also as a Hugging Face repo id ('org/name' or 'org/name@revision') already in the local hub cache
  (`resolve`; nothing is downloaded).

  The tokenizer is the one the directory carries (a run directory's recorded one), in `chat_format`
  ('auto': detected from its special tokens; `luckystar.tokenizer.formats`).
  `config_overrides` replace ModelConfig fields, e.g. `param_dtype='bfloat16', dtype='bfloat16'`;
  params are cast to the resulting `param_dtype`.

  A path that does not exist is an `errors.MissingFile`; one that exists but cannot be read as a model (a
  malformed config.json or index, a truncated or non-safetensors weight file, tensors that disagree with
  config.json) is an `errors.InvalidFile` naming the file and the fault, raised before any tensor data is
  read where the headers tell. Both are `errors.UserError`s (and a FileNotFoundError / ValueError).
  """
  path = resolve(name_or_path)
  if checkpoint.is_run_dir(path):
    config, params = checkpoint.load_params(path)
    config, tokenizer = config.replace(**config_overrides), checkpoint.load_tokenizer(path, chat_format)
    _check_vocab(tokenizer, checkpoint.tokenizer_dir(path), config, f'the checkpoint in {path} has')
    source_dtype = config.param_dtype
  elif hf.is_hf_dir(path):
    config, params = hf.load_hf(path, **config_overrides)
    tokenizer = _dir_tokenizer(path, chat_format, config)
    source_dtype = hf.read_headers(path)[hf.EMBEDDING].dtype
  else:
    raise errors.InvalidFile(f'{path}: not a model directory luckystar can read (expected a transformers '
                             f'Cohere2/Cohere directory with config.json and safetensors, or a luckystar run '
                             f'directory){_model_type_note(path)}')
  # Int4 checkpoints keep their int values and scales as they are; everything else is param_dtype.
  params = quant.cast_float_params(params, config.param_dtype)
  return Model(config, params, tokenizer, source_dtype)
