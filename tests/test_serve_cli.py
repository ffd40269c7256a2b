"""``python -m paged_bench.serve`` as a user runs it: starts, answers, shuts down cleanly on
Ctrl-C (SIGINT) and on SIGTERM (what a process manager sends) with exit code 0, and reports a
bad setting in one line. Loopback only."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from paged_bench.loadgen.spawn import free_port
from tests.tracking_support import call_cli


def run_serve(*overrides: str):
    """The command refused before it serves: run in-process, as a fresh process would run it."""
    with tempfile.TemporaryDirectory() as run_dir:  # keeps the checkout's runs/ clean
        return call_cli(Path(run_dir), *overrides, f"hydra.run.dir={run_dir}", module="paged_bench.serve")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_and_sigterm_shut_down_cleanly_even_mid_stream(tmp_path, sig):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "paged_bench.serve", f"server.port={port}", "server.graceful_shutdown_s=1",
         "backend.step_overhead_ms=20", f"hydra.run.dir={tmp_path}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.1)
        body = {"prompt": "hi", "max_tokens": 500, "stream": True}  # ~10 s: still running at Ctrl-C
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            proc.send_signal(sig)
            rest = [line for line in lines if line]  # after the grace period: an error event, not a cut
        assert len(rest) < 500
        assert "shutting down" in rest[-2] and rest[-1] == "data: [DONE]"
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "server stopped" in out
    assert "Traceback" not in out


def test_bad_server_setting_is_one_line():
    r = run_serve("server.port=70000")
    assert r.returncode == 2
    assert r.stderr.strip() == "error: server.port=70000 is not allowed: a port 0-65535 (0 = any free one)"


def test_a_port_in_use_or_a_foreign_host_is_one_line_before_the_engine_is_built():
    """As vLLM's setup_server: the socket is bound first, so no model (a checkpoint may take
    minutes) is built for a port that cannot be had; before, uvicorn logged the error after
    start-up, once the command had printed that it was serving."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_serve(f"server.port={port}")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"error: server.port={port} is not allowed: a port this process may listen on at "
                                "127.0.0.1 (Address already in use; 0 takes any free port)")  # fmt: skip
    assert "serving" not in r.stdout
    r = run_serve("server.host=host.invalid")  # a reserved name that never resolves (RFC 2606)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: server.host='host.invalid' is not allowed: a name or address of this machine (")


def test_port_zero_announces_the_port_it_took(tmp_path):
    # max_model_len=128: a note about the seed workload's requests it would cap was printed, by
    # a server that never runs a workload (it built one too)
    proc = subprocess.Popen([sys.executable, "-m", "paged_bench.serve", "server.port=0", "max_model_len=128",
                             f"hydra.run.dir={tmp_path}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
        url = line.split(" on ", 1)[1].split("/v1", 1)[0]
        assert not url.endswith(":0"), line
        assert httpx.get(url + "/health", timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert "note:" not in err and "requests" not in err, err


def test_unknown_option_is_one_line():
    r = run_serve("scheduler=nonexistent")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "scheduler=nonexistent is not allowed" in lines[0] and "preemptive" in lines[0]


def test_a_cluster_setting_is_refused_not_ignored():
    """The cluster and router groups come with the server's config; it serves one engine, and
    started one without a word when asked for four replicas."""
    r = run_serve("cluster.replicas=4", "router=least_kv")
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: cluster='4 replicas' is not allowed: one replica: the server runs one engine "
                                "(a cluster is simulated by python -m paged_bench)")  # fmt: skip
