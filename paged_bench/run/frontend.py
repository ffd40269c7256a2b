"""The serving front end an in-process run can add to its figures (``frontend=...``): what an
HTTP server puts between a client and the engine, priced instead of run.

A served request pays a price on its way in (HTTP parsing, validation, tokenisation, the hand-off
to the engine process) and each of its output tokens one on its way out (detokenisation, the
hand-back from the engine, OpenAI-style JSON and a server-sent event). ``target=served`` pays them
for real; an in-process run (``target=engine``) with ``frontend.request_ms`` / ``frontend.token_ms``
set adds them to the times it records, as a ``target=served`` run would see them:

- a request reaches the scheduler ``request_ms`` after it was sent (its TTFT and end-to-end
  latency grow by that; its arrival time stays the send time);
- the front end is one serial stage, as vLLM's API server process is (vLLM 0.6.0 moved it out of
  the engine's process, PR #6883; its blog post of 2024-09-05 names it a bottleneck under load):
  the tokens a step produced are handed to it when the step ends, it takes ``token_ms`` for each,
  starting once it has finished the previous step's, and the client sees them all when it is done;
- ``intake_ms``: the front end also takes requests in one at a time (one asyncio loop: vLLM's API
  server parses, validates and tokenises each, then hands it to the engine from a task that the
  loop queues behind the requests already waiting: ``merge_async_iterators`` in the 0.6.0-era
  vllm/utils.py starts one per prompt with ``ensure_future``), so requests that come while it is
  busy reach the engine together, when it has taken in the last of them: a burst of N requests
  sent at once reaches the engine N x ``intake_ms`` after it was sent, a lone request
  ``intake_ms`` after. ``intake_token_us`` adds to each request's intake that many microseconds
  per prompt token (tokenising it): ``benchmarks/vllm060_server_intake.py`` measures both on vLLM
  0.6.0's own server (its hand-offs of a burst come together, at the burst's end).

- ``stream_ms``: an API server in the engine's own process, as vLLM's was before 0.6.0 (0.5.3's
  ``AsyncLLMEngine`` and its OpenAI server share one process, one event loop and the GIL; its
  2024-09-05 post profiled 8B on H100 at 33% of the time in the HTTP server): after each step the
  server streams that step's outputs (``AsyncStream`` queues, ``merge_async_iterators``,
  ``completion_stream_generator``'s pydantic chunk and ``model_dump_json``, starlette/uvicorn's
  send), ``stream_ms`` of CPU each, before the engine schedules the next step. The engine loop
  adds it to the step (``core.engine.Engine.step``: outputs x ``stream_ms``, into the step's
  duration, so the client sees the step's tokens when the last is sent and the next step starts
  then); the engine is slowed, unlike by ``token_ms``, whose separate process runs beside it.
  Measured on this machine by ``benchmarks/vllm053_stream_cost.py``. Virtual time only (a wall
  clock's steps already took what they took).

So at light load a request's TTFT grows by exactly ``intake_ms + request_ms + token_ms`` (one
token in the step) and its ITL not at all (each token is late by the same amount); once a step's
tokens take the front end longer than the step (``B x token_ms`` for B rows), it sets the pace and
the ITL becomes ``B x token_ms``. The engine itself is not slowed: its step records are unchanged,
and a closed loop (``workload.max_concurrency``) sends its next request when the engine finishes
one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from paged_bench.core.engine import EngineResult
from paged_bench.core.request import Request
from paged_bench.errors import check, check_number
from paged_bench.run.output_timing import OUTPUT_TIMINGS


@dataclass(frozen=True)
class FrontendSettings:
    """``frontend``: milliseconds per request on its way in, per output token on its way out, per
    request taken in by the serial intake, and per streamed output inside the engine's process."""

    request_ms: float = 0.0
    token_ms: float = 0.0
    intake_ms: float = 0.0
    intake_token_us: float = 0.0  # the intake's price per prompt token, beside intake_ms per request
    output_timing: str = "step"  # when a step's outputs reach the client: run/output_timing.py
    stream_ms: float = 0.0  # the server in the engine's process: its CPU per streamed output, serial with the steps

    def __post_init__(self) -> None:
        check_number("frontend.request_ms", self.request_ms)
        check_number("frontend.token_ms", self.token_ms)
        check_number("frontend.intake_ms", self.intake_ms)
        check_number("frontend.intake_token_us", self.intake_token_us)
        check_number("frontend.stream_ms", self.stream_ms)
        check(self.output_timing in OUTPUT_TIMINGS, "frontend.output_timing", self.output_timing,
              " or ".join(OUTPUT_TIMINGS) + " (vllm060: as vLLM 0.6.0's server with async output processing)")  # fmt: skip

    @classmethod
    def from_config(cls, section: Any) -> FrontendSettings:
        """The ``frontend`` section (absent: none), each key checked."""
        if section is None:
            return cls()
        check(isinstance(section, Mapping), "frontend", section, "a frontend config group option, e.g. frontend=none")
        keys = [f.name for f in fields(cls)]
        for key, value in section.items():
            check(key in keys, f"frontend.{key}", value, f"not a frontend key; its keys are {', '.join(keys)}")
        return cls(**section)

    @property
    def priced(self) -> bool:
        """Anything other than the defaults (no front end)."""
        return self != FrontendSettings()

    def refuse_priced(self, allowed: str) -> None:
        """Refuse a priced front end where none applies (``allowed`` says what is, and why)."""
        check(not self.priced, "frontend", asdict(self), allowed)


