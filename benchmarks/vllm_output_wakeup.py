"""When a coroutine sees an output that another thread put into its ``asyncio.Queue``: the path
vLLM 0.6.0's outputs take to its API server (issue 35; paged_bench/run/output_timing.py,
``frontend.output_timing=vllm060``).

In vLLM 0.6.0 (tag v0.6.0) a step runs in an executor thread (``make_async``:
``loop.run_in_executor``, vllm/executor/gpu_executor.py ``execute_model_async``); its asynchronous
output callback, called inside the step (vllm/worker/model_runner.py ``execute_model``), ends in
``AsyncStream.put`` -> ``asyncio.Queue.put_nowait`` (vllm/engine/async_llm_engine.py) from that
thread, while the engine process's event loop (uvloop, vllm/entrypoints/openai/rpc/server.py
``run_rpc_server``) waits in its poller. ``put_nowait`` wakes the waiting ``get()`` with
``call_soon``, which, unlike ``call_soon_threadsafe``, does not wake a loop that is polling.
This rebuilds that shape (not vLLM's code): a coroutine awaits ``queue.get()``; a step in an
executor thread puts an item 10 ms in and returns 200 ms later (a step blocking on its GPU work),
optionally with a message reaching the loop in between (a new request: ``--wake-at``). Prints
when the item was put, when the thread returned, and when the coroutine got it, for asyncio's
loop and uvloop. Seen here: the coroutine gets it when the thread returns (or at the message),
never at the put.

    .venv/bin/python benchmarks/vllm_output_wakeup.py [--wake-at 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time

import uvloop


def step(queue: asyncio.Queue, t0: float, marks: dict[str, float]) -> None:
    """The engine step, in an executor thread: the callback's put, then the rest of the step."""
    time.sleep(0.010)  # the next step's scheduling, input preparation and launch
    marks["put"] = time.perf_counter() - t0
    queue.put_nowait("output")  # AsyncStream.put from the step's thread
    time.sleep(0.200)  # the step blocks until its GPU work is done
    marks["returned"] = time.perf_counter() - t0


async def main(wake_at: float | None) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    marks: dict[str, float] = {}
    t0 = time.perf_counter()

    async def consumer() -> None:  # the RPC server's generate(): await the stream, send on
        await queue.get()
        marks["got"] = time.perf_counter() - t0

    got = asyncio.create_task(consumer())
    await asyncio.sleep(0)
    if wake_at is not None:  # a request's message reaching the engine process: a pipe written from elsewhere
        rfd, wfd = os.pipe()
        loop.add_reader(rfd, os.read, rfd, 1)
        threading.Timer(wake_at, os.write, (wfd, b"x")).start()
    await loop.run_in_executor(None, step, queue, t0, marks)
    await got
    return {k: round(v * 1e3, 1) for k, v in marks.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wake-at", type=float, default=None, help="seconds: something wakes the loop then")
    args = parser.parse_args()
    for name, run in (("asyncio", asyncio.run), ("uvloop", uvloop.run)):
        print(f"{name:8s} ms: {run(main(args.wake_at))}")
