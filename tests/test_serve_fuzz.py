"""An API fuzzer over the server's own ``/openapi.json`` (issue 9, item 7): Schemathesis
generates request bodies from the declared schemas (valid ones, edge cases of every field,
and invalid ones) and sends them over real HTTP to a real uvicorn server. No answer may be a
5xx, and generated requests must reach the engine (the schema describes the API well enough
to produce valid requests). Bounded to ~700 cases (~10-30 s on two shared cores)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from paged_bench.serve import serve_in_thread
from tests.test_serve_api import metric

pytest.importorskip("schemathesis")


@pytest.mark.slow
def test_fuzzing_the_openapi_spec_finds_no_5xx_and_reaches_the_engine(tmp_path):
    handle = serve_in_thread("server.port=0", "server.log_level=warning", "max_model_len=128",
                             "backend.step_overhead_ms=0.2", "backend.per_prefill_token_ms=0.0",
                             "backend.per_decode_seq_ms=0.0", "backend.per_kv_token_us=0.0")  # fmt: skip
    try:
        cli = shutil.which("schemathesis") or str(Path(sys.executable).with_name("schemathesis"))
        run = subprocess.run(
            [cli, "run", handle.url + "/openapi.json", "--checks", "not_a_server_error", "--max-examples", "40",
             "--phases", "examples,coverage,fuzzing", "--generation-deterministic", "--request-timeout", "10",
             "--workers", "1", "--report", "ndjson", "--report-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=240, cwd=tmp_path, check=False,
        )  # fmt: skip
        print(run.stdout[-3000:])
        assert run.returncode == 0, run.stdout[-4000:]
        assert "failed" not in run.stdout.split("SUMMARY")[-1].lower(), run.stdout[-4000:]
        generated = int(re.search(r"(\d+) generated", run.stdout).group(1))
        assert generated >= 300
        finished = metric(handle.url, 'paged_bench_request_finished_total{finish_reason="length"}')
        assert finished >= 20  # fuzzed bodies got through validation into the engine
    finally:
        handle.stop()
