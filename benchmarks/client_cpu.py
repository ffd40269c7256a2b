"""The load generator's weight: our client's CPU per request against a scripted streaming server,
and the highest request rate one process drives against an instant one, each beside an aiohttp
client that sends and reads as ``vllm bench serve`` does.

A scripted server (this file with ``--serve PORT``, a bare asyncio HTTP/1.1 server on uvloop in a
process of its own) answers every ``/v1/completions`` request with ``--tokens`` chunks of one token
each, ``--gap-ms`` apart, then a usage chunk and ``[DONE]``, as a streaming OpenAI-compatible server
does (with ``--gap-ms 0`` it is instant: the whole response in one write). Two clients send it the
same requests:

- ours: ``python -m paged_bench target=openai`` in this process (``run_job``: the requests sent,
  streamed and recorded, their figures computed and ``requests.csv`` written, tracking off);
- vLLM's: one ``aiohttp.ClientSession`` set up as ``benchmark()`` in ``vllm/benchmarks/serve.py``
  sets it up (vLLM 009e6d4a: ``TCPConnector(limit=max_concurrency or 0, ...)``, ``trust_env=True``),
  on the default asyncio loop (``asyncio.run``, as ``vllm bench serve``'s ``main``), each request
  streamed and every chunk with a choice stamped as ``async_request_openai_completions`` does
  (``vllm/benchmarks/lib/endpoint_request_func.py`` at 02cfb534: ``iter_any``, the text cut at
  blank lines, ``json.loads``), and nothing else (no figures, no files). ``--no-trust-env`` drops
  ``trust_env`` (its proxy and ``~/.netrc`` look-ups on a worker thread, per request).

CPU per request (the default): each client's CPU time (``time.process_time``: every thread of this
process, not the server's) is taken for ``--requests`` requests, ``--concurrency`` at a time, and
for a fifth of them; the difference over the requests between is the CPU one more request costs,
start-up and fixed costs left out. The two clients take turns ``--rounds`` times; the medians are
printed.

Highest rate (``--max-rate``): against an instant server, each client sends ``--window-s`` seconds
of requests open-loop on vLLM's schedule (evenly spaced, the first one gap in, the last at N/rate;
no concurrency cap) at rates rising by a quarter from ``--start-rate``; it keeps up with a rate when
the rate it achieves (completed requests / duration, vLLM's ``request_throughput``) is at least 95%
of the rate offered, and stops after two rates in a row it missed. The highest rate each kept up
with, median of ``--rounds``, is printed. Wall-clock: on a
shared machine it moves with the load; the two clients take turns at every rate.
Run from the repository root:

    .venv/bin/python benchmarks/client_cpu.py                    # 1,000 requests of 64 tokens, 8 at a time
    .venv/bin/python benchmarks/client_cpu.py --tokens 1 --gap-ms 0
    .venv/bin/python benchmarks/client_cpu.py --max-rate         # instant server, 64 tokens a request
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import httpx
import uvloop

from paged_bench.loadgen.spawn import free_port
from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job

PROMPT_LEN = 128
KEEPS_UP = 0.95  # achieved / offered at or above which a client keeps up
MAX_RATE_CAP = 100_000.0  # the search stops here


# --- the scripted server ---------------------------------------------------------------------


def _event(payload: dict | str) -> bytes:
    data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(data), data)  # one HTTP chunk per SSE event


def _events(tokens: int) -> list[bytes]:
    """A response's body, event by event (the same for every request)."""
    def token(reason: str | None) -> bytes:
        return _event({"id": "c", "object": "text_completion", "model": "scripted",
                       "choices": [{"index": 0, "text": "x", "finish_reason": reason}]})  # fmt: skip

    usage = {"prompt_tokens": PROMPT_LEN, "completion_tokens": tokens, "total_tokens": PROMPT_LEN + tokens}
    tail = _event({"id": "c", "object": "text_completion", "choices": [], "usage": usage}) + _event("[DONE]")
    return [token(None)] * (tokens - 1) + [token("length"), tail + b"0\r\n\r\n"]


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, events: list[bytes], gap: float) -> None:
    """Serve one keep-alive connection: every POST streams ``events``, ``gap`` apart (at once if 0)."""
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
            if not gap:
                writer.write(b"".join(events))
            else:
                for event in events[:-1]:
                    writer.write(event)
                    await writer.drain()
                    await asyncio.sleep(gap)
                writer.write(events[-1])
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def serve(port: int, tokens: int, gap: float) -> None:
    events = _events(tokens)

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: _answer(r, w, events, gap), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


