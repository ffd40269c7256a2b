"""The OpenAI-compatible server, driven with the official ``openai`` client and with raw HTTP,
on the simulated backend paced in real time (no model needed). Loopback only."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest

from paged_bench.serve import serve_in_thread

# a fast cost model: ~1 ms per step
FAST = ("backend.step_overhead_ms=1.0", "backend.per_prefill_token_ms=0.002", "backend.per_decode_seq_ms=0.01",
        "backend.per_kv_token_us=0.0")  # fmt: skip
MODEL = "paged-bench-sim"


def metric(url: str, name: str) -> float:
    """One sample of the server's /metrics (labels included in ``name`` when it has them)."""
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


class MetricSampler:
    """Reads one /metrics sample every ``period`` seconds in a thread while in the ``with``
    block; ``values`` holds what it saw."""

    def __init__(self, url: str, name: str, period: float = 0.01) -> None:
        self.url, self.name, self.period, self.values = url, name, period, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.values.append(metric(self.url, self.name))
            time.sleep(self.period)

    def __enter__(self) -> MetricSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def engine_of(handle):
    return handle.app.state.server.loop.engine


def all_free(handle) -> bool:
    alloc = engine_of(handle).allocator
    return alloc.num_free_blocks == alloc.layout.num_blocks and not alloc.leaks()


@pytest.fixture(scope="module")
def server():
    handle = serve_in_thread("server.port=0", "server.log_level=warning", "max_batch=32", "server.tokenizer=byte",
                             "max_model_len=512", *FAST)
    yield handle
    handle.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


# -- the openai client -------------------------------------------------------------------


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200


def test_models_retrieve_answers_the_served_model_and_404_for_another(client):
    """``client.models.retrieve`` (GET /v1/models/{id}) was a 404 'no such route'."""
    model = client.models.retrieve(MODEL)
    assert (model.id, model.object, model.owned_by, model.max_model_len) == (MODEL, "model", "paged_bench", 512)
    assert model == client.models.list().data[0]
    for other in ("gpt-4", "org/model"):  # a name with a slash reaches the route too
        with pytest.raises(openai.NotFoundError) as raised:
            client.models.retrieve(other)
        assert raised.value.body == {"message": f"The model `{other}` does not exist; this server serves '{MODEL}'",
                                     "type": "NotFoundError", "param": "model", "code": 404}  # fmt: skip


def test_health_is_json_as_its_schema_says_and_405_allows_get_and_head(server):
    """/health answered an empty body with no content type where /openapi.json says JSON (vLLM
    answers an empty 200); OPTIONS /health's 405 said ``Allow: HEAD``, leaving GET out."""
    r = httpx.get(server.url + "/health")
    assert (r.status_code, r.headers["content-type"], r.json()) == (200, "application/json", {"status": "ok"})
    head = httpx.head(server.url + "/health")
    assert (head.status_code, head.content, head.headers["content-type"]) == (200, b"", "application/json")
    for method in ("OPTIONS", "DELETE"):
        r = httpx.request(method, server.url + "/health")
        assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD")
        assert r.json()["error"]["code"] == 405
    assert httpx.request("OPTIONS", server.url + "/v1/completions").headers["allow"] == "POST"


def test_completion_non_streaming(client):
    r = client.completions.create(model=MODEL, prompt="hello there", max_tokens=7)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(b"hello there")  # the byte tokenizer
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == 7 + len(b"hello there")
    assert r.choices[0].text == "\x00" * 7  # the simulator samples token 0


def test_completion_streaming_one_chunk_per_token(client):
    chunks = list(client.completions.create(model=MODEL, prompt=[1, 2, 3, 4], max_tokens=5, stream=True))
    assert len(chunks) == 5
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 4 + ["length"]
    assert all(c.usage is None for c in chunks)  # usage not asked for: no usage chunk


