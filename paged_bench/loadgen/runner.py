"""A workload against an OpenAI-compatible endpoint -> per-request output records, measured as
``vllm bench serve`` measures them.

Each request is sent at its arrival time (seconds from the start of the timed run) once the
concurrency cap lets it, streams, and is recorded as a ``RequestOutput``: sent at, one time
per chunk carrying content, output tokens from ``usage`` (else the tokenizer's count of the
text), a digest of the text. ``metrics.summarize`` and ``outputs.write_run`` read them as
``RequestRecords``, as they read an engine run's; the run's duration lasts until every
request has returned, failed ones included (vLLM's ``benchmark_duration``). Engine-only
figures (KV slots, preemptions, prefix hits, queue time) are null, and, when the server
exports Prometheus TTFT histograms (ours, vLLM), ``server_mean_ttft_ms`` and
``http_ttft_overhead_ms`` (client mean TTFT minus the server's own) say what HTTP and
streaming add.

Warm-up requests go first, one at a time, and are not recorded. A failed request is
recorded with its error and the run goes on; only a run where every request failed is
reported as failed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

try:  # uvloop (our server's loop too; a dependency except on Windows): less CPU a request
    from uvloop import run as run_loop  # (benchmarks/client_cpu.py)
except ImportError:  # pragma: no cover
    from asyncio import run as run_loop

from paged_bench.core.arrivals import feed
from paged_bench.core.engine import EngineResult, StepRecords
from paged_bench.core.kv.base import KVLayout
from paged_bench.core.request import FinishReason, Request
from paged_bench.errors import ConfigError, one_line
from paged_bench.loadgen.client import Endpoint, Outcome, get, request_body, send
from paged_bench.loadgen.config import TargetConfig
from paged_bench.loadgen.prometheus import ttft_totals
from paged_bench.loadgen.prompts import chat_texts
from paged_bench.loadgen.spawn import check_server_section, spawned_server
from paged_bench.model.tokenizers import serving_tokenizer, text_token_count
from paged_bench.results.records import RequestOutput, RequestRecords, text_digest
from paged_bench.run.bench import Bench

ENGINE_ONLY_FIGURES = (
    "kv_live_slots_peak", "kv_reserved_slots_peak", "kv_utilization_mean", "kv_waste_pct", "kv_bytes_per_token",
    "kv_reserved_bytes_peak", "num_preemptions", "recomputed_tokens", "swapped_blocks", "prefix_cache_hit_rate",
    "preempted_prefix_hit_tokens", "kv_capacity_blocks", "kv_capacity_tokens",
    "num_gpus", "output_throughput_per_gpu",  # the server's devices, which the client's config does not know
)  # fmt: skip


@dataclass
class RemoteRun:
    result: EngineResult  # the run's status and duration; no engine requests or steps
    records: RequestRecords
    summary: dict[str, Any]  # figures that replace or add to metrics.summarize's
    target: TargetConfig


def record(req: Request, out: Outcome, count_tokens: Callable[[str], int]) -> RequestOutput:
    """The client's view of one request."""
    text = "".join(out.text)
    prompt = out.prompt_tokens if out.prompt_tokens is not None else req.num_prompt_tokens
    # as vLLM's calculate_metrics: no count, or 0 for a text that has tokens, is counted from the text
    completion = out.completion_tokens or count_tokens(text)
    error = out.error
    reason = FinishReason.ERROR if error is not None else _finish_reason(out.finish_reason, completion, req.max_tokens)
    if error is None and not reason.succeeded:
        error = f"the server ended it with finish_reason {out.finish_reason!r}"
    end = out.end_time if out.end_time is not None else out.send_time
    return RequestOutput(req.request_id, out.send_time, req.max_tokens, prompt, completion, out.chunk_times, end,
                         reason.value, error, text_digest(text))  # fmt: skip


def _finish_reason(said: str | None, completion: int, max_tokens: int) -> FinishReason:
    """Why a stream that ended well ended: as the server said, by length when it said nothing
    and gave every token asked for, else stopped (a content filter or a tool call stops it)."""
    if said in ("length", "abort", "error"):
        return FinishReason(said)
    if said is None and completion >= max_tokens:
        return FinishReason.LENGTH
    return FinishReason.STOP


