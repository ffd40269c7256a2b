"""What HTTP and streaming add: the same workload in-process and through our server, side by side.

For each arrival rate, one run with ``target=engine`` and one with ``target=served`` (our server
spawned on a loopback port with the same config, hit by the load generator), then a table:
requests in flight on average (sum of E2EL / duration), output tokens (must be equal), TTFT and
ITL medians, tokens/s, the server's own mean TTFT and the HTTP overhead on TTFT (the client's
mean TTFT minus the server's), and whether the two TTFT medians differ by no more than that
overhead. Run from the repository root:

    .venv/bin/python benchmarks/serve_overhead.py                  # backend=numpy, 3 and 16 req/s
    .venv/bin/python benchmarks/serve_overhead.py --rates 3,16,24 backend=sim clock=wall
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from paged_bench.run.compose import compose_config
from paged_bench.run.job import run_job
from paged_bench.run.outcome import JobOutcome

WORKLOAD = ("workload=uniform", "workload.prompt_len=64", "workload.output_len=64")


def in_flight(outcome: JobOutcome) -> float:
    s = outcome.summary
    return s["mean_e2el_ms"] * s["completed"] / 1e3 / s["duration"] if s["duration"] else 0.0


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "n/a" if value is None else format(value, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="3,16", help="arrival rates (req/s), comma-separated")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("overrides", nargs="*", default=["backend=numpy"], help="config overrides (default: backend=numpy)")
    args = p.parse_args()
    header = ("rate", "target", "in flight", "out tokens", "TTFT p50 ms", "ITL p50 ms", "tok/s",
              "server TTFT ms", "HTTP overhead ms", "|dTTFT p50| <= overhead")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rate in args.rates.split(","):
            base = (*WORKLOAD, f"workload.num_requests={args.requests}", f"workload.rate={rate}", *args.overrides)
            local = run_job(compose_config(*base, "target=engine"), Path(tmp, f"engine-{rate}"))
            served = run_job(compose_config(*base, "target=served"), Path(tmp, f"served-{rate}"))
            overhead = served.summary["http_ttft_overhead_ms"]
            delta = abs(served.summary["median_ttft_ms"] - local.summary["median_ttft_ms"])
            for name, out in (("engine", local), ("served", served)):
                s = out.summary
                ok = "" if name == "engine" else ("yes" if overhead is not None and delta <= overhead else "NO") + f" ({delta:.1f})"
                rows.append((rate, name, fmt(in_flight(out)), str(s["total_output_tokens"]), fmt(s["median_ttft_ms"]),
                             fmt(s["median_itl_ms"]), fmt(s["output_throughput"], ".0f"),
                             fmt(s.get("server_mean_ttft_ms")), fmt(s.get("http_ttft_overhead_ms")), ok))
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
