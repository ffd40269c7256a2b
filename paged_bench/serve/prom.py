"""The server's ``GET /metrics``, in Prometheus text format.

Gauges and counters of the engine's state are read from the engine loop's latest snapshot at
scrape time (running and waiting requests, KV blocks used/free, preemptions, prefix-cache
tokens queried/hit, steps, engine errors); blocks shared by several requests are counted at
scrape time. Latency histograms (TTFT, ITL, E2E, in seconds, as
vLLM names them) and per-step batch sizes are observed on the engine thread as requests finish
and steps end, from the same per-request timestamps the offline metrics use. Each server has
its own registry, so several can live in one process (tests, notebooks).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from paged_bench.core.engine import Engine
from paged_bench.core.request import Request
from paged_bench.results.metrics import request_latency
from paged_bench.serve.engine_loop import EngineLoop

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "paged_bench_"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


def shared_blocks(allocator) -> int:
    """Blocks whose reference count is above one, read at scrape time (a paged pool only)."""
    pool = getattr(allocator, "pool", None)
    ref_cnt = getattr(pool, "ref_cnt", None)
    return 0 if ref_cnt is None else sum(1 for c in list(ref_cnt) if c > 1)


class _SnapshotCollector:
    def __init__(self, loop: EngineLoop) -> None:
        self.loop = loop

    def collect(self):
        s = self.loop.snapshot
        gauges = {
            "num_requests_running": ("requests in the running batch", s.running),
            "num_requests_waiting": ("requests waiting to be scheduled (incl. preempted)", s.waiting),
            "kv_blocks_used": ("KV-cache blocks held by requests", s.num_blocks - s.free_blocks),
            "kv_blocks_free": ("KV-cache blocks free (incl. cached blocks nobody holds)", s.free_blocks),
            "kv_blocks_total": ("KV-cache blocks in the pool", s.num_blocks),
            "kv_blocks_shared": ("KV-cache blocks held by more than one request (prefix sharing, n > 1)",
                                 shared_blocks(self.loop.engine.allocator)),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)
        counters = {
            "num_preemptions": ("requests preempted", s.preemptions),
            "prefix_cache_queries": ("prompt tokens looked up in the prefix cache", s.prefix_query_tokens),
            "prefix_cache_hits": ("prompt tokens found in the prefix cache", s.prefix_hit_tokens),
            "engine_steps": ("engine steps run", s.steps),
            "engine_errors": ("engine steps that raised (their requests ended with an error)", s.errors),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(PREFIX + name, doc, value=value)


class ServerMetrics:
    """The registry behind /metrics; an ``EngineLoop`` observer."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "arrival to first token", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds", "gap between consecutive tokens", buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "arrival to last token", buckets=_LATENCY_BUCKETS, registry=r)
        self.batch = Histogram(PREFIX + "step_batch_size", "requests per engine step", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.finished_total = Counter(PREFIX + "request_finished", "finished requests by reason", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "tokens generated for finished requests", registry=r)

    def attach(self, loop: EngineLoop) -> None:
        self.registry.register(_SnapshotCollector(loop))
        loop.observer = self

    # -- EngineLoop observer (engine thread) --------------------------------------------------

    def step(self, engine: Engine) -> None:
        last = engine.steps.last()
        if last is not None:
            self.batch.observe(last.batch_size)

    def finished(self, req: Request) -> None:
        reason = req.finish_reason.value if req.finish_reason else "unknown"
        self.finished_total.labels(reason).inc()
        self.prompt_tokens.inc(req.num_prompt_tokens)
        self.generation_tokens.inc(req.num_output_tokens)
        if not (req.finish_reason and req.finish_reason.succeeded):
            return
        lat = request_latency(req)
        if lat.ttft_ms is not None:
            self.ttft.observe(lat.ttft_ms / 1e3)
        if lat.e2el_ms is not None:
            self.e2e.observe(lat.e2el_ms / 1e3)
        for gap in lat.itl_ms:
            self.itl.observe(gap / 1e3)

    def render(self) -> bytes:
        return generate_latest(self.registry)
