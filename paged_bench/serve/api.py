"""The FastAPI app: OpenAI-compatible routes over an ``EngineLoop``.

``GET /health`` (``{"status": "ok"}``; 503 once the engine has stopped), ``GET /v1/models`` and
``GET /v1/models/{id}`` (OpenAI's ``models.retrieve``), ``POST /v1/completions``,
``POST /v1/chat/completions`` (streaming as server-sent events, or one JSON response),
``GET /metrics``; ``/openapi.json`` says what they answer and refuse (``openapi``). A request with
``n`` choices per prompt, or a list of prompts, fans out into one engine request per choice
(vLLM v1's parallel sampling); identical prompts share their full KV blocks through the
prefix cache. Every error is an OpenAI-shaped body (``errors``); more requests waiting than
``max_waiting`` get 429 with ``Retry-After``; a client that goes away has its requests aborted
(their KV blocks are freed at the engine's next step boundary); an engine error ends the
affected streams with an error event, and the server goes on; at shutdown, requests still in
flight past the grace period are answered 503 (streams: an error event).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from paged_bench.core.request import FinishReason, Request
from paged_bench.model.logprobs import LogprobSink, LogprobsRequest, TokenLogprob
from paged_bench.serve import errors, schemas
from paged_bench.serve.engine_loop import EngineLoop, Stream
from paged_bench.serve.openapi import GENERATE_RESPONSES, KEY, error, openapi
from paged_bench.serve.prom import CONTENT_TYPE, ServerMetrics
from paged_bench.serve.protocol import GenerationParams, RequestError, ServingContext, check_model_name
from paged_bench.serve.responses import (
    ChoiceResult,
    Kind,
    LogprobFormatter,
    ResponseFormat,
    model_card,
    models_list,
    usage,
)
from paged_bench.serve.text import TextStream

PARSE_IN_THREAD_BYTES = 64 * 1024  # tokenizing a bigger body would hold up every stream


class GenerationFailed(Exception):
    """The engine ended a request without finishing it: 500 for an engine error, 503 when the
    server is shutting down (aborted: a client that went away is not answered at all)."""

    def __init__(self, message: str, reason: FinishReason) -> None:
        super().__init__(message)
        self.status = 503 if reason == FinishReason.ABORT else 500


@dataclass
class Token:
    choice: int
    text: str
    finish_reason: str | None  # set on a choice's last token
    logprob: TokenLogprob | None = None


@dataclass
class Choice:
    """One engine request behind one choice of a response."""

    index: int
    stream: Stream
    prompt_ids: list[int]
    echo_text: str = ""  # sent before the generated text (completions with echo)
    generate: bool = True  # False: echo with max_tokens=0, the one generated token is dropped


def _engine_request(params: GenerationParams, i: int) -> Request:
    """The engine request behind choice ``i`` (a ``LogprobsRequest`` when logprobs are asked)."""
    max_tokens = params.max_tokens_of(i)
    fields = {
        "request_id": f"req-{id(params):x}-{time.perf_counter_ns()}-{i}",
        "arrival_time": 0.0,  # set by submit, on the engine's clock
        "token_ids": list(params.prompt_of(i)),
        "max_tokens": max(1, max_tokens),  # echo without generation still runs a step (vLLM: max_tokens 1)
        "ignore_eos": params.ignore_eos or max_tokens == 0,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "sampling_seed": params.seed_of(i),
    }
    if params.logprobs is None:
        return Request(**fields)
    return LogprobsRequest(**fields, sink=LogprobSink(params.logprobs, params.echo), want_prompt_logprobs=params.echo)


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
                 metrics: ServerMetrics, max_waiting: int) -> None:  # fmt: skip
        self.loop, self.ctx, self.decode, self.metrics, self.max_waiting = loop, ctx, decode, metrics, max_waiting
        self.created = int(time.time())

    # -- one choice ---------------------------------------------------------------------------

    async def tokens(self, choice: Choice, params: GenerationParams) -> AsyncIterator[Token]:
        """One choice's tokens as text deltas; raises GenerationFailed if it cannot finish."""
        text, req = TextStream(self.decode, params.stop), choice.stream.req
        n_out = 0
        while True:
            update = await choice.stream.queue.get()
            last = len(update.token_ids) - 1
            for i, token_id in enumerate(update.token_ids):
                logprob = req.logprobs[n_out] if isinstance(req, LogprobsRequest) and n_out < len(req.logprobs) else None
                n_out += 1
                if not choice.generate:
                    break
                if token_id in params.stop_token_ids:  # as vLLM's check_stop: counted, its text left out
                    self.loop.finish(choice.stream, FinishReason.STOP)
                    yield Token(choice.index, text.flush(), "stop", logprob)
                    return
                delta = text.add(token_id)
                if text.stopped:
                    self.loop.finish(choice.stream, FinishReason.STOP)
                    yield Token(choice.index, delta, "stop", logprob)
                    return
                reason = update.finish_reason
                if i == last and reason is not None and reason.succeeded:
                    delta += text.flush()
                    yield Token(choice.index, delta, "stop" if text.stopped else reason.value, logprob)
                    return
                yield Token(choice.index, delta, None, logprob)
            if update.finish_reason is not None:
                if update.finish_reason.succeeded:  # echo without generation
                    yield Token(choice.index, "", update.finish_reason.value)
                    return
                raise GenerationFailed(update.error or f"the request ended: {update.finish_reason.value}",
                                       update.finish_reason)  # fmt: skip

    def submit(self, params: GenerationParams, echo_text: Callable[[list[int]], str]) -> list[Choice]:
        if not self.loop.alive:
            raise RequestError("the engine is not running", status=503)
        if self.loop.num_waiting() + params.num_choices > self.max_waiting:
            raise RequestError(f"too many requests waiting ({self.max_waiting}); retry later", status=429)
        indices = range(params.num_choices)
        streams = self.loop.submit_group([_engine_request(params, i) for i in indices])
        choices = []
        for i, stream in zip(indices, streams):
            prompt, max_tokens = params.prompt_of(i), params.max_tokens_of(i)
            text = echo_text(prompt) if params.echo else ""
            choices.append(Choice(i, stream, prompt, text, max_tokens > 0))
        return choices

    # -- a request ----------------------------------------------------------------------------

    async def generate(self, request: HTTPRequest, body: Any, kind: Kind) -> Response:
        parse = errors.parse_chat if kind == "chat" else errors.parse_completion
        size = request.headers.get("content-length", "")
        # a chunked body states no size: it may be as large as any, so it goes to the thread too
        if not size.isdigit() or int(size) > PARSE_IN_THREAD_BYTES:
            params = await anyio.to_thread.run_sync(parse, body, self.ctx)
        else:
            params = parse(body, self.ctx)
        if isinstance(params, Response):
            return params
        try:
            choices = self.submit(params, self.decode)
        except RequestError as e:
            return errors.response(e, {"Retry-After": "1"} if e.status in (429, 503) else None)
        fmt = ResponseFormat(kind, self.ctx.model_name)
        logprobs = LogprobFormatter(kind, self.decode, params.tokens_as_ids)
        if params.stream:
            body_iter = self.sse(choices, params, fmt, logprobs)
            return _DisconnectAwareStreamingResponse(body_iter, media_type="text/event-stream")
        response = await _until_disconnect(request, lambda: self.collect(choices, params, fmt, logprobs))
        if response is None:
            for c in choices:
                self.loop.finish(c.stream)
        return response or Response(status_code=499)

    async def collect_one(self, choice: Choice, params: GenerationParams,
                          logprobs: LogprobFormatter) -> tuple[ChoiceResult, int]:  # fmt: skip
        parts, entries, reason = [], [], "length"
        async for token in self.tokens(choice, params):
            parts.append(token.text)
            if token.logprob is not None:
                entries.append(token.logprob)
            reason = token.finish_reason or reason
        n = len(parts) if choice.generate else 0
        lp = None
        if params.logprobs is not None and params.echo:
            # every prompt token's entries, up to 64 prompts x 4,095 tokens x 20: off the event loop
            lp = await anyio.to_thread.run_sync(self.choice_logprobs, choice, entries, logprobs)
        elif params.logprobs is not None:
            lp = logprobs.of(entries)
        return ChoiceResult(choice.index, choice.echo_text + "".join(parts), reason, lp), n

    @staticmethod
    def choice_logprobs(choice: Choice, entries: list[TokenLogprob], fmt: LogprobFormatter) -> dict:
        """Echo: the prompt's tokens (the first has no log-probability) then the generated ones."""
        req = choice.stream.req
        if len(req.prompt_logprobs) != len(choice.prompt_ids) - 1:  # never a misaligned answer
            raise GenerationFailed(f"only {len(req.prompt_logprobs)} of the prompt's {len(choice.prompt_ids) - 1} "
                                   "log-probabilities were computed", FinishReason.ERROR)  # fmt: skip
        prompt_entries: list[TokenLogprob | None] = [None, *req.prompt_logprobs]
        return fmt.completion(prompt_entries + list(entries), choice.prompt_ids + [e.token_id for e in entries])

    async def collect(self, choices: list[Choice], params: GenerationParams, fmt: ResponseFormat,
                      logprobs: LogprobFormatter) -> Response:  # fmt: skip
        tasks = [asyncio.create_task(self.collect_one(c, params, logprobs)) for c in choices]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = next((t.exception() for t in tasks if t.done() and t.exception() is not None), None)
            if failed is not None:  # one choice cannot finish: the response cannot either
                for c in choices:
                    self.loop.finish(c.stream)
                if isinstance(failed, GenerationFailed):
                    headers = {"Retry-After": "1"} if failed.status == 503 else None
                    return errors.response(RequestError(str(failed), status=failed.status), headers)
                raise failed
            results = [t.result() for t in tasks]
        finally:
            for t in tasks:
                t.cancel()
        prompt_tokens = sum(len(p) for p in params.prompts)
        usage_ = usage(prompt_tokens, sum(n for _, n in results))
        content = fmt.response([r for r, _ in results], usage_)
        if params.logprobs is not None and params.echo:  # tens of MB of JSON: rendered off the event loop
            return await anyio.to_thread.run_sync(JSONResponse, content)
        return JSONResponse(content)

    async def merged(self, choices: list[Choice], params: GenerationParams) -> AsyncIterator[Token]:
        """The tokens of every choice, as they come."""
        if len(choices) == 1:
            async for token in self.tokens(choices[0], params):
                yield token
            return
        queue: asyncio.Queue[Token | BaseException | None] = asyncio.Queue()

        async def pump(choice: Choice) -> None:
            try:
                async for token in self.tokens(choice, params):
                    await queue.put(token)
                await queue.put(None)
            except GenerationFailed as e:
                await queue.put(e)

        tasks = [asyncio.create_task(pump(c)) for c in choices]
        try:
            remaining = len(choices)
            while remaining:
                item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for t in tasks:
                t.cancel()

    async def sse(self, choices: list[Choice], params: GenerationParams, fmt: ResponseFormat,
                  logprobs: LogprobFormatter) -> AsyncIterator[str]:  # fmt: skip
        n, prompt_tokens, finished = 0, sum(len(p) for p in params.prompts), False
        started: set[int] = set()
        try:
            try:
                async for token in self.merged(choices, params):
                    choice = choices[token.choice]
                    n += choice.generate
                    text = token.text
                    if token.choice not in started:
                        started.add(token.choice)
                        text = choice.echo_text + text
                    lp = None
                    if params.logprobs is not None and token.logprob is not None:
                        lp = logprobs.of([token.logprob])
                    usage_ = usage(prompt_tokens, n) if params.continuous_usage else None
                    yield _sse(fmt.chunk(token.choice, text, token.finish_reason, lp, usage_))
                if params.include_usage:
                    yield _sse(fmt.usage_chunk(usage(prompt_tokens, n)))
            except GenerationFailed as e:
                yield _sse(errors.body(RequestError(str(e), status=e.status)))
            finished = True
            yield "data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away (or the stream was cancelled)
                for c in choices:
                    self.loop.finish(c.stream)

    def health(self) -> Response:
        if not self.loop.alive:
            return errors.response(RequestError("the engine is not running", status=503))
        return JSONResponse({"status": "ok"})

    def model(self, model_id: str) -> JSONResponse:
        try:
            check_model_name(model_id, self.ctx)
        except RequestError as e:
            return errors.response(e)
        return JSONResponse(model_card(self.ctx.model_name, self.ctx.max_model_len, self.created))


