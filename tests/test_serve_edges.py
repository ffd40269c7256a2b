"""The server's edges a second hostile-client audit found: a megabyte prompt that froze every
stream while it was tokenized, headers of any size, strict types, a body without a
Content-Type, a non-ASCII API key, HEAD probes. Real uvicorn on loopback (the default BPE
tokenizer where it matters), the official ``openai`` client and raw sockets."""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time

import httpx
import openai
import pytest

from paged_bench.model.tokenizers import bpe_tokenizer
from paged_bench.serve import serve_in_thread
from paged_bench.serve.protocol import RequestError, ServingContext, parse_chat, parse_completion
from tests.test_serve_api import FAST

QUIET = ("server.port=0", "server.log_level=warning")
MODEL = "paged-bench-sim"


@pytest.fixture(scope="module")
def bpe():
    handle = serve_in_thread(*QUIET, *FAST)  # server.tokenizer=auto: the built-in BPE on the sim
    yield handle
    handle.stop()


def _raw(url: str, request: bytes, timeout: float = 10) -> bytes:
    """Send ``request`` on a fresh connection; everything the server answers until it closes
    the connection (or stops answering for a second)."""
    host, port = url.removeprefix("http://").split(":")
    out = b""
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        s.settimeout(1.0)
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out


# -- a long prompt costs only its own request ------------------------------------------------


def _context(max_token_bytes: int | None) -> tuple[ServingContext, list[str]]:
    seen: list[str] = []

    def encode(text: str) -> list[int]:
        seen.append(text)
        return [1] * len(text.encode())

    ctx = ServingContext("m", max_model_len=100, vocab_size=258, encode=encode,
                         render_chat=lambda msgs: encode("".join(m["content"] for m in msgs)),
                         max_token_bytes=max_token_bytes)  # fmt: skip
    return ctx, seen


def test_a_text_too_long_to_fit_is_refused_before_it_is_tokenized():
    ctx, seen = _context(max_token_bytes=4)  # 99 tokens of at most 4 bytes: 396 bytes at most
    for body, parse, param in (({"prompt": "é" * 199}, parse_completion, "prompt"),  # 398 bytes
                               ({"messages": [{"role": "user", "content": "x" * 393}]}, parse_chat, "messages"),  # 397 with its role
                               ({"messages": [{"role": "assistant", "content": "x" * 388}]}, parse_chat, "messages")):  # fmt: skip
        with pytest.raises(RequestError) as refused:
            parse(body, ctx)
        assert refused.value.param == param and "at least 100 tokens" in refused.value.message
    assert seen == []  # never tokenized
    with pytest.raises(RequestError, match="the prompt has 396 tokens"):  # fits the bound: tokenized, then refused
        parse_completion({"prompt": "x" * 396}, ctx)
    assert len(seen) == 1
    unbounded, seen = _context(max_token_bytes=None)  # a checkpoint's tokenizer: no bound
    with pytest.raises(RequestError, match="the prompt has 400 tokens"):
        parse_completion({"prompt": "x" * 400}, unbounded)
    assert len(seen) == 1


def test_the_bpe_tokenizer_lets_other_threads_run_while_it_works():
    """The server tokenizes bodies over 64 KiB in a worker thread; that only helps if the
    tokenizer lets go of the GIL (``tokenizers``' single-text ``encode`` holds it throughout:
    the event loop then stalled for as long as the encode took)."""
    tok = bpe_tokenizer()
    text = "the paged KV cache hands out blocks on demand; λ 数据 🙂 " * 30_000
    gaps, done = [], threading.Event()

    def work() -> None:
        tok.encode(text)
        done.set()

    worker = threading.Thread(target=work)
    start = last = time.perf_counter()
    worker.start()
    while not done.is_set():
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        time.sleep(0.001)
    took = time.perf_counter() - start
    worker.join()
    assert took > 0.05  # long enough to tell the two apart
    assert max(gaps) < took / 4, (max(gaps), took)  # holding the GIL, one gap is the whole encode


def test_a_megabyte_prompt_is_refused_without_holding_up_the_streams(bpe):
    """A 1.4 MB text prompt (far beyond max_model_len) is a 400 in milliseconds; a stream
    running meanwhile keeps its pace (before: 1.1-1.5 s without a token, per such request)."""
    client = openai.OpenAI(base_url=bpe.url + "/v1", api_key="x", max_retries=0, timeout=60)
    arrivals: list[float] = []

    def stream() -> None:
        for _ in client.completions.create(model=MODEL, prompt="hi", max_tokens=400, stream=True,
                                           extra_body={"ignore_eos": True}):  # fmt: skip
            arrivals.append(time.perf_counter())

    streamer = threading.Thread(target=stream)
    streamer.start()
    while len(arrivals) < 20:
        time.sleep(0.005)
    huge = "the kv cache hands out blocks " * 47_000  # 1.4 MB
    answers = [httpx.post(bpe.url + "/v1/completions", json={"prompt": huge, "max_tokens": 1}, timeout=30)
               for _ in range(3)]  # fmt: skip
    mark = time.perf_counter()
    streamer.join()
    for r in answers:
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert "bytes, so at least" in r.json()["error"]["message"]
    during = [b - a for a, b in itertools.pairwise(arrivals) if a < mark]
    assert len(arrivals) == 400 and max(during) < 0.5, max(during)  # a chunk per token


