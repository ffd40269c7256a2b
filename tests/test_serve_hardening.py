"""The server under a hostile or careless client (issue 9): bad sampling values, huge or slow
bodies, thousands of stop strings, malformed input, a missing API key. Each must cost only the
request that brought it: an error, the other requests complete, ``/health`` answers within a
second, and the keep-alive connection serves the next request (what each refusal says:
``test_serve_refusals.py``). Real uvicorn on loopback, the official ``openai`` client and raw
sockets."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time

import httpx
import openai
import pytest

from paged_bench.serve import serve_in_thread
from tests.test_serve_api import FAST, all_free, metric, wait_for

QUIET = ("server.port=0", "server.log_level=warning")
SIM = (*QUIET, *FAST, "server.tokenizer=byte", "max_model_len=512")
MODEL = "paged-bench-sim"


@pytest.fixture(scope="module")
def sim():
    handle = serve_in_thread(*SIM, "server.body_timeout_s=1.0", "server.header_timeout_s=1.0")
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def tiny():
    handle = serve_in_thread(*QUIET, "backend=numpy", "backend.model=tiny", "max_batch=16", "max_model_len=2048")
    yield handle
    handle.stop()


class HealthWatch:
    """Polls /health in a thread; ``worst`` is the slowest answer seen (seconds)."""

    def __init__(self, url: str) -> None:
        self.url, self.worst, self.failures = url, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = client.get(self.url + "/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.worst = max(self.worst, time.perf_counter() - t0)
                self.failures += not ok
                time.sleep(0.02)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# -- 1. one bad request must not abort everyone's ------------------------------------------


def _streams(url: str, bad_bodies: list[dict], n_good: int = 8, max_tokens: int = 24) -> tuple[list, list]:
    async def good(client: openai.AsyncOpenAI, i: int) -> int:
        stream = await client.completions.create(model="paged-bench-numpy", prompt=f"request {i}",
                                                 max_tokens=max_tokens, stream=True, temperature=1.0,
                                                 extra_body={"ignore_eos": True})  # fmt: skip
        return sum([1 async for _ in stream])

    async def bad(http: httpx.AsyncClient, body: dict) -> httpx.Response:
        await asyncio.sleep(0.05)  # while the good ones run
        return await http.post("/v1/completions", json=body)

    async def main():
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60) as client, \
                httpx.AsyncClient(base_url=url, timeout=60) as http:  # fmt: skip
            goods = [good(client, i) for i in range(n_good)]
            bads = [bad(http, b) for b in bad_bodies]
            results = await asyncio.gather(*goods, *bads, return_exceptions=True)
        return results[:n_good], results[n_good:]

    return asyncio.run(main())


def test_negative_seed_and_tiny_temperature_leave_all_8_streams_complete(tiny):
    bad = [{"prompt": "x", "seed": -2, "temperature": 1.0, "max_tokens": 8, "ignore_eos": True},
           {"prompt": "y", "temperature": 1e-310, "max_tokens": 8, "ignore_eos": True}]  # fmt: skip
    goods, bads = _streams(tiny.url, bad)
    assert goods == [24] * 8  # every stream got every token
    # as vLLM: a negative seed is a seed (but -1, which is none), a temperature below 1e-5 is greedy
    assert [r.status_code for r in bads] == [200, 200]
    assert [r.json()["usage"]["completion_tokens"] for r in bads] == [8, 8]
    greedy = httpx.post(tiny.url + "/v1/completions", json={"prompt": "y", "temperature": 0, "max_tokens": 8,
                                                            "ignore_eos": True}).json()  # fmt: skip
    assert bads[1].json()["choices"][0]["text"] == greedy["choices"][0]["text"]
    again = httpx.post(tiny.url + "/v1/completions", json=bad[0]).json()
    assert again["choices"][0]["text"] == bads[0].json()["choices"][0]["text"]  # seed -2 is reproducible
    wait_for(lambda: all_free(tiny))


def test_a_failure_inside_one_requests_sampling_ends_only_that_request(tiny, monkeypatch):
    from paged_bench.model import sampling

    real = sampling.sample

    def flaky(logits, temperature, top_p, rng):
        if temperature == 0.77:  # this request's sampling blows up
            raise FloatingPointError("boom")
        return real(logits, temperature, top_p, rng)

    monkeypatch.setattr(sampling, "sample", flaky)
    errors_before = metric(tiny.url, "paged_bench_engine_errors_total")
    bad = [{"prompt": "z", "temperature": 0.77, "max_tokens": 8, "ignore_eos": True}]
    goods, bads = _streams(tiny.url, bad)
    assert goods == [24] * 8
    assert bads[0].status_code == 500
    error = bads[0].json()["error"]
    assert "sampling failed" in error["message"] and "boom" not in error["message"]
    assert metric(tiny.url, "paged_bench_engine_errors_total") == errors_before + 1
    wait_for(lambda: all_free(tiny))


# -- 2. what one request may cost ---------------------------------------------------------


def test_a_20mb_body_is_413_and_health_stays_fast(sim):
    body = json.dumps({"prompt": "x" * 20_000_000, "max_tokens": 1}).encode()
    with HealthWatch(sim.url) as watch:
        resp = httpx.post(sim.url + "/v1/completions", content=body, headers={"content-type": "application/json"},
                          timeout=30)  # fmt: skip

        def chunks():  # no Content-Length: refused once the bound is passed
            for _ in range(20):
                yield b"x" * 1_000_000

        chunked = httpx.post(sim.url + "/v1/completions", content=chunks(),
                             headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    for r in (resp, chunked):
        assert r.status_code == 413
        assert "at most 2097152" in r.json()["error"]["message"]
    assert watch.worst < 1.0 and watch.failures == 0


def test_2000_long_stop_strings_are_400_and_health_stays_fast(sim):
    body = {"prompt": "hi", "max_tokens": 50, "stop": ["s" * 600] * 2000}
    with HealthWatch(sim.url) as watch:
        resp = httpx.post(sim.url + "/v1/completions", json=body, timeout=30)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "2000 stop strings; at most 16"
    assert watch.worst < 1.0
    one_long = httpx.post(sim.url + "/v1/completions", json={"prompt": "hi", "stop": ["s" * 600]})
    assert one_long.json()["error"]["message"] == "a stop string of 600 characters; at most 256"


def test_slow_headers_and_slow_bodies_are_cut_off(sim):
    host, port = sim.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:  # headers that never end
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        assert s.recv(100) == b""  # closed by the server
        assert time.monotonic() - t0 < 4
    with socket.create_connection((host, int(port)), timeout=5) as s:  # a body that never ends
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\":")  # fmt: skip
        answer = s.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 408") and '"code":408' in answer


# -- 3. access ----------------------------------------------------------------------------


def test_api_key_gives_401_without_it_and_200_with_it(monkeypatch):
    monkeypatch.setenv("PAGED_BENCH_API_KEY", "from-env")
    for key, overrides in (("s3cret", ("server.api_key=s3cret",)), ("from-env", ())):
        handle = serve_in_thread(*SIM, *overrides)
        try:
            url = handle.url
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=headers)
                assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            assert httpx.get(url + "/v1/models").status_code == 401
            assert httpx.get(url + "/health").status_code == 200  # probes stay open, as in vLLM
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
            client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
            assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2).usage.completion_tokens == 2
        finally:
            handle.stop()


def test_binding_beyond_loopback_without_a_key_warns(caplog):
    from paged_bench.run.compose import compose_config
    from paged_bench.serve.server import build_app

    with caplog.at_level(logging.WARNING, logger="paged_bench.serve"):
        build_app(compose_config("server.host=0.0.0.0", "server.tokenizer=byte", config_name="serve"))
    assert "without an API key" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="paged_bench.serve"):
        build_app(compose_config("server.host=0.0.0.0", "server.api_key=k", "server.tokenizer=byte",
                                 config_name="serve"))  # fmt: skip
    assert "without an API key" not in caplog.text


def test_a_body_without_content_length_is_parsed_off_the_event_loop(sim, monkeypatch):
    """A chunked body states no size, so it was tokenized on the event loop, whatever its size."""
    import anyio.to_thread

    from paged_bench.serve import api

    calls = []
    real = anyio.to_thread.run_sync

    async def recording(fn, *args, **kw):
        if fn is api.errors.parse_completion:
            calls.append(fn)
        return await real(fn, *args, **kw)

    monkeypatch.setattr(api.anyio.to_thread, "run_sync", recording)
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    r = httpx.post(sim.url + "/v1/completions", content=iter([body[:5], body[5:]]),
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 200 and "Content-Length" not in r.request.headers
    assert calls, "a chunked body was parsed on the event loop"
    calls.clear()
    assert httpx.post(sim.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
    assert not calls  # a small body with its size stays on the loop: no thread hop


def test_a_long_prompt_is_prefilled_in_chunks_of_the_long_prefill_threshold():
    """The server inherited the benchmark's 8192-token budget: a 4,000-token prompt was one
    step, and every other stream waited for it whole (18 s on the numpy model); vLLM's server
    budget of 2048 still made 2-6 s steps. A sequence now takes at most
    ``scheduler.long_prefill_token_threshold`` (256 in conf/serve.yaml) prompt tokens a step."""
    handle = serve_in_thread(*QUIET, *FAST, "server.tokenizer=byte", "max_model_len=4096")
    try:
        before = metric(handle.url, "paged_bench_step_batch_size_count")
        r = httpx.post(handle.url + "/v1/completions", json={"prompt": [7] * 3000, "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert metric(handle.url, "paged_bench_step_batch_size_count") - before == 12  # 11 x 256 + 184 tokens
    finally:
        handle.stop()


def test_a_prompts_logprobs_are_formatted_off_the_event_loop(tiny, monkeypatch):
    """echo + logprobs returns every prompt token's entries (a 260 KB request came back as
    20 MB): formatting and rendering them on the event loop stalled every stream 1.8 s."""
    from paged_bench.serve import api

    offloaded = []
    real = api.anyio.to_thread.run_sync

    async def recording(fn, *args, **kw):
        offloaded.append(getattr(fn, "__name__", repr(fn)))
        return await real(fn, *args, **kw)

    monkeypatch.setattr(api.anyio.to_thread, "run_sync", recording)
    body = {"prompt": [[5, 6, 7, 8]] * 2, "max_tokens": 1, "echo": True, "logprobs": 2}
    r = httpx.post(tiny.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"][0]["logprobs"]["tokens"]) == 5
    assert offloaded.count("choice_logprobs") == 2 and "JSONResponse" in offloaded, offloaded
