"""The engine behind the server: one background thread steps it continuously.

The engine is not thread-safe, so only this thread touches it. HTTP handlers (on the asyncio
event loop) ``submit`` requests and ``finish`` them early (client gone, stop string) through a
command queue that the thread drains between steps: requests join and leave the batch between
steps, which is continuous batching. After each step the thread hands every request's new
tokens, and its end, to the event loop in one batch (``call_soon_threadsafe``), where each
request's ``Stream`` queue receives them.

Fairness between requests: the prompts (and choices) of one HTTP request form a group, and
the engine gets at most ``max_prefills`` of a group's sequences that are still before their
first token at a time; the rest wait here, and are handed over as the group's prefills end,
the groups taking turns (each one's next sequence joins the engine's FCFS queue behind those
of the other groups). A fan-out (64 prompts, or ``n``) so cannot fill the engine's queue and
batch ahead of a request that arrives after it: that request waits for at most one prefill
chunk of each group already in, not for every prompt of each.

A request whose own sampling fails (the backend notes it in ``sampling_failures`` instead of
raising) ends alone with ``FinishReason.ERROR``; the placeholder token sampled for it is never
sent. If a whole step raises, every unfinished request ends with ``FinishReason.ERROR`` (its
stream gets a generic error; the details go to the log), its blocks are freed, and the loop
goes on serving new requests.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass, field

from paged_bench.core.engine import Engine
from paged_bench.core.request import FinishReason, Request
from paged_bench.model.logprobs import LogprobsRequest

log = logging.getLogger("paged_bench.serve")

IDLE_POLL_S = 0.5  # an idle loop also wakes this often to notice a stop


@dataclass(frozen=True, slots=True)
class Update:
    """What happened to one request since the last update."""

    token_ids: list[int]  # new output tokens
    finish_reason: FinishReason | None = None
    error: str | None = None


@dataclass(eq=False)
class Stream:
    """The event-loop side of one request: its updates arrive on ``queue``."""

    req: Request
    queue: asyncio.Queue[Update] = field(default_factory=asyncio.Queue)
    done: bool = False  # its final update was delivered

    @property
    def waiting(self) -> bool:
        """Submitted but not scheduled yet (read across threads: one attribute, atomic)."""
        return not self.done and self.req.first_scheduled_time is None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The engine's state after the last step, for /metrics (written by the engine thread)."""

    running: int = 0
    waiting: int = 0
    num_blocks: int = 0
    free_blocks: int = 0
    preemptions: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    steps: int = 0
    errors: int = 0


@dataclass(eq=False)
class _Group:
    """The sequences of one HTTP request: those not handed to the engine yet, and those that were."""

    pending: deque[Stream]
    admitted: list[Request] = field(default_factory=list)

    def num_prefilling(self) -> int:
        """Handed to the engine and not past the prompt yet (waiting, prefilling, or preempted
        and recomputing); the finished ones are dropped on the way."""
        self.admitted = [r for r in self.admitted if not r.is_finished]
        return sum(r.num_computed_tokens < r.num_prompt_tokens for r in self.admitted)