# -- the request's head ----------------------------------------------------------------------


def test_headers_past_max_header_bytes_are_431_and_the_connection_closes(bpe):
    big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"
    answer = _raw(bpe.url, big)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431")
    assert json.loads(body)["error"]["code"] == 431
    assert b"65536 bytes" in body
    fine = _raw(bpe.url, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Ok: " + b"a" * 8_000 + b"\r\nConnection: close\r\n\r\n")
    assert fine.startswith(b"HTTP/1.1 200")


def test_a_large_body_pipelined_before_the_next_request_is_not_counted_as_its_head(bpe):
    """Bytes of a body that share a read with the next request's head are no part of that head."""
    body = json.dumps({"prompt": "x" * 300_000, "max_tokens": 1}).encode()  # refused: too long for the model
    first = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: %d\r\n\r\n" % len(body)) + body  # fmt: skip
    second = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answer = _raw(bpe.url, first + second)
    assert answer.startswith(b"HTTP/1.1 400") and answer.count(b"HTTP/1.1 200") == 1, answer[:300]


def test_head_health_answers_200(bpe):
    assert httpx.head(bpe.url + "/health").status_code == 200


# -- the request's body --------------------------------------------------------------------


def test_a_json_body_without_content_type_is_read_as_json(bpe):
    r = httpx.post(bpe.url + "/v1/completions", content=b'{"prompt": "hi", "max_tokens": 2}')
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2


WRONG_TYPES = [
    ({"max_tokens": True}, "max_tokens", "(got true)"),
    ({"max_tokens": "4"}, "max_tokens", '(got "4")'),
    ({"n": True}, "n", "(got true)"),
    ({"stream": "yes"}, "stream", '(got "yes")'),
    ({"temperature": "0.5"}, "temperature", '(got "0.5")'),
    ({"temperature": -3}, "temperature", "(got -3)"),
    ({"prompt": [1, True]}, "prompt", "must be a string, a list of token ids"),
    ({"prompt": 5}, "prompt", "must be a string, a list of token ids, a list of strings or a list of lists"),
    ({"stop": 5}, "stop", "must be a string or a list of strings (got 5)"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "can only be set when stream is true"),
    # what vLLM's SamplingParams refuses (vllm/sampling_params.py _verify_args, _verify_greedy_sampling)
    ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
    ({"stop": ["", "xy"]}, "stop", "stop cannot contain an empty string"),
    ({"temperature": 0, "n": 2}, "n", "n must be 1 when using greedy sampling, got 2"),
]


@pytest.mark.parametrize(("extra", "param", "says"), WRONG_TYPES)
def test_wrong_types_are_400_naming_the_parameter_and_the_value(bpe, extra, param, says):
    r = httpx.post(bpe.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, **extra})
    error = r.json()["error"]
    assert (r.status_code, error["param"]) == (400, param), error
    assert says in error["message"], error["message"]


def test_a_text_part_without_text_names_what_is_missing(bpe):
    r = httpx.post(bpe.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": [{"type": "text"}]}]})
    assert r.status_code == 400
    assert r.json()["error"] == {"message": "a text content part needs its 'text'", "type": "invalid_request_error",
                                 "param": "messages.0.content.0.text", "code": 400}  # fmt: skip


# -- access -------------------------------------------------------------------------------


def test_a_non_ascii_api_key_works_as_clients_send_it(monkeypatch):
    monkeypatch.setenv("PAGED_BENCH_API_KEY", "sécret-✓")
    handle = serve_in_thread(*QUIET, *FAST, "server.tokenizer=byte")
    try:
        url, body = handle.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2}
        sent = {"Authorization": "Bearer sécret-✓".encode()}  # UTF-8, as curl and httpx send it
        assert httpx.post(url, json=body, headers=sent).status_code == 200
        for wrong in ("Bearer sécret-✓".encode()[:-1], "Bearer s\xe9cret-".encode("latin-1")):
            assert httpx.post(url, json=body, headers={"Authorization": wrong}).status_code == 401
    finally:
        handle.stop()


@pytest.mark.parametrize(("endpoint", "param", "value"), [
    ("completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("completions", "tool_choice", "auto"),
    ("completions", "function_call", "auto"),
    ("completions", "parallel_tool_calls", True),
    ("chat", "suffix", "x"),
])  # fmt: skip
def test_what_one_endpoint_refuses_the_other_refuses_too(bpe, endpoint, param, value):
    """Chat's tools sent to completions (and completions' suffix to chat) were ignored, 200."""
    body = {"max_tokens": 2, param: value}
    body |= {"prompt": "hi"} if endpoint == "completions" else {"messages": [{"role": "user", "content": "hi"}]}
    path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
    r = httpx.post(bpe.url + path, json=body)
    assert (r.status_code, r.json()["error"]["param"]) == (400, param), r.text
    assert f"{param} is not supported" in r.json()["error"]["message"]
