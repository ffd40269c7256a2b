"""The load generator against a server that misbehaves as real ones do, one way per request:
a malformed value, ``"error": null`` in every chunk, a usage count of 0, a stream aborted by
the server, an HTML error page, a redirect, no ``finish_reason``, an error event, ``\r\n`` line
ends, a last line with no line end, a stream cut short. Each request is recorded with what
happened to it, and the run goes on. A real uvicorn server on loopback."""

from __future__ import annotations

import csv
import json
import threading

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from paged_bench.model.tokenizers import HFTokenizer, text_token_count
from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job
from tests.test_serve_api import wait_for

# the server treats the i-th request it receives the i-th way of WAYS (below), one request each
HTML = "<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n<h1>502</h1>\n</body>\n</html>\n"


def _event(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def _stream(n: int, way: str) -> list[str]:
    """The events of one response of ``n`` tokens ("x" each), two tokens a chunk."""
    events, sent = [], 0
    while sent < n:
        k = min(2, n - sent)
        sent += k
        choice = {"index": 0, "text": "x" * k, "finish_reason": "length" if sent == n else None}
        if way == "text_is_a_number" and sent == k:
            choice["text"] = 5
        if way in ("no_reason", "no_reason_short", "no_final_newline"):  # [DONE] alone ends the last
            choice["finish_reason"] = None
        chunk = {"choices": [choice]}
        if way == "error_null":
            chunk["error"] = None
        events.append(_event(chunk))
        if way == "aborted" and sent >= 4:
            events[-1] = _event({"choices": [{"index": 0, "text": "x" * k, "finish_reason": "abort"}]})
            break
        if way in ("no_reason_short", "cut_short", "error_event") and sent >= 4:
            break
    if way == "cut_short":  # neither a finish reason nor [DONE]: the connection closed mid-stream
        return events
    if way == "error_event":  # vLLM's server reports an error mid-stream as an event of its own
        return [*events, _event({"error": {"message": "out of memory", "type": "InternalServerError", "code": 500}})]
    usage = {"prompt_tokens": 7, "completion_tokens": sent, "total_tokens": 7 + sent}
    if way == "prompt_tokens_text":
        usage["prompt_tokens"] = "n/a"
    if way == "completion_zero":
        usage["completion_tokens"] = 0
    events += [_event({"choices": [], "usage": usage}), _event("[DONE]")]
    if way == "crlf":
        events = [e.replace("\n", "\r\n") for e in events]
    if way == "no_final_newline":
        events[-1] = events[-1].rstrip("\n")
    return events


WAYS = ["well", "text_is_a_number", "prompt_tokens_text", "error_null", "completion_zero", "aborted", "html_502",
        "redirected", "no_reason", "no_reason_short", "error_event", "crlf", "no_final_newline", "cut_short"]  # fmt: skip
N = len(WAYS)
RECEIVED: list[str] = []


async def completions(request: Request) -> Response:
    way = WAYS[len(RECEIVED) % len(WAYS)]
    RECEIVED.append(way)
    body = await request.json()
    if way == "html_502":
        return Response(HTML, status_code=502, media_type="text/html")
    if way == "redirected":
        return RedirectResponse("/v1/completions_moved", status_code=307)
    return StreamingResponse(iter(_stream(int(body["max_tokens"]), way)), media_type="text/event-stream")


async def moved(request: Request) -> Response:
    body = await request.json()
    return StreamingResponse(iter(_stream(int(body["max_tokens"]), "well")), media_type="text/event-stream")


@pytest.fixture(scope="module")
def awkward():
    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/completions_moved", moved, methods=["POST"])])  # fmt: skip
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def rows(awkward, tmp_path_factory):
    RECEIVED.clear()
    # one at a time, well apart: the server meets the requests in the workload's order
    cfg = compose_config("workload=uniform", f"workload.num_requests={N}", "workload.rate=20", "workload.prompt_len=8",
                         "workload.output_len=10", "target=openai", f"target.base_url={awkward}", "target.warmup=0",
                         "target.concurrency=1", "target.model=fake", "tracking.enabled=false",
                         "backend.vocab_size=258")  # fmt: skip  (the awkward server speaks bytes)
    out = run_job(cfg, tmp_path_factory.mktemp("awkward"))
    assert RECEIVED == WAYS
    with (out.run_dir / "requests.csv").open() as f:
        return out, dict(zip(WAYS, csv.DictReader(f)))


def test_the_run_ends_and_writes_every_request(rows):
    out, _ = rows
    assert out.status == "finished" and out.summary["completed"] + out.summary["failed"] == N
    assert (out.run_dir / "requests.csv").is_file() and (out.run_dir / "summary.json").is_file()


def test_a_malformed_value_fails_its_request_alone(rows):
    _, by_way = rows
    for way, says in (("text_is_a_number", "a chunk's text is 5, not a string"),
                      ("prompt_tokens_text", "usage.prompt_tokens is 'n/a', not a token count")):  # fmt: skip
        assert by_way[way]["finish_reason"] == "error"
        assert by_way[way]["error"].startswith("malformed response") and says in by_way[way]["error"]
    assert by_way["well"]["finish_reason"] == "length" and by_way["well"]["output_tokens"] == "10"


def test_error_null_is_no_error_event(rows):
    assert rows[1]["error_null"]["finish_reason"] == "length" and not rows[1]["error_null"]["error"]


def test_a_completion_count_of_0_is_counted_from_the_text(rows):
    assert rows[1]["completion_zero"]["output_tokens"] == "10"  # "x" * 10 in the byte tokenizer


def test_a_stream_the_server_aborts_is_failed_not_length(rows):
    row = rows[1]["aborted"]
    assert row["finish_reason"] == "abort" and "finish_reason 'abort'" in row["error"]


def test_an_html_error_page_is_one_line(rows):
    error = rows[1]["html_502"]["error"]
    assert error.startswith("HTTP 502: <html> <head><title>502 Bad Gateway</title>") and "\n" not in error


def test_a_redirect_is_followed(rows):
    assert rows[1]["redirected"]["finish_reason"] == "length" and rows[1]["redirected"]["output_tokens"] == "10"


def test_an_error_event_or_a_stream_cut_short_fails_its_request(rows):
    _, by_way = rows
    assert by_way["error_event"]["finish_reason"] == "error" and by_way["error_event"]["error"] == "error event: out of memory"
    assert by_way["error_event"]["output_tokens"] == "4"  # what came before the error is kept
    assert by_way["cut_short"]["finish_reason"] == "error" and by_way["cut_short"]["error"] == "the stream ended before [DONE]"


def test_line_ends_of_either_kind_and_none_at_the_end_read_as_well(rows):
    _, by_way = rows
    for way in ("crlf", "no_final_newline"):
        assert by_way[way]["finish_reason"] == "length" and not by_way[way]["error"], way
        assert by_way[way]["output_tokens"] == "10" and by_way[way]["text_digest"] == by_way["well"]["text_digest"]


def test_no_finish_reason_is_length_only_when_every_token_came(rows):
    assert rows[1]["no_reason"]["finish_reason"] == "length"
    assert rows[1]["no_reason_short"]["finish_reason"] == "stop"


def test_output_tokens_are_counted_without_the_checkpoints_bos(tmp_path):
    """A Llama tokenizer adds <s> to what it encodes: vLLM's client counts a response's text
    with add_special_tokens=False, else every count is one too high."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["<unk>", "<s>", "</s>", "hello", "world"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    assert hf.encode("hello world") == [1, 3, 4]  # the BOS a prompt gets
    assert text_token_count(HFTokenizer(hf), "hello world") == 2
