"""The load generator (``target=openai``) against our own server, loopback only: it agrees with
the in-process engine on the same workload, writes the same files, and counts failures
(refused connections, 400s, timeouts) without stopping the run."""

from __future__ import annotations

import csv
import json
import logging

import httpx
import pytest
import yaml

from paged_bench.errors import ConfigError
from paged_bench.loadgen.client import Endpoint
from paged_bench.loadgen.config import TargetConfig
from paged_bench.loadgen.prometheus import parse_ttft_totals
from paged_bench.loadgen.spawn import free_port
from paged_bench.model.tokenizers import ByteTokenizer, serving_tokenizer
from paged_bench.results.records import text_digest
from paged_bench.run.bench import build
from paged_bench.run.job import run_job
from paged_bench.serve import serve_in_thread
from tests.test_serve_api import FAST, all_free, metric, wait_for

WORKLOAD = ("workload=poisson", "workload.num_requests=12", "workload.rate=40", "workload.prompt_len.low=8",
            "workload.prompt_len.high=40", "workload.output_len.mean=16", "workload.output_len.max=40")  # fmt: skip


@pytest.fixture(scope="module")
def server():
    handle = serve_in_thread("server.port=0", "server.log_level=warning", "scheduler=continuous", *FAST)
    yield handle
    handle.stop()


def remote(server, *overrides: str) -> tuple[str, ...]:
    return ("target=openai", f"target.base_url={server.url}/v1", *overrides)


def rows(outcome) -> list[dict[str, str]]:
    with (outcome.run_dir / "requests.csv").open() as f:
        return list(csv.DictReader(f))


def test_served_and_in_process_agree_on_token_counts(server, config, tmp_path):
    served = run_job(config(*WORKLOAD, *FAST, *remote(server, "target.warmup=2")), tmp_path / "served")
    local = run_job(config(*WORKLOAD, *FAST, "clock=wall"), tmp_path / "local")
    assert served.status == local.status == "finished"
    s_rows, l_rows = rows(served), rows(local)
    assert [r["request_id"] for r in s_rows] == [r["request_id"] for r in l_rows]
    for s, l in zip(s_rows, l_rows):
        assert (s["prompt_tokens"], s["output_tokens"], s["finish_reason"]) == (l["prompt_tokens"], l["output_tokens"], "length")
    # token for token: the served text is the in-process tokens' text, in the server's tokenizer
    decode = serving_tokenizer("auto", ByteTokenizer(), build(config(*FAST)).backend.vocab_size).decode
    local_texts = [decode(r.output_token_ids) for r in local.result.requests]
    assert [s["text_digest"] for s in s_rows] == [text_digest(t) for t in local_texts]
    assert all(s["output_digest"] == "" for s in s_rows) and all(l["output_digest"] for l in l_rows)
    assert served.summary["total_output_tokens"] == local.summary["total_output_tokens"]
    assert served.summary["completed"] == 12 and served.summary["failed"] == 0
    # the same files; engine-only figures are null for a remote run
    assert sorted(p.name for p in served.files) == sorted(p.name for p in local.files)
    assert (tmp_path / "served" / "steps.csv").read_text().count("\n") == 1  # the header only
    summary = json.loads((tmp_path / "served" / "summary.json").read_text())
    assert summary["kv_live_slots_peak"] is None and summary["num_preemptions"] is None
    # nor does the client's config know the server's devices (it said num_gpus 4 for a client's TP4)
    assert summary["num_gpus"] is None and summary["output_throughput_per_gpu"] is None
    assert summary["median_ttft_ms"] > 0 and summary["median_itl_ms"] > 0
    # our server exports its own TTFT: what HTTP adds on top is measured
    assert summary["server_mean_ttft_ms"] > 0
    assert summary["http_ttft_overhead_ms"] is not None
    # labelled by what ran here: the server's scheduler, pool and model are its own (ours ran preemptive)
    assert served.choices == {"workload": "poisson", "target": "openai"}
    info = json.loads((tmp_path / "served" / "run_info.json").read_text())
    assert set(info["choices"]) == set(info["plugin_packages"]) | {"target"} == {"workload", "target"}
    wait_for(lambda: all_free(server))


def test_warmup_requests_are_sent_but_not_recorded(server, config, tmp_path):
    before = metric(server.url, 'paged_bench_request_finished_total{finish_reason="length"}')
    out = run_job(config(*WORKLOAD, *FAST, *remote(server, "target.warmup=3")), tmp_path)
    after = metric(server.url, 'paged_bench_request_finished_total{finish_reason="length"}')
    assert after - before == 12 + 3
    assert len(rows(out)) == 12 and out.summary["completed"] == 12