@contextmanager
def scripted_server(tokens: int, gap_ms: float) -> Iterator[str]:
    """The scripted server in a process of its own; yields its URL."""
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--tokens", str(tokens),
                               "--gap-ms", str(gap_ms)])  # fmt: skip
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
        yield url
    finally:
        server.terminate()
        server.wait(10)


# --- the clients -----------------------------------------------------------------------------


def _ours(url: str, n: int, tokens: int, concurrency: int | None, rate: float) -> tuple[float, dict]:
    """CPU seconds and the summary of one paged_bench run of ``n`` requests against ``url``."""
    cfg = compose_config("workload=uniform", f"workload.num_requests={n}", f"workload.rate={rate}",
                         f"workload.max_concurrency={concurrency or 'null'}", f"workload.prompt_len={PROMPT_LEN}",
                         f"workload.output_len={tokens}", "target=openai", f"target.base_url={url}/v1",
                         "target.warmup=0", "tracking.enabled=false")  # fmt: skip
    with tempfile.TemporaryDirectory() as run_dir:
        start = time.process_time()
        outcome = run_job(cfg, Path(run_dir))
        cpu = time.process_time() - start
    assert outcome.summary["completed"] == n, outcome.summary["completed"]
    return cpu, outcome.summary


def ours(url: str, n: int, tokens: int, concurrency: int, trust_env: bool) -> float:
    """CPU seconds of ``n`` requests, ``concurrency`` at a time (``trust_env`` is for vLLM's
    client: ours looks the environment's proxy up once a run whatever it says)."""
    return _ours(url, n, tokens, concurrency, math.inf)[0]


def ours_rate(url: str, n: int, tokens: int, rate: float, trust_env: bool) -> float:
    """The request rate ours achieved sending ``n`` requests at ``rate``."""
    return _ours(url, n, tokens, None, rate)[1]["request_throughput"]


