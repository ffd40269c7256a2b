"""The server under faults: clients that go away, overload, a failing engine. Each must leave
the server up and the KV pool whole. Simulated backend, real time, loopback only."""

from __future__ import annotations

import asyncio
import threading

import httpx
import openai
import pytest

from paged_bench.serve import serve_in_thread
from tests.test_serve_api import MODEL, all_free, engine_of, metric, wait_for

# ~20 ms per step: slow enough to act mid-request, fast enough for a unit test
SLOW = ("backend.step_overhead_ms=20.0", "backend.per_prefill_token_ms=0.0", "backend.per_decode_seq_ms=0.0",
        "backend.per_kv_token_us=0.0", "server.port=0", "server.log_level=warning")  # fmt: skip


@pytest.fixture
def slow_server():
    handle = serve_in_thread(*SLOW, "server.max_waiting=2", "max_batch=1")
    yield handle
    handle.stop()


def finished(url: str, reason: str) -> float:
    try:
        return metric(url, f'paged_bench_request_finished_total{{finish_reason="{reason}"}}')
    except KeyError:
        return 0.0


def test_stream_disconnect_aborts_and_frees_blocks(slow_server):
    url = slow_server.url
    body = {"model": MODEL, "prompt": "x" * 100, "max_tokens": 400, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body) as resp:
        lines = resp.iter_lines()
        while not next(lines).startswith("data: "):
            pass  # the first token has come: the request holds blocks now
        assert metric(url, "paged_bench_kv_blocks_used") > 0
    # the client closed the connection mid-stream
    wait_for(lambda: finished(url, "abort") == 1)
    wait_for(lambda: metric(url, "paged_bench_kv_blocks_used") == 0)
    assert all_free(slow_server)
    assert metric(url, "paged_bench_num_requests_running") == 0


def test_non_streaming_disconnect_aborts(slow_server):
    url = slow_server.url
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 400}, timeout=0.3)
    wait_for(lambda: finished(url, "abort") == 1)
    wait_for(lambda: all_free(slow_server))


def test_too_many_waiting_is_429_with_retry_after(slow_server):
    url = slow_server.url

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            body = {"prompt": "hello", "max_tokens": 300, "stream": True}
            held = [await client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
                    for _ in range(3)]  # one running (max_batch=1), two waiting (the bound)
            assert [r.status_code for r in held] == [200] * 3
            wait_for(lambda: metric(url, "paged_bench_num_requests_waiting") == 2)
            over = await client.post("/v1/completions", json={"prompt": "one too many", "max_tokens": 1})
            for r in held:
                await r.aclose()
            return over

    over = asyncio.run(main())
    assert over.status_code == 429
    assert over.headers["retry-after"] == "1"
    assert over.json()["error"]["type"] == "rate_limit_error"
    wait_for(lambda: all_free(slow_server))
    # the server is still up and serves the next request
    assert httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_engine_error_ends_streams_with_an_error_and_server_stays_up():
    handle = serve_in_thread(*SLOW, "max_batch=4")
    try:
        backend = engine_of(handle).backend
        execute, calls = backend.execute, []

        def failing(plan):
            calls.append(plan.num_reqs)
            if len(calls) == 3:
                raise RuntimeError("device on fire")
            return execute(plan)

        backend.execute = failing
        client = openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0)
        stream = client.completions.create(model=MODEL, prompt="abc", max_tokens=20, stream=True)
        got = []
        with pytest.raises(openai.APIError, match="the engine failed a step") as raised:
            got.extend(stream)
        assert "device on fire" not in str(raised.value)  # exception text stays in the server's log
        assert len(got) == 2  # two steps streamed tokens, the third failed
        wait_for(lambda: all_free(handle))
        assert metric(handle.url, "paged_bench_engine_errors_total") == 1
        assert finished(handle.url, "error") == 1
        # the server goes on
        assert httpx.get(handle.url + "/health").status_code == 200
        r = client.completions.create(model=MODEL, prompt="abc", max_tokens=3)
        assert r.usage.completion_tokens == 3
    finally:
        handle.stop()


def test_engine_error_in_a_non_streaming_request_is_500():
    handle = serve_in_thread(*SLOW)
    try:
        backend = engine_of(handle).backend

        def broken(plan):
            raise ValueError("bad kernel")

        backend.execute = broken
        resp = httpx.post(handle.url + "/v1/completions", json={"prompt": "abc", "max_tokens": 3})
        assert resp.status_code == 500
        message = resp.json()["error"]["message"]
        assert "engine failed a step" in message and "bad kernel" not in message
        wait_for(lambda: all_free(handle))
    finally:
        handle.stop()


def test_shutdown_answers_a_request_still_running_with_503():
    """Past the grace period, a non-streaming request was answered 500 (a server error) where
    a server going away answers 503, OpenAI-shaped, with Retry-After."""
    handle = serve_in_thread(*SLOW, "server.graceful_shutdown_s=0.2")
    answers: list[httpx.Response] = []
    request = threading.Thread(
        target=lambda: answers.append(
            httpx.post(handle.url + "/v1/completions", json={"prompt": "x", "max_tokens": 400}, timeout=30)
        )
    )
    request.start()
    wait_for(lambda: metric(handle.url, "paged_bench_num_requests_running") == 1)
    handle.stop()
    request.join(30)
    (resp,) = answers
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"] == {"message": "the server is shutting down", "type": "server_error", "param": None,
                                    "code": 503}  # fmt: skip
    assert resp.headers["retry-after"] == "1"
