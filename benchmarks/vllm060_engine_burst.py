"""A published case run through vLLM 0.6.0's own server and engine, the GPU
priced by paged_bench's measured cost model, beside the simulator and the published figures
(issue 35: is what the simulator misses in vLLM's CPU path or in its GPU?).

    benchmarks/vllm060/make_env.sh /tmp/vllm060
    .venv/bin/python benchmarks/vllm060_engine_burst.py --vllm-env /tmp/vllm060
        [--case h100-8b-prefill-heavy-inf] [--draw 0] [--tokenizer Llama-3's tokenizer.model]
        [--server-env /tmp/vllm060-py310]

The case (conf/validation/) gives the requests (a ShareGPT case's ``--draw``: the simulator's draw
of that seed, each prompt cut to its length, each request's max_tokens its output length; a listed
case's: the published requests, a reply of 0 tokens counted with TTFT 0 as vLLM's client counted it;
a QPS case's: sent when the simulator's arrivals are, vLLM's client's own Poisson draw), the GPU,
model and TP, and vLLM's --num-scheduler-steps, --max-num-seqs and --max-model-len (its overrides
``scheduler.num_scheduler_steps``, ``max_batch`` and a numeric ``max_model_len``).
benchmarks/vllm060/real_engine.py serves them: vLLM 0.6.0's API server, RPC server and
AsyncLLMEngine as they are, the executor a stand-in whose GPU time is ``MeasuredCost.gpu_seconds``
of each step. The client is vllm_frontend_burst.py's rebuild of vLLM's benchmark client (one
aiohttp session a request, streamed), after one warm-up request (the first of the burst, alone, as
benchmark_serving.py sends it); it times each request's first and last streamed chunk. Every
request runs to its max_tokens (the stand-in never samples an end token), so TPOT is (last -
first) / (outputs - 1) over the requests of more than one output, benchmark_serving.py's formula.
The simulator's figures are ``python -m paged_bench.validate``'s for the case, on the same draw;
its steps are counted beside the engine's (its log: each step's start, end, prompt tokens and
sequences, written when the client has every output). The stand-in ends each step before vLLM's
CPU goes on, where a GPU lets it run ahead (the multi-step runner's ``wait_previous_step`` makes
the stream wait, not the CPU), so here vLLM reads a step's tokens during the next step and learns
of a request's end one step after its last token: when that leaves it nothing to run, its loop
pauses with the window unfinished and runs the window's remaining steps when the next request
arrives. So the warm-up request's last window runs out as the burst reaches the engine (the steps
before the first prompt step), and the burst's last window is logged only up to the client's last
output. On a GPU the ends are read at the window's last step and the window runs out at once, as
the simulator runs it.
The server, its engine process and the client share this machine's cores: what vLLM's CPU path
costs here, not on the source's host. ``--server-env`` runs the API server process on another
interpreter (CPython 3.10, the vllm/vllm-openai:v0.6.0 image's: vllm060_server_intake.py says how),
the engine process on --vllm-env's.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm060_server_intake import STAND_IN, interpreters, save_for_tokenizers_019
from vllm_frontend_burst import burst, corpus_lines, free_port, llama3_tokenizer, prompts, train_tokenizer, wait_for

from paged_bench.validate.cases import Case, load_registry
from paged_bench.validate.simulate import SEED, run_case, run_draw
from paged_bench.validate.workloads import arrival_times, request_lengths

REAL_ENGINE = Path(__file__).resolve().parent / "vllm060" / "real_engine.py"


def engine_pid(server: int) -> int:
    """The engine process vLLM's API server spawned (its child; under --server-env, exec'd into the
    engine's interpreter as ``real_engine.py rpc``)."""
    children = Path(f"/proc/{server}/task/{server}/children").read_text().split()
    for pid in children:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"spawn_main" in cmdline or b"real_engine.py\0rpc\0" in cmdline:
            return int(pid)
    raise RuntimeError(f"no engine process under {server}: {children}")


