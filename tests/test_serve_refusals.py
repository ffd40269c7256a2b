"""What the server refuses, and how it says so: every error is OpenAI-shaped (``{"error":
{"message", "type", "param", "code"}}``), names the parameter and shows the value short, and
leaves the keep-alive connection serving the next request; vLLM's defaults and explicit nulls
are accepted, features it would act on that this server lacks are refused by name. Real
uvicorn on loopback, the official ``openai`` client and raw ``http.client`` connections."""

from __future__ import annotations

import gzip
import http.client
import json

import httpx
import openai
import pytest

from paged_bench.serve import serve_in_thread
from tests.test_serve_hardening import MODEL, SIM


@pytest.fixture(scope="module")
def sim():
    handle = serve_in_thread(*SIM)
    yield handle
    handle.stop()


def _exchange(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None,
              content_type: str = "application/json", **more_headers: str) -> tuple[int, dict]:  # fmt: skip
    headers = {"Content-Type": content_type, **more_headers} if body is not None else {}
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    assert resp.getheader("content-type", "").startswith("application/json"), data
    return resp.status, json.loads(data)


BAD = [
    ("GET", "/no/such/route", None, "application/json", 404, "no such route"),
    ("DELETE", "/v1/completions", None, "application/json", 405, "method not allowed"),
    ("POST", "/v1/completions", b'{"prompt": "a\\ud800b"}', "application/json", 400, "not valid Unicode"),
    ("POST", "/v1/completions", b"[" * 100_000 + b"]" * 100_000, "application/json", 400, "nests arrays or objects too"),
    ("POST", "/v1/completions", b'{"prompt": "hi\xff"}', "application/json", 400,
     "not valid UTF-8: byte 0xff at offset 14"),
    ("POST", "/v1/completions", b'{"prompt": "hi"}', "text/plain", 400, "Content-Type must be application/json"),
    ("POST", "/tokenize", b"hi", "text/plain", 404, "no such route"),  # was 400 for its Content-Type
    ("POST", "/v1/completions", b'{"prompt": "hi", "temperature": NaN}', "application/json", 400, "finite"),
    ("POST", "/v1/completions", b'{"prompt": "hi", "model": "gpt-4"}', "application/json", 404, "`gpt-4` does not exist"),
    ("POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": 600}', "application/json", 400,
     "'max_tokens' is too large: 600. This model's maximum context length is 512 tokens and your request has 2 input"),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 511}',
     "application/json", 400, "'max_completion_tokens' is too large"),
]  # fmt: skip


def test_every_error_is_openai_shaped_and_the_connection_is_reused(sim, monkeypatch):
    host, port = sim.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    good = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    assert _exchange(conn, "POST", "/v1/completions", good)[0] == 200
    sock = conn.sock
    for method, path, body, ctype, status, expect in BAD:
        code, payload = _exchange(conn, method, path, body, ctype)
        error = payload["error"]
        assert (code, error["code"]) == (status, status), (path, body and body[:40], payload)
        assert expect in error["message"] and set(error) == {"message", "type", "param", "code"}
        assert _exchange(conn, "POST", "/v1/completions", good)[0] == 200  # the next request works...
        assert conn.sock is sock  # ...on the same connection
    # an unexpected exception: a 500 with a reference, not Python's text, and the connection lives on
    server = sim.app.state.server

    def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(server, "submit", broken)
    code, payload = _exchange(conn, "POST", "/v1/completions", good)
    assert code == 500 and "internal server error (ref " in payload["error"]["message"]
    assert "secret" not in json.dumps(payload)
    monkeypatch.undo()
    assert _exchange(conn, "POST", "/v1/completions", good)[0] == 200 and conn.sock is sock
    conn.close()


def test_a_compressed_body_is_415_naming_its_encoding_and_the_connection_is_reused(sim):
    host, port = sim.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    good = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    code, payload = _exchange(conn, "POST", "/v1/completions", gzip.compress(good), **{"Content-Encoding": "gzip"})
    assert code == 415 and "Content-Encoding 'gzip' is not supported" in payload["error"]["message"]
    sock = conn.sock
    assert _exchange(conn, "POST", "/v1/completions", good, **{"Content-Encoding": "identity"})[0] == 200
    assert conn.sock is sock
    conn.close()


