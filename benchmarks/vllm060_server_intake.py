"""How long a burst of requests takes to reach the engine through vLLM 0.6.0's own OpenAI server
(issue 35: ``frontend.intake_ms`` / ``frontend.intake_token_us`` of the vLLM 0.6.0 cases).

benchmarks/vllm_frontend_burst.py rebuilt that path from the same parts; this one runs vLLM's code:
vllm/entrypoints/openai/api_server.py of vllm==0.6.0, its front end process and RPC client as they
are, in a virtualenv made by ``benchmarks/vllm060/make_env.sh ENV`` (no GPU: the engine process is
vLLM's own RPC server around a stand-in engine, ``benchmarks/vllm060/stand_in.py``, that stamps when
each request reaches it and answers none until the burst is all in). The client is
vllm_frontend_burst.py's rebuild of the 0.6.0 benchmark client (one aiohttp session a request, a
streamed POST), after one warm-up request as vLLM's benchmark_serving.py sends one first.

    benchmarks/vllm060/make_env.sh /tmp/vllm060
    .venv/bin/python benchmarks/vllm060_server_intake.py --vllm-env /tmp/vllm060 [--requests 500]
        [--prompt-tokens 462 202] [--repeats 3] [--tokenizer Llama-3's tokenizer.model]

``--server-env`` runs the API server process on another interpreter: CPython 3.10, which the
published runs' vllm/vllm-openai:v0.6.0 image ran (vLLM's Dockerfile at v0.6.0: ``ARG
PYTHON_VERSION=3.10``, deadsnakes' build on Ubuntu 20.04), where the project's is 3.11. Its
environment: ``benchmarks/vllm060/make_env.sh /tmp/vllm060-py310 /path/to/python3.10`` (torch a
stub there: benchmarks/vllm060/torch_stub); the engine process stays --vllm-env's.

For each burst: when its first and last request reached the engine (seconds after the burst
started), and the API server's CPU until the last one did, per request (what the serial intake
costs: the client shares this machine's two cores, so the wall time is longer), the whole process's
and its event loop thread's alone (the serial part; the rest, ZeroMQ's I/O thread and the like,
runs beside it on a host with cores to spare). Then, for each, the median at each prompt length and
the line through the medians, ``ms + us x prompt tokens``: ``frontend.intake_ms`` and
``frontend.intake_token_us``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm060.stand_in import process_cpu_seconds
from vllm_frontend_burst import burst, corpus_lines, free_port, llama3_tokenizer, prompts, train_tokenizer, wait_for

STAND_IN = Path(__file__).resolve().parent / "vllm060" / "stand_in.py"


def save_for_tokenizers_019(tok, path: str) -> None:
    """``tok`` as a tokenizer.json that vLLM 0.6.0's tokenizers (0.19) reads: its BPE merges as
    "a b" strings, as tokenizers wrote them before 0.20 (byte-level tokens hold no spaces)."""
    data = json.loads(tok.to_str())
    data["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    Path(path).write_text(json.dumps(data))


def interpreters(vllm_env: str, server_env: str | None) -> tuple[str, dict[str, str]]:
    """The API server's interpreter, and what its environment adds: ``server_env``'s, its engine
    process then on ``vllm_env``'s (stand_in.py's STAND_IN_ENGINE_PYTHON), else ``vllm_env``'s for both."""
    python = os.path.join(vllm_env, "bin", "python")
    if server_env is None:
        return python, {}
    return os.path.join(server_env, "bin", "python"), {"STAND_IN_ENGINE_PYTHON": python}


