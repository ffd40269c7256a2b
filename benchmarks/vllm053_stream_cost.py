"""The API server's CPU per streamed output in vLLM 0.5.3, where it ran in the engine's process,
measured here by rebuilding its path from the same parts (issue 35: ``frontend.stream_ms``, the
vLLM 0.5.3 cases of conf/validation/vllm060_perf_post_v053.yaml).

What vLLM 0.5.3.post1 runs for each output of a streamed completion (SolitaryThinker/vllm at
38c4b7e863570a045308af814c72f4504297222e, "Bump version to 0.5.3.post1"), one process, one event
loop (the model's forward in an executor thread, ``make_async`` -> ``run_in_executor``):

- engine side (``AsyncLLMEngine.engine_step``): ``step_async`` schedules, runs the model, then
  ``_process_model_outputs`` builds a ``RequestOutput`` per scheduled request (detokenised
  incrementally): the engine's CPU price (``backend.engine_cpu=vllm_v0``), not measured here;
  then ``RequestTracker.process_request_output`` puts each into its request's ``AsyncStream``
  (an ``asyncio.Queue``, ``put_nowait``): counted here, as the server's;
- API server side: ``AsyncLLMEngine._process_request`` (an async generator over the stream) ->
  ``merge_async_iterators`` (vllm/utils.py: a producer task per prompt putting into a second
  queue, a consumer generator) -> ``OpenAIServingCompletion.completion_stream_generator``
  (``await raw_request.is_disconnected()`` on every output, the delta text sliced off
  ``output.text``, a ``CompletionStreamResponse`` pydantic model with one
  ``CompletionResponseStreamChoice``, ``model_dump_json(exclude_unset=False)``, ``f"data: ...\\n\\n"``)
  -> starlette's ``StreamingResponse`` (``send`` of an ``http.response.body`` message, through
  ``CORSMiddleware``, which vLLM adds with ``allow_origins=["*"]``) -> uvicorn (``uvicorn[standard]``:
  uvloop, httptools) writes the chunk to the socket.

Rebuilt here with those parts (this machine's pydantic v2, FastAPI/starlette, uvicorn, uvloop,
httptools; the versions are printed): the same pydantic models (0.5.3's fields), the same queues,
generators and middleware; the "engine" only builds each step's outputs (timed on its own and
taken off: that is the engine's price) and sleeps between steps, as the loop does while the GPU
runs. The client is vLLM 0.5.3's ``benchmarks/backend_request_func.py``
``async_request_openai_completions`` (aiohttp, one session a request, every chunk parsed), in
this process; the server in its own. Every request is in before the first step (their intake is
``frontend.intake_ms``'s, measured by benchmarks/vllm_frontend_burst.py, and left out here).

    .venv/bin/python benchmarks/vllm053_stream_cost.py [--requests 128] [--outputs 32 128] [--runs 3]

Prints, per run and output length: the server's CPU (process time: user + system, all threads)
from the first step to the last chunk sent, less the engine's own, per streamed output; and the
fit over the lengths: CPU per output (the slope) and per request (the rest: the response's
start and end). CPU time, not wall: this shared 2-core machine stretches wall times.
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from importlib.metadata import version

from pydantic import BaseModel, ConfigDict, Field
from vllm_frontend_burst import CompletionRequest, free_port, wait_for

WORD = " the"  # one detokenised output token's delta text (about four characters)


class OpenAIBaseModel(BaseModel):  # vLLM 0.5.3 protocol.py: extra fields forbidden
    model_config = ConfigDict(extra="forbid")


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0


class CompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = Field(default=None)


class CompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = Field(default=None)


class CompletionOutput:  # vllm/outputs.py (plain class): the engine's cumulative text and ids
    __slots__ = ("finish_reason", "index", "logprobs", "stop_reason", "text", "token_ids")

    def __init__(self, text: str, token_ids: list[int], finish_reason: str | None) -> None:
        self.index, self.text, self.token_ids = 0, text, token_ids
        self.finish_reason, self.stop_reason, self.logprobs = finish_reason, None, None


class RequestOutput:
    __slots__ = ("finished", "outputs", "prompt", "prompt_token_ids", "request_id")

    def __init__(self, request_id: str, outputs: list[CompletionOutput], finished: bool) -> None:
        self.request_id, self.prompt, self.prompt_token_ids = request_id, None, [1]
        self.outputs, self.finished = outputs, finished


class AsyncStream:  # vllm/engine/async_llm_engine.py
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._queue: asyncio.Queue = asyncio.Queue()
        self._finished = False

    def put(self, item) -> None:
        if not self._finished:
            self._queue.put_nowait(item)

    def finish(self) -> None:
        self._queue.put_nowait(StopAsyncIteration())
        self._finished = True

    def __aiter__(self):
        return self

    async def __anext__(self):
        result = await self._queue.get()
        if isinstance(result, Exception):
            raise result
        return result


def merge_async_iterators(*iterators):  # vllm/utils.py at 0.5.3.post1
    queue: asyncio.Queue = asyncio.Queue()
    finished = [False] * len(iterators)

    async def producer(i, iterator):
        try:
            async for item in iterator:
                await queue.put((i, item))
        except Exception as e:  # noqa: BLE001 - as vLLM's: the consumer re-raises it
            await queue.put(e)
        finished[i] = True

    tasks = [asyncio.create_task(producer(i, it)) for i, it in enumerate(iterators)]

    async def consumer():
        try:
            while not all(finished) or not queue.empty():
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
        except (Exception, asyncio.CancelledError) as e:
            for task in tasks:
                task.cancel(e)
            raise
        await asyncio.gather(*tasks)

    return consumer()


def serve(port: int, expected: int) -> None:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_credentials=False,
                       allow_methods=["*"], allow_headers=["*"])  # fmt: skip
    streams: dict[str, AsyncStream] = {}
    wanted: dict[str, int] = {}
    stats = {"engine_s": 0.0, "cpu_start": 0.0, "cpu_end": 0.0, "outputs": 0, "steps": 0, "closed": 0}

    async def engine_loop() -> None:
        """Each step: every running request's output (built and timed: the engine's part), put
        into its stream; then the loop is free while the "GPU" runs."""
        stats["cpu_start"] = time.process_time()
        made = dict.fromkeys(streams, 0)
        ids = {rid: [] for rid in streams}
        while made:
            t0 = time.thread_time()
            outs = []
            for rid in list(made):
                made[rid] += 1
                ids[rid].append(7)
                last = made[rid] == wanted[rid]
                text = WORD * made[rid]
                outs.append(RequestOutput(rid, [CompletionOutput(text, ids[rid], "length" if last else None)], last))
                if last:
                    del made[rid]
            stats["engine_s"] += time.thread_time() - t0
            for out in outs:  # RequestTracker.process_request_output
                streams[out.request_id].put(out)
                if out.finished:
                    streams.pop(out.request_id).finish()
            stats["outputs"] += len(outs)
            stats["steps"] += 1
            await asyncio.sleep(0.02)  # the forward runs in an executor thread: the loop is free

    async def process_request(rid: str):  # AsyncLLMEngine._process_request
        async for request_output in streams[rid]:
            yield request_output

    @app.post("/v1/completions")
    async def create_completion(request: CompletionRequest, raw_request: Request):
        rid = f"cmpl-{len(wanted)}"
        streams[rid], wanted[rid] = AsyncStream(rid), request.max_tokens
        if len(wanted) == expected:
            asyncio.create_task(engine_loop())
        result_generator = merge_async_iterators(process_request(rid))
        created, model_name = int(time.time()), request.model

        async def completion_stream_generator():  # serving_completion.py, echo/logprobs/usage off
            previous_texts, previous_num_tokens = [""], [0]
            async for prompt_idx, res in result_generator:
                if await raw_request.is_disconnected():
                    raise StopAsyncIteration()
                for output in res.outputs:
                    i = output.index + prompt_idx
                    delta_text = output.text[len(previous_texts[i]) :]
                    previous_texts[i] = output.text
                    previous_num_tokens[i] = len(output.token_ids)
                    chunk = CompletionStreamResponse(
                        id=rid, created=created, model=model_name,
                        choices=[CompletionResponseStreamChoice(index=i, text=delta_text, logprobs=None,
                                                                finish_reason=output.finish_reason,
                                                                stop_reason=output.stop_reason)])  # fmt: skip
                    yield f"data: {chunk.model_dump_json(exclude_unset=False)}\n\n"
            yield "data: [DONE]\n\n"
            stats["closed"] += 1  # runs once [DONE] is sent (the response asks for more)
            if stats["closed"] == expected:
                stats["cpu_end"] = time.process_time()

        return StreamingResponse(content=completion_stream_generator(), media_type="text/event-stream")

    @app.get("/stats")
    async def get_stats():
        return JSONResponse({**stats, "cpu_now": time.process_time()})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")


async def one(url: str, outputs: int) -> int:
    """vLLM 0.5.3's ``async_request_openai_completions``: a session a request, chunks parsed."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)) as session:
        payload = {"model": "m", "prompt": "Hi", "temperature": 0.0, "best_of": 1, "max_tokens": outputs,
                   "stream": True}  # fmt: skip
        got = 0
        async with session.post(url=url, json=payload, headers={"Authorization": "Bearer none"}) as response:
            if response.status != 200:
                raise SystemExit(f"{response.status}: {await response.text()}")
            async for chunk_bytes in response.content:
                chunk_bytes = chunk_bytes.strip()
                if not chunk_bytes:
                    continue
                chunk = chunk_bytes.decode("utf-8").removeprefix("data: ")
                if chunk != "[DONE]" and json.loads(chunk)["choices"][0]["text"]:
                    got += 1
        return got


