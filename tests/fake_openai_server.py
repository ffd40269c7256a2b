"""A fake OpenAI-compatible streaming server with known timing, run as a subprocess by the
load-generator tests (``python -m tests.fake_openai_server PORT``).

``/v1/completions`` streams ``max_tokens`` tokens (one "x" each) in chunks of ``TOKENS_PER_CHUNK``:
the first chunk ``FIRST_S`` after the request, the next ones ``GAP_S`` apart, then the usage chunk
(``choices: []``) ``USAGE_S`` later and ``[DONE]`` ``DONE_S`` after that. The request received
``NO_USAGE_AT`` (counting from 0, warm-up included) gets no usage chunk; the one received
``FAIL_AT`` waits ``FAIL_S`` and answers HTTP 500. ``/log`` returns when each request was
received, when each content chunk was written and when the response ended, on
``time.perf_counter()`` (CLOCK_MONOTONIC: the same clock as the client's, across processes).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

TOKENS_PER_CHUNK = 3
FIRST_S, GAP_S, USAGE_S, DONE_S = 0.03, 0.05, 0.02, 0.2
NO_USAGE_AT, FAIL_AT, FAIL_S = 3, 4, 0.3

LOG: list[dict] = []


def _event(payload: dict | str) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


async def completions(request: Request):
    entry = {"index": len(LOG), "received": time.perf_counter(), "writes": [], "end": None}
    LOG.append(entry)
    body = await request.json()
    if entry["index"] == FAIL_AT:
        await asyncio.sleep(FAIL_S)
        entry["end"] = time.perf_counter()
        return JSONResponse({"error": {"message": "injected failure"}}, status_code=500)
    n = int(body["max_tokens"])
    prompt_tokens = len(body["prompt"])

    async def stream():
        await asyncio.sleep(FIRST_S)
        sent = 0
        while sent < n:
            k = min(TOKENS_PER_CHUNK, n - sent)
            sent += k
            reason = "length" if sent == n else None
            entry["writes"].append(time.perf_counter())
            yield _event({"choices": [{"index": 0, "text": "x" * k, "finish_reason": reason}]})
            if sent < n:
                await asyncio.sleep(GAP_S)
        await asyncio.sleep(USAGE_S)
        if entry["index"] != NO_USAGE_AT:
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
            yield _event({"choices": [], "usage": usage})
        await asyncio.sleep(DONE_S)
        entry["end"] = time.perf_counter()
        yield _event("[DONE]")

    return StreamingResponse(stream(), media_type="text/event-stream")


async def models(request: Request):
    return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})


async def log(request: Request):
    return JSONResponse(LOG)


app = Starlette(routes=[
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/models", models),
    Route("/log", log),
])  # fmt: skip

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