def one_burst(python: str, engine_env: dict[str, str], model: str, texts: list[str], tmp: str) -> dict[str, float]:
    """vLLM 0.6.0's server (``interpreters``' two) started afresh, one warm-up request, then ``texts`` at once."""
    port, log = free_port(), os.path.join(tmp, "stamps.json")
    env = {**os.environ, **engine_env, "STAND_IN_N": str(len(texts)), "STAND_IN_LOG": log}
    server = subprocess.Popen([python, str(STAND_IN), "serve", "--model", model, "--port", str(port),
                               "--disable-log-requests", "--max-num-seqs", "512"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_for(f"http://127.0.0.1:{port}/v1/models", tries=1200)
        url = f"http://127.0.0.1:{port}/v1/completions"
        asyncio.run(burst(url, texts[:1], model))  # benchmark_serving.py's initial single prompt
        cpu0, t0 = process_cpu_seconds(server.pid), time.perf_counter()
        loop0 = process_cpu_seconds(server.pid, thread=server.pid)
        asyncio.run(burst(url, texts, model))
        stamps = json.loads(Path(log).read_text())
    finally:
        server.terminate()
        server.wait()
    return {"first_s": min(stamps["stamps"]) - t0, "last_s": max(stamps["stamps"]) - t0,
            "cpu_ms": (stamps["server_cpu_s"] - cpu0) / len(texts) * 1e3,
            "loop_ms": (stamps["server_loop_cpu_s"] - loop0) / len(texts) * 1e3}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-env", required=True, help="the virtualenv benchmarks/vllm060/make_env.sh made")
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--prompt-tokens", type=int, nargs="+", default=[462, 202])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tokenizer", help="Llama 3's tokenizer.model (default: a BPE trained here)")
    p.add_argument("--server-env", help="make_env.sh's environment for another PYTHON (3.10): the API server's")
    a = p.parse_args()
    python = os.path.join(a.vllm_env, "bin", "python")
    server_python, engine_env = interpreters(a.vllm_env, a.server_env)
    print(subprocess.run([server_python, "-c", "import sys; print('the API server on Python', sys.version.split()[0])"],
                         check=True, capture_output=True, text=True).stdout.strip())  # fmt: skip
    lines = corpus_lines()
    tok = llama3_tokenizer(a.tokenizer) if a.tokenizer else train_tokenizer(lines)
    sets = {n: prompts(tok, lines, a.requests, n) for n in a.prompt_tokens}
    sizes = {n: statistics.mean(len(tok.encode(t).ids) + 1 for t in texts) for n, texts in sets.items()}  # + BOS
    runs: list[tuple[float, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        made = ["--llama3", a.tokenizer] if a.tokenizer else ["--tokenizer-json", os.path.join(tmp, "tok.json")]
        if not a.tokenizer:
            save_for_tokenizers_019(tok, made[1])
        subprocess.run([python, str(STAND_IN), "model", model, *made], check=True, capture_output=True)
        for repeat in range(a.repeats):
            for n, texts in sets.items():  # the lengths alternate: the machine's drift meets each alike
                run = one_burst(server_python, engine_env, model, texts, tmp)
                runs.append((sizes[n], run))
                print(f"{a.requests} requests of {sizes[n]:.0f} prompt tokens: "
                      f"first at the engine {run['first_s']:.3f} s, last {run['last_s']:.3f} s; the API server's "
                      f"CPU until then {run['cpu_ms']:.2f} ms a request, its event loop's {run['loop_ms']:.2f} "
                      f"(load average {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    for key, what in (("cpu_ms", "the API server's CPU"), ("loop_ms", "its event loop thread's")):
        print_fit(runs, key, what)


def print_fit(runs: list[tuple[float, dict[str, float]]], key: str, what: str) -> None:
    """The median of ``key`` at each prompt length, and the line through the medians (least squares
    for more than two lengths)."""
    sizes = sorted({size for size, _ in runs})
    medians = {size: statistics.median(r[key] for t, r in runs if t == size) for size in sizes}
    print(f"{what}: " + ", ".join(f"median {ms:.2f} ms a request at {size:.0f} tokens" for size, ms in medians.items()))
    if len(medians) > 1:
        x, y = np.array(list(medians)), np.array(list(medians.values()))
        (base, per_token), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(x), x]), y, rcond=None)
        print(f"  fit: {base:.2f} ms + {per_token * 1e3:.2f} us x prompt tokens "
              f"(frontend.intake_ms={base:.2f} frontend.intake_token_us={per_token * 1e3:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
