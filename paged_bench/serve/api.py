"""The FastAPI app: OpenAI-compatible routes over an ``EngineLoop``.

``GET /health``, ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(streaming as server-sent events, or one JSON response), ``GET /metrics``. Bad requests get
HTTP 400 with an OpenAI-style error body; more requests waiting to be scheduled than
``max_waiting`` get 429 with ``Retry-After``; a client that goes away mid-request has its
request aborted (its KV blocks are freed at the engine's next step boundary); an engine error
ends the affected streams with an error event and the server goes on.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from paged_bench.request import FinishReason, Request
from paged_bench.serve import protocol
from paged_bench.serve.engine_loop import EngineLoop, Stream
from paged_bench.serve.prom import CONTENT_TYPE, ServerMetrics
from paged_bench.serve.protocol import GenerationParams, RequestError, ResponseFormat, ServingContext
from paged_bench.serve.text import TextStream

Kind = Literal["completions", "chat"]


class GenerationFailed(Exception):
    """The engine ended a request without finishing it (engine error, shutdown)."""


@dataclass
class Token:
    text: str
    finish_reason: str | None  # set on a request's last token


def _error(e: RequestError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(protocol.error_body(e.message, e.type, e.param, e.status), e.status, headers=headers)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class _DisconnectAwareStreamingResponse(StreamingResponse):
    """Streams until done or until the client disconnects, whichever is first; either way the
    body generator is closed at once (so its ``finally`` aborts the request), whatever ASGI
    spec version the server speaks."""

    async def __call__(self, scope, receive, send) -> None:
        async with anyio.create_task_group() as tg:

            async def stream() -> None:
                try:
                    await self.stream_response(send)
                except OSError:
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(stream)
            await self.listen_for_disconnect(receive)
            tg.cancel_scope.cancel()


async def _until_disconnect(request: HTTPRequest, work: Callable[[], Awaitable[Response]]) -> Response | None:
    """``work()``'s response, or None if the client disconnects first (``work`` is cancelled)."""
    result: list[Response] = []
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            result.append(await work())
            tg.cancel_scope.cancel()

        tg.start_soon(run)
        while (await request.receive())["type"] != "http.disconnect":
            pass
        tg.cancel_scope.cancel()
    return result[0] if result else None


class OpenAIServer:
    def __init__(self, loop: EngineLoop, ctx: ServingContext, decode: Callable[[list[int]], str],
                 metrics: ServerMetrics, max_waiting: int) -> None:
        self.loop, self.ctx, self.decode, self.metrics, self.max_waiting = loop, ctx, decode, metrics, max_waiting
        self.created = int(time.time())

    async def tokens(self, stream: Stream, params: GenerationParams) -> AsyncIterator[Token]:
        """The request's tokens as text deltas; raises GenerationFailed if it cannot finish."""
        text = TextStream(self.decode, params.stop)
        while True:
            update = await stream.queue.get()
            last = len(update.token_ids) - 1
            for i, token_id in enumerate(update.token_ids):
                delta = text.add(token_id)
                if text.stopped:
                    self.loop.finish(stream, FinishReason.STOP)
                    yield Token(delta, "stop")
                    return
                reason = update.finish_reason
                if i == last and reason is not None and reason.succeeded:
                    yield Token(delta + text.flush(), reason.value)
                    return
                yield Token(delta, None)
            if update.finish_reason is not None:
                raise GenerationFailed(update.error or f"the request ended: {update.finish_reason.value}")

    def submit(self, params: GenerationParams) -> Stream:
        if not self.loop.alive:
            raise RequestError("the engine is not running", status=503)
        if self.loop.num_waiting() >= self.max_waiting:
            raise RequestError(f"too many requests waiting ({self.max_waiting}); retry later", status=429,
                               type_="rate_limit_error")
        req = Request(
            request_id=f"req-{id(params):x}-{time.perf_counter_ns()}",
            arrival_time=0.0,  # set by submit, on the engine's clock
            token_ids=list(params.prompt_ids),
            max_tokens=params.max_tokens,
            ignore_eos=params.ignore_eos,
            temperature=params.temperature,
            top_p=params.top_p,
            sampling_seed=params.seed,
        )
        return self.loop.submit(req)

    async def generate(self, request: HTTPRequest, kind: Kind) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _error(RequestError(f"the request body is not valid JSON: {e}"))
        try:
            params = (protocol.parse_chat if kind == "chat" else protocol.parse_completion)(body, self.ctx)
            stream = self.submit(params)
        except RequestError as e:
            return _error(e, {"Retry-After": "1"} if e.status in (429, 503) else None)
        fmt = ResponseFormat(kind, self.ctx.model_name)
        if params.stream:
            return _DisconnectAwareStreamingResponse(self.sse(stream, params, fmt), media_type="text/event-stream")
        response = await _until_disconnect(request, lambda: self.collect(stream, params, fmt))
        if response is None:
            self.loop.finish(stream)
        return response or Response(status_code=499)

    async def collect(self, stream: Stream, params: GenerationParams, fmt: ResponseFormat) -> Response:
        parts, n, reason = [], 0, "length"
        try:
            async for token in self.tokens(stream, params):
                parts.append(token.text)
                n += 1
                reason = token.finish_reason or reason
        except GenerationFailed as e:
            return _error(RequestError(str(e), status=500))
        usage = protocol.usage(len(params.prompt_ids), n)
        return JSONResponse(fmt.response("".join(parts), reason, usage))

    async def sse(self, stream: Stream, params: GenerationParams, fmt: ResponseFormat) -> AsyncIterator[str]:
        n, prompt_tokens, finished = 0, len(params.prompt_ids), False
        try:
            try:
                async for token in self.tokens(stream, params):
                    n += 1
                    usage = protocol.usage(prompt_tokens, n) if params.continuous_usage else None
                    yield _sse(fmt.chunk(token.text, token.finish_reason, n == 1, usage))
                if params.include_usage:
                    yield _sse(fmt.usage_chunk(protocol.usage(prompt_tokens, n)))
            except GenerationFailed as e:
                yield _sse(protocol.error_body(str(e), "server_error", None, 500))
            finished = True
            yield "data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away (or the stream was cancelled)
                self.loop.finish(stream)

    def health(self) -> Response:
        if not self.loop.alive:
            return _error(RequestError("the engine is not running", status=503))
        return Response(status_code=200)


def create_app(server: OpenAIServer) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.loop.start()
        try:
            yield
        finally:
            server.loop.stop()

    app = FastAPI(title="paged_bench", lifespan=lifespan)
    app.state.server = server

    @app.get("/health")
    async def health() -> Response:
        return server.health()

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(protocol.models_list(server.ctx.model_name, server.ctx.max_model_len, server.created))

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest) -> Response:
        return await server.generate(request, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest) -> Response:
        return await server.generate(request, "chat")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    return app