def measure(requests: int, outputs: int) -> dict[str, float]:
    """One burst against a fresh server: its CPU from the first step to the last chunk, less the
    engine's own, and the outputs streamed."""
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(requests)])
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{base}/stats", 300)

        async def burst() -> list[int]:
            return await asyncio.gather(*(one(f"{base}/v1/completions", outputs) for _ in range(requests)))

        got = asyncio.run(burst())
        time.sleep(0.2)
        with urllib.request.urlopen(f"{base}/stats") as r:
            s = json.load(r)
    finally:
        server.terminate()
        server.wait()
    if sum(got) != requests * outputs or not s["cpu_end"]:
        raise SystemExit(f"streamed {sum(got)} outputs of {requests * outputs}")
    server_s = s["cpu_end"] - s["cpu_start"] - s["engine_s"]
    return {"server_s": server_s, "engine_s": s["engine_s"], "outputs": s["outputs"], "steps": s["steps"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=128, help="concurrent streamed requests (default 128)")
    p.add_argument("--outputs", type=int, nargs="+", default=[32, 128], help="output tokens a request")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--serve", nargs=2, type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        serve(*a.serve)
        return
    parts = ("pydantic", "fastapi", "starlette", "uvicorn", "uvloop", "httptools", "aiohttp")
    print("parts: " + ", ".join(f"{m} {version(m)}" for m in parts) + f"; Python {sys.version.split()[0]}")
    print(f"{a.requests} concurrent streamed completions, every output its own chunk\n")
    print(
        "| run | outputs a request | server CPU s (engine's taken off) | engine's own s | ms CPU per output | load avg |"
    )
    print("|---|---|---|---|---|---|")
    per_len: dict[int, list[float]] = {n: [] for n in a.outputs}
    for run in range(1, a.runs + 1):
        for n in a.outputs:
            m = measure(a.requests, n)
            ms = m["server_s"] / m["outputs"] * 1e3
            per_len[n].append(m["server_s"])
            print(f"| {run} | {n} | {m['server_s']:.2f} | {m['engine_s']:.3f} | {ms:.4f} | {os.getloadavg()[0]:.2f} |")
    print()
    for run in range(a.runs):
        if len(a.outputs) < 2:
            break
        lo, hi = min(a.outputs), max(a.outputs)
        slope = (per_len[hi][run] - per_len[lo][run]) / ((hi - lo) * a.requests)
        rest = per_len[lo][run] / a.requests - slope * lo
        print(f"run {run + 1}: fit over {lo} and {hi} outputs: {slope * 1e3:.4f} ms CPU per streamed output, "
              f"{rest * 1e3:.3f} ms per request")  # fmt: skip
    allms = [s / (n * a.requests) * 1e3 for n, v in per_len.items() for s in v]
    print(f"\nms CPU per streamed output, every run and length: median {statistics.median(allms):.4f}, "
          f"min {min(allms):.4f}, max {max(allms):.4f}; load average now {os.getloadavg()[0]:.2f} (2 cores)")  # fmt: skip


if __name__ == "__main__":
    main()
