"""What one large request costs everyone else on the numpy server (issue 36, item 5).

Starts ``python -m paged_bench.serve backend=numpy`` as its own process and measures, with the
official ``openai`` client:

1. memory: the server's peak RSS (``VmHWM`` in ``/proc/<pid>/status``) before and after one
   request of ``--copies`` identical prompts of ``--tokens`` tokens, ``max_tokens: 1`` (the
   issue's ~1 MB body: 64 x 4,000);
2. fairness: a stream already decoding, then one request of ``--distinct`` different prompts of
   ``--tokens`` tokens (``max_tokens: 1``), then ``--delay`` s later a small streamed request:
   that request's TTFT, the decoding stream's longest gap between tokens while the large
   request ran, and how long the large request took.

    .venv/bin/python benchmarks/serve_fairness.py                      # the issue's sizes
    .venv/bin/python benchmarks/serve_fairness.py --tokens 1000 --copies 16 --distinct 16 --delay 1

Extra ``key=value`` arguments go to the server (``scheduler.long_prefill_token_threshold=0
server.max_prefills_per_request=64`` turns the fairness off). Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from openai import OpenAI

ROOT = Path(__file__).resolve().parents[1]


def status_kb(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` figure in KiB (VmRSS: now, VmHWM: the peak so far)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


class Server:
    """``python -m paged_bench.serve backend=numpy`` on a free port, stopped on exit."""

    def __init__(self, *overrides: str, python: str = sys.executable, root: Path = ROOT) -> None:
        self._dir = tempfile.TemporaryDirectory()
        self.proc = subprocess.Popen(
            [python, "-m", "paged_bench.serve", "backend=numpy", "server.port=0", "server.log_level=warning",
             f"hydra.run.dir={self._dir.name}", *overrides],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=root,
        )  # fmt: skip
        line = self.proc.stdout.readline()  # "serving 'paged-bench-numpy' on http://127.0.0.1:PORT/v1 (...)"
        if " on http" not in line:
            self.stop()
            raise RuntimeError(f"the server did not start: {line}{self.proc.stdout.read()}")
        self.base_url = line.split(" on ", 1)[1].split()[0]
        self.client = OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=1800)
        self.model = self.client.models.list().data[0].id

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._dir.cleanup()


def memory(server: Server, tokens: int, copies: int) -> dict[str, float]:
    """RSS before, and peak RSS after, one request of ``copies`` identical prompts (MB)."""
    before = status_kb(server.proc.pid, "VmRSS")
    server.client.completions.create(model=server.model, prompt=[[250] * tokens] * copies, max_tokens=1)
    return {"rss_before_mb": before / 1024, "peak_rss_mb": status_kb(server.proc.pid, "VmHWM") / 1024}


def _stream_gaps(server: Server, max_tokens: int, started: threading.Event, stop: threading.Event,
                 out: list[float]) -> None:  # fmt: skip
    """Stream one decode, recording each token's arrival time, until ``stop`` is set."""
    stream = server.client.completions.create(model=server.model, prompt=[1, 2, 3], max_tokens=max_tokens,
                                              stream=True, extra_body={"ignore_eos": True})  # fmt: skip
    try:
        for _ in stream:
            out.append(time.perf_counter())
            started.set()
            if stop.is_set():  # closed, so that the server does not wait for it at shutdown
                stream.close()
                return
    except Exception:  # noqa: BLE001 - the server stopped under it: the figures are taken by then
        started.set()


def fairness(server: Server, tokens: int, distinct: int, delay: float) -> dict[str, float]:
    """TTFT (s) of a small request sent ``delay`` s after a request of ``distinct`` prompts, and
    the longest gap (s) a stream decoding all along saw while that request ran."""
    arrivals: list[float] = []
    started, stop = threading.Event(), threading.Event()
    decoding = threading.Thread(target=_stream_gaps, args=(server, 4000, started, stop, arrivals), daemon=True)
    decoding.start()
    started.wait(120)
    prompts = [[(7 * i + j) % 250 + 1 for j in range(tokens)] for i in range(distinct)]  # each its own prefix
    big: dict[str, float] = {}

    def send_big() -> None:
        t0 = time.perf_counter()
        server.client.completions.create(model=server.model, prompt=prompts, max_tokens=1)
        big.update(start=t0, end=time.perf_counter())

    sender = threading.Thread(target=send_big)
    sender.start()
    time.sleep(delay)
    t0 = time.perf_counter()
    for _ in server.client.completions.create(model=server.model, prompt="Hello", max_tokens=4, stream=True):
        ttft = time.perf_counter() - t0
        break
    sender.join()
    stop.set()
    decoding.join(30)
    during = [t for t in arrivals if big["start"] <= t <= big["end"]]
    gaps = [b - a for a, b in zip(during, during[1:])]
    return {"small_ttft_s": ttft, "max_decode_gap_s": max(gaps, default=float("nan")),
            "large_request_s": big["end"] - big["start"], "decode_tokens_during": len(during)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4000, help="tokens per prompt")
    parser.add_argument("--copies", type=int, default=64, help="identical prompts in the memory request")
    parser.add_argument("--distinct", type=int, default=16, help="distinct prompts in the fairness request")
    parser.add_argument("--delay", type=float, default=3.0, help="s from the large request to the small one")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs the server")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout it runs in (another: a before/after)")
    parser.add_argument("overrides", nargs="*", help="server settings, key=value")
    args = parser.parse_args()
    with Server(*args.overrides, python=args.python, root=args.root) as server:
        mem = memory(server, args.tokens, args.copies)
    print(f"memory: {args.copies} x {args.tokens}-token prompts: RSS before {mem['rss_before_mb']:.0f} MB, "
          f"peak {mem['peak_rss_mb']:.0f} MB")  # fmt: skip
    with Server(*args.overrides, python=args.python, root=args.root) as server:
        fair = fairness(server, args.tokens, args.distinct, args.delay)
    print(f"fairness: {args.distinct} distinct {args.tokens}-token prompts took {fair['large_request_s']:.1f} s; "
          f"a small request sent {args.delay:g} s in: TTFT {fair['small_ttft_s']:.2f} s; a decoding stream's "
          f"longest gap meanwhile {fair['max_decode_gap_s']:.2f} s ({fair['decode_tokens_during']} tokens)")  # fmt: skip


if __name__ == "__main__":
    main()