def test_concurrency_cap_bounds_requests_in_flight(server, config, tmp_path):
    def batches_above_2() -> float:
        total = metric(server.url, "paged_bench_step_batch_size_count")
        return total - metric(server.url, 'paged_bench_step_batch_size_bucket{le="2.0"}')

    before = batches_above_2()
    burst = ("workload.rate=1000",)  # all arrive at once: only the cap keeps the batch small
    out = run_job(config(*WORKLOAD, *burst, *FAST, *remote(server, "target.concurrency=2", "target.warmup=0")), tmp_path)
    assert out.summary["completed"] == 12
    assert batches_above_2() == before


def test_unreachable_endpoint_fails_every_request_but_writes_the_run(config, tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    out = run_job(config(*WORKLOAD, "target=openai", f"target.base_url={url}", "target.warmup=1"), tmp_path)
    assert out.status == "failed"
    assert out.error.startswith("all 12 requests failed") and "Cannot connect to host" in out.error
    assert out.summary["completed"] == 0 and out.summary["failed"] == 12
    assert all(r["finish_reason"] == "error" and "Cannot connect to host" in r["error"] for r in rows(out))


def test_rejected_requests_are_counted_with_their_error(config, tmp_path):
    # the server's context is shorter than some of the workload's prompts: those get HTTP 400
    handle = serve_in_thread("server.port=0", "server.log_level=warning", "max_model_len=48", *FAST)
    try:
        out = run_job(config(*WORKLOAD, "workload.prompt_len.high=80", *remote(handle, "target.warmup=0")), tmp_path)
    finally:
        handle.stop()
    by_reason = {}
    for r in rows(out):
        by_reason.setdefault(r["finish_reason"], []).append(r)
    assert out.status == "finished"  # some failed, the run did not
    assert by_reason["error"] and by_reason["length"]
    assert all(r["error"].startswith("HTTP 400: ") and "maximum context length is 48" in r["error"] for r in by_reason["error"])
    assert out.summary["failed"] == len(by_reason["error"])


def test_timeout_is_a_failed_request(config, tmp_path):
    handle = serve_in_thread("server.port=0", "server.log_level=warning", "backend.step_overhead_ms=50")
    try:
        long = ("workload.num_requests=2", "workload.output_len.min=200", "workload.output_len.max=200")
        out = run_job(config(*WORKLOAD, *long, *remote(handle, "target.timeout_s=0.3", "target.warmup=0")), tmp_path)
        wait_for(lambda: all_free(handle))  # the abandoned requests were aborted server-side
    finally:
        handle.stop()
    assert [r["error"] for r in rows(out)] == ["timed out after 0.3 s"] * 2


def test_chat_endpoint(server, config, tmp_path):
    out = run_job(config(*WORKLOAD, *FAST, *remote(server, "target.endpoint=chat", "target.warmup=0")), tmp_path)
    assert out.summary["completed"] == 12
    local = [int(r["output_tokens"]) for r in rows(out)]
    assert sum(local) == out.summary["total_output_tokens"] > 0
    # each chat's text reads back as its workload prompt's length, and the server's template
    # adds the same few tokens to every one (the random ids' decoded text was 15 tokens for 96)
    lengths = [r.num_prompt_tokens for r in build(config(*WORKLOAD, *FAST)).requests]
    added = {int(r["prompt_tokens"]) - n for r, n in zip(rows(out), lengths)}
    assert len(added) == 1 and 0 < added.pop() < 20


def test_a_traces_prompt_text_reaches_a_chat_as_that_text(server, config, tmp_path):
    # the byte ids the sim's workload made of a recorded prompt were decoded with the server's
    # BPE: the server got mojibake, not the prompt
    from paged_bench.serve.text import simple_chat_template

    texts = ["Hello there, how are you today?", "Paged attention hands out KV blocks."]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps({"timestamp": i * 0.05, "prompt": t, "output_len": 4})
                               for i, t in enumerate(texts)))  # fmt: skip
    out = run_job(config(*FAST, "workload=trace", f"workload.path={trace}",
                         *remote(server, "target.endpoint=chat", "target.warmup=0")), tmp_path / "run")  # fmt: skip
    speaks = serving_tokenizer("auto", ByteTokenizer(), build(config(*FAST)).backend.vocab_size)
    expected = [len(speaks.encode(simple_chat_template([{"role": "user", "content": t}]))) for t in texts]
    assert [int(r["prompt_tokens"]) for r in rows(out)] == expected