def test_explicit_nulls_mean_defaults(sim):
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
    body = {"temperature": None, "top_p": None, "n": None, "stream": None, "seed": None, "stop": None,
            "max_tokens": 3, "logprobs": None, "echo": None}  # fmt: skip
    r = httpx.post(sim.url + "/v1/completions", json={"prompt": "hi", **body})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                          temperature=None, top_p=None, n=None, stream=None)  # fmt: skip
    assert chat.usage.completion_tokens == 2


@pytest.mark.parametrize(("param", "value"), [
    ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("response_format", {"type": "json_object"}),
    ("logit_bias", {"5": 10}),
    ("presence_penalty", 0.5),
    ("frequency_penalty", 0.5),
    ("tool_choice", "required"),
    # vLLM's extras that change what is generated or returned (they were accepted, and ignored)
    ("min_tokens", 4),
    ("include_stop_str_in_output", True),
    ("skip_special_tokens", False),
    ("guided_json", {"type": "object"}),
    ("continue_final_message", True),
    ("add_generation_prompt", False),
    ("chat_template_kwargs", {"enable_thinking": False}),
    # vLLM acts on these or refuses them: a salt ignored would share the cache it asked to keep apart
    ("cache_salt", "tenant-a"),
    ("priority", 5),
    ("logits_processors", ["x"]),
    ("echo", True),  # chat's: vLLM opens the reply with the last message
])  # fmt: skip
def test_unsupported_features_are_refused_by_name(sim, param, value):
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=f"{param} is not supported") as raised:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       extra_body={param: value})  # fmt: skip
    assert raised.value.body["param"] == param


def test_what_vllm_does_by_default_is_accepted(sim):
    extras = {"skip_special_tokens": True, "add_generation_prompt": True, "min_tokens": 0, "stop_token_ids": [],
              "include_stop_str_in_output": False}  # fmt: skip
    r = httpx.post(sim.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                           "max_tokens": 2, **extras})  # fmt: skip
    assert r.status_code == 200, r.text


def test_logprobs_on_a_backend_without_logits_are_refused(sim):
    r = httpx.post(sim.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "logprobs": 1})
    assert r.status_code == 400 and "computes no logits" in r.json()["error"]["message"]


def test_a_refused_value_is_shown_short_and_as_json(sim):
    """A 1 MB logit_bias came back whole in the error, in Python's repr."""
    bias = {str(i): 1.0 for i in range(20000)}
    r = httpx.post(sim.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "logit_bias": bias})
    assert r.status_code == 400 and len(r.content) < 500, r.text[:200]
    assert r.json()["error"]["message"] == "logit_bias is not supported by this server (got an object)"
    r = httpx.post(sim.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "model": "m" * 100_000})
    assert r.status_code == 404 and len(r.content) < 500


def test_an_empty_model_name_is_the_served_model_as_vllm(sim):
    r = httpx.post(sim.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "model": ""})
    assert r.status_code == 200, r.text


def test_a_chat_too_long_names_messages_and_a_megabyte_role_is_no_role(sim):
    r = httpx.post(sim.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "a" * 5000}]})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "messages")
    assert "bytes, so at least" in r.json()["error"]["message"]
    # a role is written into the prompt too: a megabyte of it is refused before tokenizing, short
    r = httpx.post(sim.url + "/v1/chat/completions", json={"messages": [{"role": "u" * 600_000, "content": "hi"}]})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "messages.0.role")
    assert len(r.content) < 500