def intake(sent: list[float], seconds: list[float]) -> list[float]:
    """When each request, sent at ``sent``, is through the serial intake: taken in one after
    another, ``seconds`` each, in the order sent; every request of one busy spell (from a
    request that found the intake idle until it is idle again) is handed on when the spell ends."""
    through = list(sent)
    spell: list[int] = []
    free = float("-inf")
    for i in sorted(range(len(sent)), key=sent.__getitem__):
        if sent[i] > free:  # found it idle: the previous spell's requests go on together
            for j in spell:
                through[j] = free
            spell = []
        free = max(free, sent[i]) + seconds[i]
        spell.append(i)
    for j in spell:
        through[j] = free
    return through


def send_through(requests: list[Request], frontend: FrontendSettings) -> list[float]:
    """Delay each request's arrival at the engine by the front end's intake and price per
    request; returns the send times, for ``receive_through`` to put back."""
    sent = [req.arrival_time for req in requests]
    if frontend.intake_ms or frontend.intake_token_us:
        per_token = frontend.intake_token_us / 1e6
        seconds = [frontend.intake_ms / 1e3 + per_token * req.num_prompt_tokens for req in requests]
        for req, at in zip(requests, intake(sent, seconds)):
            req.arrival_time = at
    if frontend.request_ms:
        for req in requests:
            req.arrival_time += frontend.request_ms / 1e3
    return sent


def receive_through(result: EngineResult, sent: list[float], frontend: FrontendSettings) -> None:
    """Put the send times back and re-time every token as the client gets it through the serial
    front end (see the module's docstring); a request that ended with its last token ends when
    the client gets that token, and the run lasts until the last one is delivered."""
    requests = result.requests
    ended_with_token = [r.token_times and r.finish_time == r.token_times[-1] for r in requests]
    for req, at in zip(requests, sent):
        req.arrival_time = at
    if frontend.token_ms:
        # the tokens of one step share its end time exactly (the scheduler stamps them with it)
        by_step: dict[float, list[tuple[Request, int]]] = defaultdict(list)
        for req in requests:
            for i, t in enumerate(req.token_times):
                by_step[t].append((req, i))
        free = float("-inf")
        for end in sorted(by_step):
            tokens = by_step[end]
            free = max(end, free) + len(tokens) * frontend.token_ms / 1e3
            for req, i in tokens:
                req.token_times[i] = free
    for req, last in zip(requests, ended_with_token):
        if last:
            req.finish_time = req.token_times[-1]
    ends = [r.finish_time for r in requests if r.finish_time is not None]
    result.duration = max([result.duration, *ends])