class EngineLoop:
    def __init__(self, engine: Engine, observer=None, max_prefills: int = 1) -> None:
        """``observer`` (optional) gets ``step(engine)`` after each step and ``finished(req)``
        for each request that ends; called on the engine thread. ``max_prefills``: at most
        that many sequences of one request before their first token in the engine at once."""
        self.engine = engine
        self.max_prefills = max_prefills
        self._groups: deque[_Group] = deque()  # engine side: requests with sequences not handed over
        self.observer = observer
        self.snapshot = Snapshot(num_blocks=engine.allocator.layout.num_blocks,
                                 free_blocks=engine.allocator.num_free_blocks)
        self.streams: set[Stream] = set()  # event-loop side: every request not yet done
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False
        self._live: dict[Request, tuple] = {}  # engine side: stream, tokens pushed[, tokens to send]
        self._errors = 0
        self._aio: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if hasattr(engine.backend, "sampling_failures"):  # real backends: isolate per request
            engine.backend.sampling_failures = []
        self._sinks = getattr(engine.backend, "logprob_sinks", None)  # real backends compute logprobs

    # -- event-loop side ----------------------------------------------------------------------

    def start(self) -> None:
        """Start stepping; call from the event loop that will consume the streams."""
        self._aio = asyncio.get_running_loop()
        self.engine.clock.start()
        self._thread = threading.Thread(target=self._run, name="paged-bench-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort what is left, stop the thread, release the backend."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def num_waiting(self) -> int:
        return sum(s.waiting for s in self.streams)

    def submit(self, req: Request) -> Stream:
        return self.submit_group([req])[0]

    def submit_group(self, reqs: list[Request]) -> list[Stream]:
        """The sequences of one request (its prompts x ``n``), admitted ``max_prefills`` at a time."""
        now = self.engine.clock.now()
        streams = []
        for req in reqs:
            req.arrival_time = now
            streams.append(Stream(req))
        self.streams.update(streams)
        self._commands.put(("add", streams))
        self._wake.set()
        return streams

    def finish(self, stream: Stream, reason: FinishReason = FinishReason.ABORT) -> None:
        """End a request early (ABORT: the client went away; STOP: a stop string matched)."""
        if not stream.done:
            self._commands.put(("finish", stream, reason))
            self._wake.set()

    def _deliver(self, updates: list[tuple[Stream, Update]]) -> None:
        for stream, update in updates:
            if update.finish_reason is not None:
                stream.done = True
                self.streams.discard(stream)
            stream.queue.put_nowait(update)

    # -- engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        try:
            while not self._stopping:
                self._wake.clear()
                self._drain()
                self._feed()
                if not engine.has_unfinished():
                    self._publish()
                    self._wake.wait(IDLE_POLL_S)
                    continue
                try:
                    engine.step()
                except Exception:  # the server must outlive a failed step
                    log.exception("engine step failed; ending the affected requests")
                    self._errors += 1
                    engine.scheduler.abort_all(FinishReason.ERROR, engine.clock.now(),
                                               "the engine failed a step; the server logged the details",
                                               submitted=self._live)  # fmt: skip
                self._end_failed_requests()
                if self.observer is not None:
                    self.observer.step(engine)
                self._publish()
        finally:
            self._drain()  # requests submitted meanwhile end with the rest
            for group in self._groups:
                for stream in group.pending:
                    self._end_pending(stream, FinishReason.ABORT, "the server is shutting down")
            self._groups.clear()
            engine.scheduler.abort_all(FinishReason.ABORT, engine.clock.now(), "the server is shutting down",
                                       submitted=self._live)  # fmt: skip
            self._publish()
            engine.backend.close()

    def _end_failed_requests(self) -> None:
        """End the requests whose sampling failed in the last step, and only them."""
        failures = getattr(self.engine.backend, "sampling_failures", None)
        if not failures:
            return
        now, by_id = self.engine.clock.now(), {req.request_id: req for req in self._live}
        for rid, message in failures:
            log.error("request %s: %s", rid, message)
            self._errors += 1
            req = by_id.get(rid)
            if req is None:
                continue
            if not req.is_finished:
                self.engine.scheduler.finish_request(req, FinishReason.ERROR, now, message)
            req.finish(FinishReason.ERROR, now, message)  # also when the placeholder ended it
            stream, pushed, *_ = self._live[req]
            self._live[req] = (stream, pushed, req.num_tokens - 1)  # the placeholder is never sent
        failures.clear()

    def _drain(self) -> None:
        now = self.engine.clock.now()
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                self._groups.append(_Group(deque(command[1])))
                continue
            stream: Stream = command[1]
            req = stream.req
            if req in self._live:
                self.engine.scheduler.finish_request(req, command[2], now)
            elif not req.is_finished:  # not handed to the engine yet
                for group in self._groups:
                    if stream in group.pending:
                        group.pending.remove(stream)
                        self._end_pending(stream, command[2])
                        break

    def _feed(self) -> None:
        """Hand each request's next sequences to the engine while fewer than ``max_prefills``
        of its own are before their first token, the requests taking turns."""
        for group in list(self._groups):
            while group.pending and group.num_prefilling() < self.max_prefills:
                stream = group.pending.popleft()
                self._add(stream)
                group.admitted.append(stream.req)
            if not group.pending:
                self._groups.remove(group)

    def _add(self, stream: Stream) -> None:
        req = stream.req
        self._live[req] = (stream, req.num_tokens)
        if isinstance(req, LogprobsRequest) and self._sinks is not None:
            self._sinks.by_id[req.request_id] = req.sink
        self.engine.add_request(req)  # a prompt that can never run is finished REJECTED

    def _end_pending(self, stream: Stream, reason: FinishReason, error: str | None = None) -> None:
        """End a sequence never handed to the engine; the next ``_publish`` delivers it."""
        self._live[stream.req] = (stream, stream.req.num_tokens)
        stream.req.finish(reason, self.engine.clock.now(), error)

    def _publish(self) -> None:
        """Hand new tokens and ends to the event loop, and refresh the snapshot."""
        updates = []
        for req, (stream, pushed, *limit) in list(self._live.items()):
            n = min(req.num_tokens, *limit) if limit else req.num_tokens
            if n > pushed or req.is_finished:
                new = req.token_ids[pushed:n].tolist()
                if req.is_finished:
                    del self._live[req]
                    if self._sinks is not None:
                        self._sinks.by_id.pop(req.request_id, None)
                    updates.append((stream, Update(new, req.finish_reason, req.error)))
                    if self.observer is not None:
                        self.observer.finished(req)
                else:
                    self._live[req] = (stream, n)
                    updates.append((stream, Update(new)))
        if updates and self._aio is not None:
            try:
                self._aio.call_soon_threadsafe(self._deliver, updates)
            except RuntimeError:  # the event loop is closed: nobody is listening any more
                pass
        sched, alloc = self.engine.scheduler, self.engine.allocator
        counters = alloc.counters
        self.snapshot = Snapshot(
            running=len(sched.running),
            waiting=len(sched.waiting) + sum(len(g.pending) for g in self._groups),  # held back here too
            num_blocks=alloc.layout.num_blocks,
            free_blocks=alloc.num_free_blocks,
            preemptions=sched.num_preemptions,
            prefix_query_tokens=counters.prefix_query_tokens,
            prefix_hit_tokens=counters.prefix_hit_tokens,
            steps=self.engine.num_steps,
            errors=self._errors,
        )
