"""The load generator's CPU per request: our client against a scripted streaming server, beside
an aiohttp client that reads the stream as ``vllm bench serve`` does.

A scripted server (this file with ``--serve PORT``, a bare asyncio HTTP/1.1 server in a process
of its own) answers every ``/v1/completions`` request with ``--tokens`` chunks of one token each,
``--gap-ms`` apart, then a usage chunk and ``[DONE]``, as a streaming OpenAI-compatible server
does. Two clients send it the same requests, ``--concurrency`` at a time:

- ours: ``python -m paged_bench target=openai`` in this process (``run_job``: the requests sent,
  streamed and recorded, their figures computed and ``requests.csv`` written, tracking off);
- aiohttp: one ``aiohttp.ClientSession`` streaming each request and stamping every chunk with a
  choice, the way vLLM's ``async_request_openai_completions`` does
  (``vllm/benchmarks/lib/endpoint_request_func.py``), and nothing else (no figures, no files).

Each client's CPU time (``time.process_time``: every thread of this process, not the server's) is
taken for ``--requests`` requests and for a fifth of them; the difference over the requests between
is the CPU one more request costs, start-up and fixed costs left out. The rate one core could drive
is its inverse. The two clients take turns ``--rounds`` times; the medians are printed. Run from
the repository root:

    .venv/bin/python benchmarks/client_cpu.py                    # 1,000 requests of 64 tokens, 8 at a time
    .venv/bin/python benchmarks/client_cpu.py --tokens 256 --gap-ms 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from paged_bench.loadgen.spawn import free_port
from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job

PROMPT_LEN = 128


# --- the scripted server ---------------------------------------------------------------------


def _event(payload: dict | str) -> bytes:
    data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(data), data)  # one HTTP chunk per SSE event


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tokens: int, gap: float) -> None:
    """Serve one keep-alive connection: every POST streams ``tokens`` one-token chunks."""
    try:
        while head := await reader.readuntil(b"\r\n\r\n"):
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
            await reader.readexactly(int(headers.get("content-length", 0)))
            if lines[0].startswith("GET /v1/models"):
                body = json.dumps({"object": "list", "data": [{"id": "scripted", "object": "model"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))  # fmt: skip
                continue
            if not lines[0].startswith("POST"):
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                continue
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for i in range(tokens):
                reason = "length" if i == tokens - 1 else None
                writer.write(_event({"id": "c", "object": "text_completion", "model": "scripted",
                                     "choices": [{"index": 0, "text": "x", "finish_reason": reason}]}))  # fmt: skip
                await writer.drain()
                await asyncio.sleep(gap)
            usage = {"prompt_tokens": PROMPT_LEN, "completion_tokens": tokens, "total_tokens": PROMPT_LEN + tokens}
            writer.write(_event({"id": "c", "object": "text_completion", "choices": [], "usage": usage}))
            writer.write(_event("[DONE]") + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def serve(port: int, tokens: int, gap: float) -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: _answer(r, w, tokens, gap), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# --- the clients -----------------------------------------------------------------------------


def ours(url: str, n: int, tokens: int, concurrency: int) -> float:
    """CPU seconds of one paged_bench run of ``n`` requests against ``url``."""
    cfg = compose_config("workload=uniform", f"workload.num_requests={n}", "workload.rate=inf",
                         f"workload.max_concurrency={concurrency}", f"workload.prompt_len={PROMPT_LEN}",
                         f"workload.output_len={tokens}", "target=openai", f"target.base_url={url}/v1",
                         "target.warmup=0", "tracking.enabled=false")  # fmt: skip
    with tempfile.TemporaryDirectory() as run_dir:
        start = time.process_time()
        outcome = run_job(cfg, Path(run_dir))
        cpu = time.process_time() - start
    assert outcome.summary["completed"] == n, outcome.summary["completed"]
    return cpu


async def _aiohttp_run(url: str, n: int, tokens: int, concurrency: int) -> int:
    import aiohttp  # mlflow's dependency, not ours: the reference client only

    body = {"model": "scripted", "prompt": [1] * PROMPT_LEN, "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    connector = aiohttp.TCPConnector(limit=concurrency)
    sem = asyncio.Semaphore(concurrency)
    ok = 0

    async def one() -> None:
        nonlocal ok
        async with sem:
            start = time.perf_counter()
            stamps, text, buffer, output_tokens = [], [], "", 0
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                async for raw in resp.content.iter_any():
                    buffer += raw.decode()
                    while "\n\n" in buffer:
                        message, buffer = buffer.split("\n\n", 1)
                        data = message.strip().removeprefix("data: ")
                        if not data or data == "[DONE]":
                            continue
                        chunk = json.loads(data)
                        if choices := chunk.get("choices"):
                            stamps.append(time.perf_counter() - start)
                            text.append(choices[0].get("text") or "")
                        elif usage := chunk.get("usage"):
                            output_tokens = usage["completion_tokens"]
            ok += bool(stamps) and output_tokens == tokens

    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one() for _ in range(n)))
    return ok


def vllm_like(url: str, n: int, tokens: int, concurrency: int) -> float:
    """CPU seconds of ``n`` requests streamed by the aiohttp client."""
    start = time.process_time()
    ok = asyncio.run(_aiohttp_run(url, n, tokens, concurrency))
    cpu = time.process_time() - start
    assert ok == n, ok
    return cpu


def per_request(run: Callable[[int], float], n: int) -> float:
    """CPU seconds one more request costs: (cpu(n) - cpu(n / 5)) / (n - n / 5)."""
    small = max(1, n // 5)
    return (run(n) - run(small)) / (n - small)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request, one per chunk")
    p.add_argument("--gap-ms", type=float, default=2.0, help="the server's pause between chunks")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.tokens, args.gap_ms / 1e3)
        return
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--tokens", str(args.tokens),
                               "--gap-ms", str(args.gap_ms)])  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/v1/models", timeout=1.0)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    sys.exit("the scripted server did not start")
                time.sleep(0.1)
        kw = {"url": url, "tokens": args.tokens, "concurrency": args.concurrency}
        clients = {"paged_bench (httpx)": ours, "aiohttp, as vllm bench serve": vllm_like}
        results: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(args.rounds):
            for name, client in clients.items():
                results[name].append(per_request(lambda n, client=client: client(n=n, **kw), args.requests))
    finally:
        server.terminate()
        server.wait(10)
    print(f"{args.requests} requests of {args.tokens} one-token chunks ({args.gap_ms:g} ms apart), "
          f"{args.concurrency} at a time; CPU per request, median of {args.rounds} rounds:")  # fmt: skip
    for name, values in results.items():
        ms = statistics.median(values) * 1e3
        print(f"  {name:30s} {ms:6.2f} ms/request  ({1e3 / ms:,.0f} requests/s on one core)"
              f"  [{', '.join(f'{v * 1e3:.2f}' for v in values)}]")  # fmt: skip
    ours_ms, theirs_ms = (statistics.median(values) for values in results.values())
    print(f"  paged_bench / aiohttp: {ours_ms / theirs_ms:.2f}")


if __name__ == "__main__":
    main()