def test_chat_non_streaming(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 4
    # the simple template: <|user|>\nhi\n<|assistant|>\n
    assert r.usage.prompt_tokens == len(b"<|user|>\nhi\n<|assistant|>\n")


def test_chat_streaming_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=6, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content, usage = chunks[:-1], chunks[-1]
    assert len(content) == 6
    assert content[0].choices[0].delta.role == "assistant"  # the role comes with the first token
    assert all(c.choices[0].delta.role is None for c in content[1:])
    assert content[-1].choices[0].finish_reason == "length"
    assert usage.choices == [] and usage.usage.completion_tokens == 6


def test_chat_stream_helper(client):
    # the helper insists on object == "chat.completion.chunk" and choices[].index
    # (its final completion refuses finish_reason "length", so a stop string ends this one)
    messages = [{"role": "user", "content": "hi"}]
    with client.chat.completions.stream(model=MODEL, messages=messages, max_tokens=9, stop="\x00" * 4) as s:
        events = [e.type for e in s]
        final = s.get_final_completion()
    assert events.count("chunk") == 4  # one per token
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == ""  # held back as a possible stop string, then cut


def test_stop_string_ends_the_request(client, server):
    r = client.completions.create(model=MODEL, prompt="x", max_tokens=50, stop=["\x00\x00\x00"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == ""  # the text stops before the stop string
    assert r.usage.completion_tokens == 3
    wait_for(lambda: all_free(server))


def test_bad_requests_raise_bad_request_error(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):  # 404, as OpenAI and vLLM
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=0)


# -- raw HTTP: the shapes benchmark clients send --------------------------------------------


def sse_events(resp: httpx.Response) -> list:
    events = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_benchmark_client_chat_shape(server):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "max_completion_tokens": 5, "ignore_eos": True, "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "some_unknown_knob": {"nested": 1},  # ignored
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 5]  # continuous usage
    assert all(c["object"] == "chat.completion.chunk" and c["choices"][0]["index"] == 0 for c in chunks)
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["prompt_tokens"] == len(b"<|user|>\nab\n<|assistant|>\n")  # text parts joined


def test_benchmark_client_completion_token_ids(server):
    body = {"model": MODEL, "prompt": list(range(100, 140)), "max_tokens": 8, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as resp:
        events = sse_events(resp)
    assert len(events) == 8 + 2
    assert events[-2]["usage"] == {"prompt_tokens": 40, "completion_tokens": 8, "total_tokens": 48}


@pytest.mark.parametrize(
    ("path", "body", "expect"),
    [
        ("/v1/completions", b"{not json", "not valid JSON"),
        ("/v1/completions", b"[1, 2]", "JSON object"),
        ("/v1/completions", json.dumps({"max_tokens": 3}).encode(), "prompt is required"),
        ("/v1/chat/completions", json.dumps({"max_tokens": 3}).encode(), "messages is required"),
        ("/v1/chat/completions", json.dumps({"messages": []}).encode(), "messages"),
        ("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": -1}).encode(), "max_tokens must be at least 1"),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}],
                                             "max_completion_tokens": 0}).encode(), "max_completion_tokens"),
        ("/v1/completions", json.dumps({"prompt": "x" * 512, "max_tokens": 1}).encode(), "maximum context length is 512"),
        ("/v1/completions", json.dumps({"prompt": [1, -5]}).encode(), "out of range"),
        ("/v1/completions", json.dumps({"prompt": "", "max_tokens": 1}).encode(), "empty"),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(),
         "only text content parts"),
    ],
)
def test_bad_input_is_400_with_openai_error(server, path, body, expect):
    resp = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert expect in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400


def test_64_concurrent_streams_complete_and_free_every_block(server):
    lengths = [5 + (i * 7) % 60 for i in range(64)]

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, int, str]:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"request {i}"}], max_tokens=lengths[i], stream=True,
            stream_options={"include_usage": True},
        )
        chunks, usage, reason = 0, None, None
        async for c in stream:
            if c.choices:
                chunks += 1
                reason = c.choices[0].finish_reason or reason
            if c.usage:
                usage = c.usage.completion_tokens
        return chunks, usage, reason

    async def main():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        async with client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    with MetricSampler(server.url, "paged_bench_num_requests_running") as running:
        results = asyncio.run(main())
    peak = running.values
    assert [(c, u) for c, u, _ in results] == [(n, n) for n in lengths]
    assert {r for _, _, r in results} == {"length"}
    assert max(peak) > 1  # requests ran together (continuous batching, seen in /metrics)
    wait_for(lambda: all_free(server))
    assert metric(server.url, "paged_bench_kv_blocks_used") == 0
    assert metric(server.url, "paged_bench_num_requests_waiting") == 0


def test_metrics_expose_engine_state_and_histograms(server, client):
    client.completions.create(model=MODEL, prompt="abc", max_tokens=4)
    text = httpx.get(server.url + "/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_blocks_used", "kv_blocks_free",
                 "num_preemptions_total", "prefix_cache_hits_total", "time_to_first_token_seconds_bucket",
                 "inter_token_latency_seconds_count", "e2e_request_latency_seconds_sum"):
        assert f"paged_bench_{name}" in text
    assert metric(server.url, "paged_bench_time_to_first_token_seconds_count") >= 1
    assert metric(server.url, "paged_bench_kv_blocks_free") == engine_of(server).allocator.layout.num_blocks


def test_engine_keeps_bounded_step_records(server):
    engine = engine_of(server)
    assert engine.steps.max_records is not None and len(engine.steps) <= engine.steps.max_records


def test_bounded_step_records_keep_the_latest_and_count_all():
    from paged_bench.core.engine import Engine
    from tests.test_schedulers import make_engine, reqs

    base = make_engine()
    engine = Engine(base.scheduler, base.backend, base.clock, max_step_records=3)
    result = engine.run(reqs([(0.0, 8, 10), (0.0, 8, 5)]))
    assert engine.num_steps == 10 and len(result.steps) == 3
    assert [row.step for row in result.steps] == [7, 8, 9]  # step numbers go on counting
    assert result.leaks == []
