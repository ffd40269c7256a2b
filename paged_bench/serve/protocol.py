"""From a validated request body to what the engine needs (``GenerationParams``), or a
``RequestError`` that the API turns into an OpenAI-shaped error.

Behaviours follow vLLM's OpenAI server (``vllm/entrypoints/openai/protocol.py``,
``serving_engine.py``, ``serving_completion.py``), cited in docs/serving.md:

- an unknown model is 404 ``NotFoundError``;
- ``max_tokens`` (or ``max_completion_tokens``) beyond the room the prompt leaves is 400, naming
  the context length (vLLM: "'max_tokens' or 'max_completion_tokens' is too large ...");
- ``seed`` is any 64-bit integer (a negative one too; -1 is no seed, as in vLLM); ``temperature``
  is at most 2 and below 1e-5 greedy (with ``n`` 1), an empty stop string is refused (as vLLM);
- ``n`` choices per prompt and a list of prompts fan out into one engine request each, choice
  ``i * n + j`` for prompt ``i``, sample ``j``; sample ``j`` of a seeded request uses
  ``seed + j`` (vLLM v1's parallel sampling);
- ``top_logprobs`` needs ``logprobs: true`` (chat); ``logprobs``/``top_logprobs`` at most
  ``max_logprobs`` (vLLM's default 20);
- what the server does not implement (``tools``, ``response_format``, penalties, ...) is 400
  naming the parameter, never silently ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from paged_bench.model.sampling import GREEDY_BELOW
from paged_bench.serve.schemas import NOT_IMPLEMENTED, ChatMessage, ChatRequest, CompletionRequest, StreamOptions
from paged_bench.serve.text import ChatTemplateError


class RequestError(Exception):
    """A request the server refuses (HTTP 400 unless ``status`` says otherwise)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, type_: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status
        self.type = type_ or _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


