"""``python -m paged_bench.serve`` as a user runs it: starts, answers, shuts down cleanly on
Ctrl-C (SIGINT) and on SIGTERM (what a process manager sends) with exit code 0, and reports a
bad setting in one line. Loopback only."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from paged_bench.loadgen.spawn import free_port


def run_serve(*overrides: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as run_dir:  # keeps the checkout's runs/ clean
        return subprocess.run([sys.executable, "-m", "paged_bench.serve", *overrides, f"hydra.run.dir={run_dir}"],
                              capture_output=True, text=True, timeout=60, check=False)


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


def test_unknown_option_is_one_line():
    r = run_serve("scheduler=nonexistent")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "scheduler=nonexistent is not allowed" in lines[0] and "preemptive" in lines[0]