async def _vllm_run(url: str, n: int, tokens: int, concurrency: int | None, rate: float, trust_env: bool) -> tuple[int, float]:
    """(requests that streamed every token, seconds from the start until all returned)."""
    body = {"model": "scripted", "prompt": [1] * PROMPT_LEN, "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    connector = aiohttp.TCPConnector(limit=concurrency or 0, limit_per_host=concurrency or 0, ttl_dns_cache=300,
                                     use_dns_cache=True, keepalive_timeout=60, force_close=False)  # fmt: skip
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    ok = 0

    async def stream() -> None:
        nonlocal ok
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

    async def one() -> None:
        if sem is None:
            return await stream()
        async with sem:
            await stream()

    timeout = aiohttp.ClientTimeout(total=6 * 60 * 60)
    async with aiohttp.ClientSession(connector=connector, trust_env=trust_env, timeout=timeout) as session:
        start, tasks = time.perf_counter(), []
        for i in range(n):  # vLLM's get_request: the i-th sent (i + 1) / rate in, evenly (burstiness inf)
            if (wait := start + (i + 1) / rate - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        return ok, time.perf_counter() - start


def vllm_like(url: str, n: int, tokens: int, concurrency: int, trust_env: bool) -> float:
    """CPU seconds of ``n`` requests streamed by vLLM's client."""
    start = time.process_time()
    ok, _ = asyncio.run(_vllm_run(url, n, tokens, concurrency, math.inf, trust_env))
    cpu = time.process_time() - start
    assert ok == n, ok
    return cpu


def vllm_rate(url: str, n: int, tokens: int, rate: float, trust_env: bool) -> float:
    ok, duration = asyncio.run(_vllm_run(url, n, tokens, None, rate, trust_env))
    return ok / duration


CLIENTS = {"paged_bench": (ours, ours_rate), "vllm bench serve's client": (vllm_like, vllm_rate)}


# --- the measurements ------------------------------------------------------------------------


def per_request(run: Callable[[int], float], n: int) -> float:
    """CPU seconds one more request costs: (cpu(n) - cpu(n / 5)) / (n - n / 5)."""
    small = max(1, n // 5)
    return (run(n) - run(small)) / (n - small)


def cpu_per_request(args: argparse.Namespace) -> None:
    with scripted_server(args.tokens, args.gap_ms) as url:
        kw = {"url": url, "tokens": args.tokens, "concurrency": args.concurrency, "trust_env": args.trust_env}
        results: dict[str, list[float]] = {name: [] for name in CLIENTS}
        for _ in range(args.rounds):
            for name, (client, _) in CLIENTS.items():
                results[name].append(per_request(lambda n, client=client: client(n=n, **kw), args.requests))
    print(f"{args.requests} requests of {args.tokens} one-token chunks ({args.gap_ms:g} ms apart), "
          f"{args.concurrency} at a time; CPU per request, median of {args.rounds} rounds:")  # fmt: skip
    for name, values in results.items():
        ms = statistics.median(values) * 1e3
        print(f"  {name:26s} {ms:6.2f} ms/request  ({1e3 / ms:,.0f} requests/s on one core)"
              f"  [{', '.join(f'{v * 1e3:.2f}' for v in values)}]")  # fmt: skip
    ours_ms, theirs_ms = (statistics.median(values) for values in results.values())
    print(f"  paged_bench / vLLM's: {ours_ms / theirs_ms:.2f}")


def max_rate(args: argparse.Namespace) -> None:
    """Rates rising by a quarter; a client stops after two rates in a row it could not keep up
    with (one can be another process's burst on a shared machine)."""
    best: dict[str, list[float]] = {name: [] for name in CLIENTS}
    with scripted_server(args.tokens, 0.0) as url:
        for _ in range(args.rounds):
            kept = dict.fromkeys(CLIENTS, 0.0)
            misses = dict.fromkeys(CLIENTS, 0)
            rate = args.start_rate
            while min(misses.values()) < 2 and rate <= MAX_RATE_CAP:
                n = max(50, round(rate * args.window_s))
                for name in (name for name in CLIENTS if misses[name] < 2):
                    achieved = CLIENTS[name][1](url, n, args.tokens, rate, args.trust_env)
                    print(f"  {name:26s} offered {rate:8,.0f}/s  achieved {achieved:8,.0f}/s", flush=True)
                    if achieved >= KEEPS_UP * rate:
                        kept[name], misses[name] = rate, 0
                    else:
                        misses[name] += 1
                rate *= 1.25
            for name, value in kept.items():
                best[name].append(value)
    print(f"open loop against an instant server ({args.tokens} tokens a request), requests sent for "
          f"{args.window_s:g} s at each rate; the highest rate kept up with (achieved >= {KEEPS_UP:.0%} of "
          f"offered), median of {args.rounds} rounds:")  # fmt: skip
    for name, values in best.items():
        print(f"  {name:26s} {statistics.median(values):8,.0f} requests/s  [{', '.join(f'{v:,.0f}' for v in values)}]")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request, one per chunk")
    p.add_argument("--gap-ms", type=float, default=2.0, help="the server's pause between chunks")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-rate", action="store_true", help="find the highest rate each client keeps up with")
    p.add_argument("--start-rate", type=float, default=50.0, help="--max-rate: the first rate tried (requests/s)")
    p.add_argument("--window-s", type=float, default=2.0, help="--max-rate: seconds of requests at each rate")
    p.add_argument("--no-trust-env", dest="trust_env", action="store_false",
                   help="vLLM's client without trust_env (no per-request proxy and netrc look-ups)")
    p.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.tokens, args.gap_ms / 1e3)
    elif args.max_rate:
        max_rate(args)
    else:
        cpu_per_request(args)


if __name__ == "__main__":
    main()