@dataclass
class _Run:
    target: TargetConfig
    requests: list[Request]
    texts: list[str]  # each request's chat text (none for completions, which send token ids)
    count_tokens: Callable[[str], int]
    on_step: Callable[[float, list[RequestOutput]], None] | None
    max_concurrency: int | None = None  # the workload's closed loop (arrivals)
    records: dict[int, RequestOutput] = field(default_factory=dict)  # index in requests -> record
    t0: float = 0.0
    duration: float | None = None  # until every timed request returned
    model: str | None = None

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def main(self) -> dict[str, Any]:
        to = Endpoint.of(self.target)
        async with _session(self.target) as session:
            self.model = await _server_model(session, to, self.target)
            await self._warmup(session, to)
            before = await ttft_totals(session, to, self.target)
            await self._timed(session, to)
            after = await ttft_totals(session, to, self.target)
        return _overhead(before, after, self.records.values())

    def _body(self, i: int) -> dict[str, Any]:
        return request_body(self.target, self.model, self.requests[i], self.texts[i] if self.texts else None)

    async def _warmup(self, session: aiohttp.ClientSession, to: Endpoint) -> None:
        for i in range(self.target.warmup):
            out = await send(session, to, self._body(i % len(self.requests)), self.now)
            if out.error:
                print(f"warning: warm-up request {i} failed: {out.error}", file=sys.stderr)

    async def _timed(self, session: aiohttp.ClientSession, to: Endpoint) -> None:
        """Send each request when ``arrivals`` says it is due; wake for the next due time or a finish."""
        sem = asyncio.Semaphore(self.target.concurrency) if self.target.concurrency else nullcontext()
        index = {id(req): i for i, req in enumerate(self.requests)}
        arrivals = feed(self.requests, self.max_concurrency)
        started: list[asyncio.Task] = []
        sending: set[int] = set()  # ids of the requests sent and not yet ended
        woken = asyncio.Event()
        self.t0 = time.perf_counter()

        async def one(req: Request) -> None:
            try:
                async with sem:
                    body = self._body(index[id(req)])
                    out = await send(session, to, body, self.now)
                rec = self.records[index[id(req)]] = record(req, out, self.count_tokens)
            finally:
                sending.discard(id(req))
                arrivals.finished([req], self.now())
                woken.set()
            if self.on_step is not None:
                self.on_step(self.now(), [rec])

        while True:
            for req in arrivals.due(self.now()):
                sending.add(id(req))
                started.append(asyncio.create_task(one(req)))
            next_time = arrivals.next_time()
            if next_time is None and not sending:
                break
            woken.clear()
            try:
                await asyncio.wait_for(woken.wait(), None if next_time is None else max(0.0, next_time - self.now()))
            except asyncio.TimeoutError:
                pass
        await asyncio.gather(*started)  # raises what a request task raised
        self.duration = self.now()

    def outputs(self, error: str | None, interrupted: bool) -> list[RequestOutput]:
        """Every request's output; those never sent or cut off when the run stopped are failed."""
        now = self.now() if self.t0 else 0.0
        reason = FinishReason.ABORT if interrupted else FinishReason.ERROR
        return [
            self.records.get(i)
            or RequestOutput(req.request_id, req.arrival_time, req.max_tokens, req.num_prompt_tokens,
                             finish_time=max(now, req.arrival_time),  # one never sent ends no earlier than it is due
                             finish_reason=reason.value, error=f"not completed: {error}")
            for i, req in enumerate(self.requests)
        ]  # fmt: skip

    def result(self, outputs: list[RequestOutput], error: str | None, interrupted: bool) -> EngineResult:
        return EngineResult(
            requests=[],
            steps=StepRecords(),
            duration=self.duration if self.duration is not None else (self.now() if self.t0 else 0.0),
            layout=KVLayout(0, 0, 0),
            kv_bytes_per_token=None,
            num_preemptions=0,
            recomputed_tokens=0,
            swapped_blocks=0,
            prefix_query_tokens=0,
            prefix_hit_tokens=0,
            error=error,
            interrupted=interrupted,
        )


