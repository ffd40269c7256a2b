"""The OpenAI wire format: request parsing and validation, and the response/chunk shapes.

Requests are validated into ``GenerationParams`` (what the engine needs) or rejected with a
``RequestError`` that the API turns into HTTP 400 and an OpenAI-style ``{"error": {...}}``
body. Unknown fields are ignored, as OpenAI-compatible servers do, so that benchmark clients
that send extra knobs still work.

Streaming follows what benchmark clients rely on (see ECOSYSTEM.md): one chunk per generated
token, the chat role sent only together with the first token, ``finish_reason`` on the last
token's chunk, and the ``choices: []`` usage chunk only when ``stream_options.include_usage``
asks for it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class RequestError(Exception):
    """A request the server refuses (HTTP 400 unless ``status`` says otherwise)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, type_: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None, code: int = 400) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# -- request schemas (extra fields ignored) ------------------------------------------------


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Lenient):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingRequest(_Lenient):
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: str
    content: str | list[ContentPart] | None = None


class ChatRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)


# -- validation -> what the engine needs ---------------------------------------------------


@dataclass(frozen=True)
class ServingContext:
    """What request validation needs to know about the engine behind the server."""

    model_name: str
    max_model_len: int
    vocab_size: int
    encode: Callable[[str], list[int]]
    render_chat: Callable[[list[dict[str, str]]], list[int]]  # messages -> prompt token ids


@dataclass(frozen=True)
class GenerationParams:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool


def _validate(schema: type[BaseModel], body: Any) -> Any:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        return schema.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        what = "is required" if err["type"] == "missing" else f"is invalid: {err['msg']}"
        raise RequestError(f"{param} {what}", param) from None


def _prompt_ids(prompt: Any, ctx: ServingContext) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return ctx.encode(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        bad = next((t for t in prompt if not 0 <= t < ctx.vocab_size), None)
        if bad is not None:
            raise RequestError(f"prompt token id {bad} is out of range: 0 to {ctx.vocab_size - 1}", "prompt")
        return list(prompt)
    raise RequestError("prompt must be a string, a list of token ids, or a list of one of those", "prompt")


def _content_text(msg: ChatMessage, i: int) -> str:
    if msg.content is None or isinstance(msg.content, str):
        return msg.content or ""
    parts = []
    for part in msg.content:
        if part.type != "text" or part.text is None:
            raise RequestError(f"only text content parts are supported, got type {part.type!r}", f"messages.{i}.content")
        parts.append(part.text)
    return "".join(parts)


def _params(req: _SamplingRequest, prompt_ids: list[int], ctx: ServingContext) -> GenerationParams:
    if req.model is not None and req.model != ctx.model_name:
        raise RequestError(f"model {req.model!r} does not exist; this server serves {ctx.model_name!r}", "model")
    if req.n != 1:
        raise RequestError(f"n={req.n} is not supported: only n=1", "n")
    n = len(prompt_ids)
    if n == 0:
        raise RequestError("the prompt is empty", "prompt")
    if n >= ctx.max_model_len:
        raise RequestError(
            f"the prompt has {n} tokens; this model's maximum context length is {ctx.max_model_len} tokens, "
            f"so prompts may have at most {ctx.max_model_len - 1}",
            "prompt",
        )
    key = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = getattr(req, key)
    if max_tokens is None:
        max_tokens = ctx.max_model_len - n  # OpenAI-compatible default: whatever room is left
    elif max_tokens <= 0:
        raise RequestError(f"{key} must be at least 1, got {max_tokens}", key)
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    opts = req.stream_options or StreamOptions()
    return GenerationParams(
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop=tuple(s for s in stop if s),
        ignore_eos=req.ignore_eos,
        stream=req.stream,
        include_usage=req.stream and opts.include_usage,
        continuous_usage=req.stream and opts.continuous_usage_stats,
    )


def parse_completion(body: Any, ctx: ServingContext) -> GenerationParams:
    req = _validate(CompletionRequest, body)
    return _params(req, _prompt_ids(req.prompt, ctx), ctx)


def parse_chat(body: Any, ctx: ServingContext) -> GenerationParams:
    req = _validate(ChatRequest, body)
    messages = [{"role": m.role, "content": _content_text(m, i)} for i, m in enumerate(req.messages)]
    return _params(req, ctx.render_chat(messages), ctx)


# -- responses ------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass
class ResponseFormat:
    """Builds one endpoint's response objects (``completions`` or ``chat``) for one request."""

    kind: Literal["completions", "chat"]
    model: str
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        self.id = self.id or f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = self.created or int(time.time())

    def _envelope(self, obj: str, choices: list[dict], usage_: dict | None) -> dict:
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage_ is not None:
            out["usage"] = usage_
        return out

    def chunk(self, text: str, finish_reason: str | None, first: bool, usage_: dict | None = None) -> dict:
        if self.kind == "chat":
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice], usage_)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice], usage_)

    def usage_chunk(self, usage_: dict) -> dict:
        return self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion", [], usage_)

    def response(self, text: str, finish_reason: str, usage_: dict) -> dict:
        if self.kind == "chat":
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
            return self._envelope("chat.completion", [choice], usage_)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice], usage_)


def models_list(model: str, max_model_len: int, created: int) -> dict:
    card = {"id": model, "object": "model", "created": created, "owned_by": "paged_bench", "max_model_len": max_model_len}
    return {"object": "list", "data": [card]}