# -- the schema says what the server refuses ------------------------------------------------

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
REFUSED = [  # (endpoint, body): each 400 from the server, and outside its /openapi.json
    ("completions", {"prompt": ""}),
    ("completions", {"prompt": []}),
    ("completions", {"prompt": [[]]}),
    ("completions", {"prompt": ["hi", ""]}),
    ("completions", {"prompt": [1, -5]}),
    ("completions", {"prompt": [1, 10**6]}),  # past the vocabulary
    ("completions", {"prompt": ["a"] * 65}),  # server.max_prompts
    ("completions", {"prompt": "hi", "max_tokens": 0}),
    ("completions", {"prompt": "hi", "max_tokens": 512}),  # the context is 512: a prompt leaves less
    ("completions", {"prompt": "hi", "stop": ""}),
    ("completions", {"prompt": "hi", "stop": ["x"] * 17}),
    ("completions", {"prompt": "hi", "stop_token_ids": [-1]}),
    ("completions", {"prompt": "hi", "n": 129}),
    ("completions", {"prompt": "hi", "allowed_token_ids": [1, 2]}),
    ("completions", {"prompt": "hi", "allowed_token_ids": []}),
    ("completions", {"prompt": "hi", "min_tokens": 2}),
    ("completions", {"prompt": "hi", "response_format": {"type": "json_object"}}),
    ("completions", {"prompt": "hi", "top_k": 5}),
    ("chat", {**CHAT, "max_tokens": 0}),
    ("chat", {**CHAT, "max_completion_tokens": 0}),
    ("chat", {**CHAT, "echo": True}),
    ("chat", {**CHAT, "messages": [{"role": "robot", "content": "hi"}]}),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text"}]}]}),
]  # fmt: skip
ACCEPTED = [
    ("completions", {"prompt": "hi", "max_tokens": 0, "echo": True}),
    ("completions", {"prompt": [[1, 2], [3]], "max_tokens": 1, "min_tokens": 0, "top_k": -1, "allowed_token_ids": None}),
    ("chat", {**CHAT, "messages": [{"role": r, "content": "hi"} for r in ("developer", "system", "user")]}),
    ("chat", {**CHAT, "skip_special_tokens": True, "response_format": {"type": "text"}, "echo": False}),
]  # fmt: skip


def _body_schema(spec: dict, endpoint: str):
    jsonschema = pytest.importorskip("jsonschema")
    name = "CompletionRequest" if endpoint == "completions" else "ChatRequest"
    # the component at the root, beside the components its $refs ("#/components/...") name
    return jsonschema.Draft202012Validator({**spec["components"]["schemas"][name], "components": spec["components"]})


def test_the_openapi_schema_refuses_what_the_server_refuses(sim):
    """The schema took an empty prompt, max_tokens 0, allowed_token_ids, min_tokens ... that
    the server refuses: a client generated from it (or a fuzzer) was told they were fine."""
    spec = httpx.get(sim.url + "/openapi.json").json()
    schemas = {endpoint: _body_schema(spec, endpoint) for endpoint in ("completions", "chat")}
    with httpx.Client(base_url=sim.url + "/v1") as client:
        for endpoint, body in REFUSED:
            r = client.post(endpoint.replace("chat", "chat/completions"), json=body)
            assert r.status_code == 400, (body, r.text)
            assert not schemas[endpoint].is_valid(body), body
        for endpoint, body in ACCEPTED:
            r = client.post(endpoint.replace("chat", "chat/completions"), json=body)
            assert r.status_code == 200, (body, r.text)
            schemas[endpoint].validate(body)


def test_the_openapi_schema_lists_no_422_and_the_errors_it_answers(sim):
    spec = httpx.get(sim.url + "/openapi.json").json()
    assert "422" not in json.dumps(spec["paths"]) and "HTTPValidationError" not in spec["components"]["schemas"]
    post = spec["paths"]["/v1/completions"]["post"]
    assert {"400", "401", "404", "408", "413", "415", "429", "500", "503"} <= set(post["responses"])
    health = spec["paths"]["/health"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert health["$ref"].endswith("/HealthStatus")


def test_a_chat_role_is_one_openai_takes(sim):
    """Any role was taken, and written into the prompt as it came."""
    r = httpx.post(sim.url + "/v1/chat/completions", json={**CHAT, "messages": [{"role": "robot", "content": "hi"}]})
    error = r.json()["error"]
    assert (r.status_code, error["param"], error["type"]) == (400, "messages.0.role", "invalid_request_error")
    assert "'system', 'user', 'assistant', 'tool', 'developer' or 'function'" in error["message"]
    assert '(got "robot")' in error["message"]
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
    for role in ("system", "user", "assistant", "tool", "developer", "function"):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": role, "content": "hi"}], max_tokens=1)
        assert r.usage.completion_tokens == 1