def _session(target: TargetConfig) -> aiohttp.ClientSession:
    """One session for the run, set up as ``vllm bench serve`` sets up its own (``benchmark()``
    in ``vllm/benchmarks/serve.py``, vLLM 009e6d4a): connections capped at the concurrency (0: no
    cap), kept alive 60 s; redirects are followed (aiohttp's default). The environment's proxy is
    looked up once (``client.Endpoint``), not per request as vLLM's ``trust_env=True`` does. No
    session-wide timeout: ``send`` bounds each request by ``target.timeout_s``."""
    limit = target.concurrency or 0
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, keepalive_timeout=60)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


async def _server_model(session: aiohttp.ClientSession, to: Endpoint, target: TargetConfig) -> str | None:
    """``target.model``, else the server's first model; None (requests then name no model) if
    it cannot be listed. A base URL without its ``/v1`` is refused either way."""
    try:
        status, body = await get(session, to, target.url + "/models", 10.0)
        if status == 404 and await _answers(session, to, target.url + "/v1/models"):
            # vLLM's --base-url is the server's root; ours is the API's, as the openai client's
            raise ConfigError("target.base_url", target.base_url, f"the API's root, where /models is: {target.url}/v1")
        if status != 200:
            raise ValueError(f"HTTP {status}")
        listed = orjson.loads(body)["data"][0]["id"]
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, IndexError, TypeError) as e:
        if target.model:  # a server that lists no models may still serve the one named
            return target.model
        print(f"warning: could not list the models at {target.url}/models ({one_line(e)}); "
              "sending requests without a model name", file=sys.stderr)
        return None
    return target.model or listed


async def _answers(session: aiohttp.ClientSession, to: Endpoint, url: str) -> bool:
    try:
        status, _ = await get(session, to, url, 10.0)
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False
    return 200 <= status < 300


def _overhead(before: tuple[float, float] | None, after: tuple[float, float] | None,
              records: Iterable[RequestOutput]) -> dict[str, Any]:  # fmt: skip
    """Server-side mean TTFT over the timed run, and what the client saw on top of it."""
    out: dict[str, Any] = {"server_mean_ttft_ms": None, "http_ttft_overhead_ms": None}
    if before is None or after is None or after[1] <= before[1]:
        return out
    server = (after[0] - before[0]) / (after[1] - before[1]) * 1e3
    client = [(r.chunk_times[0] - r.send_time) * 1e3 for r in records if r.succeeded and r.chunk_times]
    out["server_mean_ttft_ms"] = server
    if client:
        out["http_ttft_overhead_ms"] = sum(client) / len(client) - server
    return out


def run_target(cfg: Mapping[str, Any], bench: Bench, run_dir: Path,
               on_step: Callable[[float, list[RequestOutput]], None] | None = None) -> RemoteRun:
    """Run ``bench.requests`` against ``cfg['target']`` (raises ConfigError before anything runs)."""
    target = TargetConfig.from_mapping(cfg["target"])
    if target.spawns:
        check_server_section(cfg.get("server"))
    # the tokenizer our server would speak for this config's backend (target=served: does), so
    # chat texts and counted tokens agree with it
    choice = (cfg.get("server") or {}).get("tokenizer", "auto")
    tokenizer = serving_tokenizer(choice, bench.backend.tokenizer, bench.backend.vocab_size)
    chat = target.endpoint == "chat"
    texts = chat_texts(bench.requests, tokenizer, cfg.get("seed", 0)) if chat else []

    def count_tokens(text: str) -> int:  # when the server reports no usage, as vLLM's client counts
        return text_token_count(tokenizer, text)

    error, interrupted, extra = None, False, {}
    with spawned_server(cfg, target, run_dir) if target.spawns else nullcontext(target) as live:
        run = _Run(live, bench.requests, texts, count_tokens, on_step, bench.max_concurrency)
        try:
            extra = run_loop(run.main())
        except KeyboardInterrupt:
            error, interrupted = "interrupted", True
    outputs = run.outputs(error, interrupted)
    summary = dict.fromkeys(ENGINE_ONLY_FIGURES) | extra
    return RemoteRun(run.result(outputs, error, interrupted), RequestRecords.from_outputs(outputs), summary, live)