_ERROR_TYPES = {401: "authentication_error", 404: "NotFoundError", 413: "invalid_request_error",
                429: "rate_limit_error", 503: "server_error"}  # fmt: skip


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None, code: int = 400) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (``server.*`` keys of the same names)."""

    max_stop: int = 16  # stop strings
    max_stop_chars: int = 256  # characters per stop string
    max_prompts: int = 64  # prompts in one completions request
    max_choices: int = 128  # prompts x n
    max_logprobs: int = 20  # logprobs / top_logprobs (vLLM's default max_logprobs)


@dataclass(frozen=True)
class ServingContext:
    """What request validation needs to know about the engine behind the server."""

    model_name: str
    max_model_len: int
    vocab_size: int
    encode: Callable[[str], list[int]]
    render_chat: Callable[[list[dict[str, str]]], list[int]]  # messages -> prompt token ids
    limits: Limits = Limits()
    computes_logprobs: bool = True  # the backend computes logits (the simulator does not)
    # the most UTF-8 bytes one token covers, where the tokenizer bounds it (None: unknown, e.g. a
    # checkpoint's tokenizer whose normaliser may drop text): longer texts are refused untokenized
    max_token_bytes: int | None = None


@dataclass(frozen=True)
class GenerationParams:
    prompts: list[list[int]]  # token ids of each prompt
    n: int  # choices per prompt
    max_tokens: int | None  # None: whatever room each prompt leaves
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    logprobs: int | None = None  # top entries per generated token; None: no logprobs
    echo: bool = False  # completions: the prompt text (and its logprobs) before each choice
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>"
    stop_token_ids: frozenset[int] = frozenset()  # vLLM's: a sampled one ends the choice, its text left out

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    def prompt_of(self, choice: int) -> list[int]:
        return self.prompts[choice // self.n]

    def max_tokens_of(self, choice: int) -> int:
        if self.max_tokens is not None:
            return self.max_tokens
        return self._max_model_len - len(self.prompt_of(choice))

    def seed_of(self, choice: int) -> int | None:
        return None if self.seed is None else self.seed + choice % self.n

    _max_model_len: int = 0


# -- what is refused by name --------------------------------------------------------------


def _refuse_unsupported(req: BaseModel) -> None:
    for name, not_asked in NOT_IMPLEMENTED.items():
        value = getattr(req, name, None)  # a field the endpoint lacks asks for nothing
        if value not in not_asked:
            raise RequestError(f"{name} is not supported by this server (got {_shown(value)})", name)


# -- parsing -------------------------------------------------------------------------------


def _validate(schema: type[BaseModel], body: Any) -> Any:
    if isinstance(body, schema):  # already validated (by FastAPI, from the declared body)
        return body
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        return schema.model_validate(body)
    except ValidationError as e:
        raise validation_error(e.errors()) from None


_KINDS = {"string_type": "a string", "list_type": "a list", "int_type": "an integer", "float_type": "a number",
          "bool_type": "true or false", "dict_type": "an object", "model_type": "an object",
          "model_attributes_type": "an object"}  # fmt: skip
# what the request's unions accept, by the field's name (pydantic reports each member apart)
_UNIONS = {"prompt": "a string, a list of token ids, a list of strings or a list of lists of token ids",
           "stop": "a string or a list of strings", "content": "a string or a list of content parts"}  # fmt: skip


def _param(err: dict) -> str | None:
    # pydantic's locations name union members and validators too ("function-after[...]"): skip them
    loc = [str(p) for p in err.get("loc", ()) if p != "body" and not any(c in str(p) for c in "[(")]
    return ".".join(loc) or None


def _shown(value: Any) -> str:
    """A short JSON rendering of the value a client sent (a container by its kind alone)."""
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "a list"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def validation_error(errors: list[dict]) -> RequestError:
    """The first of pydantic's errors as one message naming the parameter and the value sent.
    A value no member of a union takes (``prompt``: a string or lists) gets one message naming
    what the union accepts, unless a member failed on the value itself (a lone surrogate)."""
    err = errors[0]
    if err.get("type") in ("model_attributes_type", "dict_type") and len(err.get("loc", ())) <= 1:
        return RequestError("the request body must be a JSON object")
    if err.get("type") == "json_invalid":
        return RequestError(f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}")
    param = _param(err)
    if err.get("type") == "missing":
        return RequestError(f"{param or 'the request body'} is required", param)
    inside = [e for e in errors if param is None or (p := _param(e)) == param or str(p).startswith(param + ".")]
    specific = next((e for e in inside if e.get("type") not in _KINDS), None)
    if specific is None and len(inside) > 1:  # no member of a union took it
        field = (param or "").rsplit(".", 1)[-1]
        kinds = _UNIONS.get(field) or " or ".join(dict.fromkeys(_KINDS[e["type"]] for e in inside))
        return RequestError(f"{param} must be {kinds} (got {_shown(err.get('input'))})", param)
    err = specific or err
    param = _param(err)
    return RequestError(f"{param or 'the request body'} is invalid: {err.get('msg')} (got {_shown(err.get('input'))})",
                        param)  # fmt: skip


def _is_ids(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)


def _prompts(prompt: Any, ctx: ServingContext) -> list[list[int]]:
    if isinstance(prompt, str) or _is_ids(prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise RequestError("the prompt list is empty", "prompt")
    if len(prompts) > ctx.limits.max_prompts:
        raise RequestError(f"{len(prompts)} prompts in one request; at most {ctx.limits.max_prompts}", "prompt")
    out = []
    for p in prompts:
        if p == "":  # refused whatever the tokenizer makes of it (one with a BOS token makes one token)
            raise RequestError("the prompt is empty", "prompt")
        if isinstance(p, str):
            _check_text_fits(len(p.encode("utf-8")), ctx)
            out.append(ctx.encode(p))
            continue
        out.append(_in_vocabulary(p, ctx, "prompt token id", "prompt"))
    return out


def _check_text_fits(num_bytes: int, ctx: ServingContext, param: str = "prompt") -> None:
    """Refuse, before tokenizing it, a text too long to fit whatever its tokens: tokenizing a
    megabyte takes the server a second, for a prompt that is refused anyway."""
    per_token = ctx.max_token_bytes
    if per_token and num_bytes > (ctx.max_model_len - 1) * per_token:
        raise RequestError(
            f"the prompt's text has {num_bytes} bytes, so at least {-(-num_bytes // per_token)} tokens (a token "
            f"covers at most {per_token} bytes); this model's maximum context length is {ctx.max_model_len} tokens, "
            f"so prompts may have at most {ctx.max_model_len - 1}", param,
        )  # fmt: skip


def _content_text(msg: ChatMessage, i: int) -> str:
    if msg.content is None or isinstance(msg.content, str):
        return msg.content or ""
    parts = []
    for j, part in enumerate(msg.content):
        if part.type != "text":
            raise RequestError(f"only text content parts are supported, got type {part.type!r}", f"messages.{i}.content")
        if part.text is None:
            raise RequestError("a text content part needs its 'text'", f"messages.{i}.content.{j}.text")
        parts.append(part.text)
    return "".join(parts)


def check_model_name(name: str, ctx: ServingContext) -> None:
    """404 (vLLM's message) unless ``name`` is the served model's."""
    if name != ctx.model_name:
        shown = name if len(name) <= 100 else name[:97] + "..."
        raise RequestError(f"The model `{shown}` does not exist; this server serves {ctx.model_name!r}",
                           "model", status=404)  # fmt: skip


def _check_model(req: BaseModel, ctx: ServingContext) -> None:
    if req.model:  # an empty name is the served model, as vLLM's
        check_model_name(req.model, ctx)


def _check_lengths(
    prompts: list[list[int]], key: str, max_tokens: int | None, ctx: ServingContext, param: str = "prompt"
) -> None:
    longest = max(len(p) for p in prompts)
    if min(len(p) for p in prompts) == 0:
        raise RequestError("the prompt is empty", param)
    if longest >= ctx.max_model_len:
        raise RequestError(
            f"the prompt has {longest} tokens; this model's maximum context length is {ctx.max_model_len} tokens, "
            f"so prompts may have at most {ctx.max_model_len - 1}", param,
        )  # fmt: skip
    if max_tokens is not None and longest + max_tokens > ctx.max_model_len:
        raise RequestError(
            f"'{key}' is too large: {max_tokens}. This model's maximum context length is {ctx.max_model_len} tokens "
            f"and your request has {longest} input tokens ({max_tokens} > {ctx.max_model_len} - {longest})", key,
        )  # fmt: skip


def _in_vocabulary(ids: list[int], ctx: ServingContext, what: str, param: str) -> list[int]:
    bad = next((t for t in ids if not 0 <= t < ctx.vocab_size), None)
    if bad is not None:
        raise RequestError(f"{what} {bad} is out of range: 0 to {ctx.vocab_size - 1}", param)
    return list(ids)


def _stops(stop: Any, limits: Limits) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > limits.max_stop:
        raise RequestError(f"{len(stops)} stop strings; at most {limits.max_stop}", "stop")
    longest = max((len(s) for s in stops), default=0)
    if longest > limits.max_stop_chars:
        raise RequestError(f"a stop string of {longest} characters; at most {limits.max_stop_chars}", "stop")
    if not all(stops):  # as vLLM's SamplingParams refuses it (it was dropped silently)
        raise RequestError("stop cannot contain an empty string", "stop")
    return stops


def _params(req: Any, prompts: list[list[int]], ctx: ServingContext, key: str, max_tokens: int | None,
            logprobs: int | None, echo: bool = False) -> GenerationParams:  # fmt: skip
    _refuse_unsupported(req)
    n = req.n or 1
    if len(prompts) * n > ctx.limits.max_choices:
        raise RequestError(f"{len(prompts)} prompts x n={n} choices; at most {ctx.limits.max_choices}", "n")
    if max_tokens is not None and max_tokens < (0 if echo else 1):
        raise RequestError(f"{key} must be at least {0 if echo else 1}, got {max_tokens}", key)
    _check_lengths(prompts, key, max_tokens, ctx, "messages" if isinstance(req, ChatRequest) else "prompt")
    if logprobs is not None and not ctx.computes_logprobs:
        raise RequestError("this backend computes no logits, so no log-probabilities (serve a real model: "
                           "backend=numpy or torch)", "logprobs")  # fmt: skip
    if logprobs is not None and logprobs > ctx.limits.max_logprobs:
        raise RequestError(f"logprobs={logprobs}; at most {ctx.limits.max_logprobs}",
                           "top_logprobs" if key == "max_completion_tokens" else "logprobs")  # fmt: skip
    temperature = 1.0 if req.temperature is None else req.temperature
    if temperature < GREEDY_BELOW and n > 1:  # every choice would be the same: vLLM refuses it
        raise RequestError(f"n must be 1 when using greedy sampling, got {n}", "n")
    stream = bool(req.stream)
    if req.stream_options is not None and not stream:  # as vLLM refuses it
        raise RequestError("stream_options can only be set when stream is true", "stream_options")
    opts = req.stream_options or StreamOptions()
    if echo and stream and logprobs is not None:
        raise RequestError("echo with logprobs is not available when streaming", "echo")
    return GenerationParams(
        prompts=prompts,
        n=n,
        max_tokens=max_tokens,
        temperature=0.0 if temperature < GREEDY_BELOW else temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        seed=None if req.seed == -1 else req.seed,  # vLLM's SamplingParams reads -1 as no seed
        stop=_stops(req.stop, ctx.limits),
        stop_token_ids=frozenset(_in_vocabulary(req.stop_token_ids or [], ctx, "stop token id", "stop_token_ids")),
        ignore_eos=bool(req.ignore_eos),
        stream=stream,
        include_usage=stream and bool(opts.include_usage),
        continuous_usage=stream and bool(opts.continuous_usage_stats),
        logprobs=logprobs,
        echo=echo,
        tokens_as_ids=bool(req.return_tokens_as_token_ids),
        _max_model_len=ctx.max_model_len,
    )


def parse_completion(body: Any, ctx: ServingContext) -> GenerationParams:
    req = _validate(CompletionRequest, body)
    _check_model(req, ctx)
    return _params(req, _prompts(req.prompt, ctx), ctx, "max_tokens", req.max_tokens, req.logprobs, bool(req.echo))


def parse_chat(body: Any, ctx: ServingContext) -> GenerationParams:
    req = _validate(ChatRequest, body)
    _check_model(req, ctx)
    if req.top_logprobs and not req.logprobs:
        raise RequestError("when using `top_logprobs`, `logprobs` must be set to true", "top_logprobs")
    messages = [{"role": m.role, "content": _content_text(m, i)} for i, m in enumerate(req.messages)]
    if req.echo:
        raise RequestError("echo is not supported by this server on chat completions (got true)", "echo")
    # a template writes every message's role and content into the prompt, so they bound its length
    _check_text_fits(sum(len(m["role"].encode("utf-8")) + len(m["content"].encode("utf-8")) for m in messages),
                     ctx, "messages")  # fmt: skip
    key = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    try:
        prompt = ctx.render_chat(messages)
    except ChatTemplateError as e:
        raise RequestError(str(e), "messages") from None
    return _params(req, [prompt], ctx, key, getattr(req, key), logprobs)