def test_a_text_traces_prompts_are_as_long_in_process_as_served(server, config, tmp_path):
    # in-process, the sim read a text as bytes (36 tokens for "Hello there, ..."), while our
    # server for the same config reads it with the BPE: the two runs served different prompts
    texts = ["Hello there, how are you today?", "Paged attention hands out KV blocks in pages."]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps({"timestamp": i * 0.05, "prompt": t, "output_len": 4})
                               for i, t in enumerate(texts)))  # fmt: skip
    local = run_job(config(*FAST, "workload=trace", f"workload.path={trace}"), tmp_path / "local")
    read = [httpx.post(f"{server.url}/v1/completions", json={"prompt": t, "max_tokens": 1}).json()["usage"]
            for t in texts]  # fmt: skip
    assert [int(r["prompt_tokens"]) for r in rows(local)] == [u["prompt_tokens"] for u in read]
    assert all(u["prompt_tokens"] < len(t) // 2 for u, t in zip(read, texts))  # words, not bytes


def test_spawned_server_runs_this_config(config, tmp_path, caplog):
    caplog.set_level(logging.INFO)  # as a Hydra job's logging is set
    out = run_job(config(*WORKLOAD, *FAST, "target=openai", "target.spawn=true", "target.warmup=1",
                         "+server.log_level=info", "+server.max_waiting=64"), tmp_path)  # fmt: skip
    assert out.status == "finished" and out.summary["completed"] == 12
    served = yaml.safe_load((tmp_path / "server" / "serve_config.yaml").read_text())["server"]
    assert served["max_waiting"] == 64 and served["host"] == "127.0.0.1"
    log = (tmp_path / "server" / "server.log").read_text()
    assert "server stopped" in log and "Traceback" not in log
    assert '"POST /v1/completions HTTP/1.1" 200' in log  # its log level was the job's (warning, always)
    assert not [r.getMessage() for r in caplog.records if r.name == "httpx"]  # not a line per /health probe


@pytest.mark.parametrize("key", ["host", "port"])
def test_a_spawned_servers_address_is_refused_not_dropped(config, tmp_path, key):
    # +server.port=8001 ran on a free port of the spawned server's choosing, without a word
    with pytest.raises(ConfigError, match=f"^server.{key}=.* is not allowed: left out with target=served, whose "
                                          "server listens on a free loopback port; to choose the"):  # fmt: skip
        run_job(config(*WORKLOAD, "target=served", f"+server.{key}=8001"), tmp_path)
    assert not (tmp_path / "server").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("target.endpoint=embeddings", "target.endpoint='embeddings' is not allowed: completions or chat"),
        ("target.base_url=localhost:8000", "target.base_url='localhost:8000' is not allowed"),
        ("target.concurrency=0", "target.concurrency=0 is not allowed: an integer >= 1"),
        ("+target.bogus=1", "target.bogus=1 is not allowed"),
    ],
)
def test_bad_target_settings_name_the_key(config, tmp_path, override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        run_job(config("target=openai", override), tmp_path)


def test_a_base_url_without_v1_is_refused_naming_the_one_that_answers(server, config, tmp_path):
    # vLLM's --base-url habit (the server's root): every request failed with a 404
    for named in ([], ["target.model=paged-bench-sim"]):  # named, it was not checked: every request a 404
        with pytest.raises(ConfigError, match=f"the API's root, where /models is: {server.url}/v1$"):
            run_job(config(*WORKLOAD, *FAST, "target=openai", f"target.base_url={server.url}", *named), tmp_path)
    assert not list(tmp_path.glob("**/summary.json"))


def test_parse_ttft_totals_sums_over_labels():
    text = """# HELP vllm:time_to_first_token_seconds ...
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.5
vllm:time_to_first_token_seconds_count{model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{model_name="n"} 0.25 1700000000
vllm:time_to_first_token_seconds_count{model_name="n"} 1.0
"""
    assert parse_ttft_totals(text) == (0.75, 5.0)
    assert parse_ttft_totals("other_metric 1.0") is None


def test_api_key_comes_from_the_environment_only(monkeypatch):
    target = TargetConfig.from_mapping({"name": "openai", "api_key_env": "MY_KEY"})
    monkeypatch.delenv("MY_KEY", raising=False)
    assert target.headers == {}
    monkeypatch.setenv("MY_KEY", "sk-test")
    assert target.headers == {"Authorization": "Bearer sk-test"}


def test_the_environments_proxy_is_found_once_a_run_and_no_proxy_is_honoured(monkeypatch):
    """httpx took HTTP_PROXY/NO_PROXY from the environment; the aiohttp session does not look them
    up (vLLM's trust_env=True does, on a worker thread for every request): ``Endpoint`` does, once."""
    for name in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    target = TargetConfig.from_mapping({"base_url": "http://10.1.2.3:8000/v1", "endpoint": "chat"})
    assert Endpoint.of(target).url == "http://10.1.2.3:8000/v1/chat/completions" and Endpoint.of(target).proxy is None
    monkeypatch.setenv("HTTP_PROXY", "http://user:pw@proxy.example:3128")
    to = Endpoint.of(target)
    assert str(to.proxy) == "http://proxy.example:3128" and (to.proxy_auth.login, to.proxy_auth.password) == ("user", "pw")
    monkeypatch.setenv("NO_PROXY", "10.1.2.3")
    assert Endpoint.of(target).proxy is None