def create_app(server: OpenAIServer) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.loop.start()
        try:
            yield
        finally:
            server.loop.stop()

    app = FastAPI(title="paged_bench", summary="OpenAI-compatible server over the paged_bench engine",
                  lifespan=lifespan)  # fmt: skip
    app.state.server = server
    errors.install(app)

    @app.get("/health", response_model=schemas.HealthStatus, responses={503: error("the engine is not running")})
    @app.head("/health", include_in_schema=False)  # load balancers' health checks use HEAD
    async def health() -> Response:
        return server.health()

    @app.get("/v1/models", response_model=schemas.ModelList, responses=KEY)
    async def models() -> JSONResponse:
        return JSONResponse(models_list(server.ctx.model_name, server.ctx.max_model_len, server.created))

    # :path, as a model's name may have a slash (org/model), which the openai client sends as is
    @app.get("/v1/models/{model_id:path}", response_model=schemas.ModelCard,
             responses={**KEY, 404: error("unknown model")})  # fmt: skip
    async def model(model_id: str) -> JSONResponse:
        return server.model(model_id)

    sse = {"text/event-stream": {"schema": {"type": "string"}}}

    @app.post("/v1/completions", response_model=schemas.Completion,
              responses={200: {"content": sse}, **GENERATE_RESPONSES})  # fmt: skip
    async def completions(body: schemas.CompletionRequest, request: HTTPRequest) -> Response:
        return await server.generate(request, body, "completions")

    @app.post("/v1/chat/completions", response_model=schemas.ChatCompletion,
              responses={200: {"content": sse}, **GENERATE_RESPONSES})  # fmt: skip
    async def chat_completions(body: schemas.ChatRequest, request: HTTPRequest) -> Response:
        return await server.generate(request, body, "chat")

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    app.openapi = lambda: app.openapi_schema or openapi(app, server.ctx)  # type: ignore[method-assign]
    return app