def simulated_steps(case: Case, draw: int) -> str:
    """The simulator's steps on the same draw, counted as the engine's are below."""
    with tempfile.TemporaryDirectory() as tmp:
        steps = run_draw(case, draw, Path(tmp)).result.steps
    ends, prompt = steps.column("time"), steps.column("prefill_tokens") > 0
    first, ended = ends[0] - steps.column("duration")[0], int((steps.column("batch_size") == 0).sum())
    return (f"simulator: {len(ends)} steps, the first {first:.3f} s after the burst was sent: {int(prompt.sum())} "
            f"prompt steps, {int((~prompt).sum())} decode steps, {ended} of them with every request in their "
            f"window already ended; the last step ends {ends[-1]:.2f} s in")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-env", required=True, help="the virtualenv benchmarks/vllm060/make_env.sh made")
    p.add_argument("--case", default="h100-8b-prefill-heavy-inf", help="a case of conf/validation/")
    p.add_argument("--draw", type=int, default=SEED, help="which of a ShareGPT case's draws (its seed)")
    p.add_argument("--tokenizer", help="Llama 3's tokenizer.model (default: a BPE trained here)")
    p.add_argument("--server-env", help="make_env.sh's environment for another PYTHON (3.10): the API server's")
    a = p.parse_args()
    case = {c.name: c for f in load_registry() for c in f.cases}[a.case]
    w = case.workload
    options = dict(o.split("=", 1) for o in case.overrides)
    steps = options.get("scheduler.num_scheduler_steps", "1")
    lines = corpus_lines()
    tok = llama3_tokenizer(a.tokenizer) if a.tokenizer else train_tokenizer(lines)
    lengths = request_lengths(w, a.draw)  # the simulator's draw: (prompt, output) tokens a request
    send_gaps = np.diff(arrival_times(w.num_requests, w.rate, a.draw), prepend=0.0).tolist()  # all 0: at once
    outputs = [int(o) for o in lengths[:, 1]]
    # each cut to its length (+ BOS: the server adds it)
    drawn = prompts(tok, lines, w.num_requests, int(lengths[:, 0].max()))
    texts = [tok.decode(tok.encode(t).ids[: int(n) - 1]) for t, n in zip(drawn, lengths[:, 0], strict=True)]
    sizes = [len(tok.encode(t).ids) + 1 for t in texts]
    python = os.path.join(a.vllm_env, "bin", "python")
    with tempfile.TemporaryDirectory() as tmp:
        model, log = os.path.join(tmp, "model"), os.path.join(tmp, "steps.json")
        made = ["--llama3", a.tokenizer] if a.tokenizer else ["--tokenizer-json", os.path.join(tmp, "tok.json")]
        if not a.tokenizer:
            save_for_tokenizers_019(tok, made[1])
        subprocess.run([python, str(STAND_IN), "model", model, *made], check=True, capture_output=True)
        port = free_port()
        server_python, engine_env = interpreters(a.vllm_env, a.server_env)
        env = {**os.environ, **engine_env, "PB_HARDWARE": case.gpu, "PB_MODEL": case.model, "PB_TP": str(case.tp),
               "PB_STEP_LOG": log}  # fmt: skip
        max_len = options.get("max_model_len", "auto")  # a number caps the prompt steps: max(it, 2048) tokens
        server = subprocess.Popen([server_python, str(REAL_ENGINE), "--model", model, "--port", str(port),
                                   "--disable-log-requests", "--disable-log-stats", "--num-scheduler-steps", steps,
                                   "--max-num-seqs", options.get("max_batch", "256"), "--block-size", "16",
                                   *(["--max-model-len", max_len] if max_len.isdigit() else [])],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            wait_for(f"http://127.0.0.1:{port}/v1/models", tries=1200)
            url = f"http://127.0.0.1:{port}/v1/completions"
            asyncio.run(burst(url, texts[:1], model, outputs[:1]))  # benchmark_serving.py's first request, alone
            start = time.perf_counter()
            streams = asyncio.run(burst(url, texts, model, outputs, send_gaps))
            os.kill(engine_pid(server.pid), signal.SIGUSR1)
            time.sleep(1)
            step_log = [s for s in json.loads(Path(log).read_text()) if s["start"] >= start]
        finally:
            server.terminate()
            server.wait()
    tpots = [(s.last - s.first) / (n - 1) for s, n in zip(streams, outputs, strict=True) if n > 1]
    # a listed reply of 0 tokens ended at its first: vLLM's client saw no text and counted TTFT 0 (client_summary)
    empty = [n == 0 for n in w.output_lens] or [False] * len(streams)
    ttfts = [0.0 if e else s.first - s.sent for s, e in zip(streams, empty, strict=True)]
    real = {"request_throughput": len(streams) / (max(s.last for s in streams) - start),
            "mean_ttft_ms": statistics.mean(ttfts) * 1e3,
            "first_ttft_ms": min(s.first - s.sent for s, e in zip(streams, empty, strict=True) if not e) * 1e3,
            "mean_tpot_ms": statistics.mean(tpots) * 1e3}  # fmt: skip
    simulated = {row.figure.metric: row for row in run_case(case, time_limit_s=120, seeds=[a.draw])}
    print(f"{a.case} (draw {a.draw}): {w.num_requests} requests of {statistics.mean(sizes):.0f} prompt tokens and "
          f"{statistics.mean(outputs):.0f} outputs (means) at {w.rate:g} req/s; "
          f"vLLM 0.6.0 --num-scheduler-steps {steps} "
          f"--max-num-seqs {options.get('max_batch', 256)}, "
          f"GPU priced as {case.gpu} {case.model} TP {case.tp}; "
          f"the API server in {a.server_env or a.vllm_env}")  # fmt: skip
    print("| figure | published | simulator | vLLM 0.6.0's engine, paged_bench's GPU |")
    print("|---|---:|---:|---:|")
    for metric, value in real.items():
        row = simulated.get(metric)
        pub = f"{row.figure.published:,.4g}" if row else "-"
        sim = f"{row.simulated:,.4g} ({row.ratio:.2f}x)" if row and row.ratio is not None else "-"
        mine = f"{value:,.4g}" + (f" ({value / row.figure.published:.2f}x)" if row else "")
        print(f"| {metric} | {pub} | {sim} | {mine} |")
    prompt_steps = [s for s in step_log if s["prompt_tokens"]]
    # the engine's own time before each step but the first (scheduling, output processing)
    idle = [(step, step["start"] - prev["end"]) for prev, step in itertools.pairwise(step_log)]
    lead = next((i for i, s in enumerate(step_log) if s["prompt_tokens"]), 0)  # the warm-up's window (docstring)
    print(f"engine: {len(step_log)} steps logged, the first {step_log[0]['start'] - start:.3f} s after the burst was "
          f"sent: {lead} before its first prompt step, {len(prompt_steps)} prompt steps (their GPU "
          f"{sum(s['end'] - s['start'] for s in prompt_steps):.2f} s), {len(step_log) - lead - len(prompt_steps)} "
          f"decode steps; the engine's own time between steps {sum(t for _, t in idle):.2f} s; "
          f"the last logged step ends {step_log[-1]['end'] - start:.2f} s in")  # fmt: skip
    print(simulated_steps(case, a.draw))
    between = [t for step, t in idle if step["prompt_tokens"]]
    if between:  # what vLLM's engine spends on its own before each prompt step (scheduling, output processing)
        print(f"before each prompt step after the first: median {statistics.median(between) * 1e3:.2f} ms, "
              f"mean {statistics.mean(between) * 1e3:.2f} ms over {len(between)}")  # fmt: skip


if __name__ == "__main__":
    main()
