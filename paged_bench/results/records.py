"""Per-request output records: what a run measured about each request, in-process or over HTTP.

``RequestOutput`` is one request as the load generator measures it (vLLM's
``RequestFuncOutput``): when it was sent, when each chunk carrying content arrived, when it
ended, its token counts and outcome. ``RequestRecords`` holds every request of a run as
columns (numpy arrays; times in seconds on the run's clock), built from the engine's
``Request``s (``from_requests``) or from the load generator's ``RequestOutput``s
(``from_outputs``). It is the one input of ``metrics.summarize`` and of ``requests.csv``,
so engine and HTTP runs are measured by the same code.

Chunk times are one per generated token in-process, and one per streamed chunk that carries
a choice over HTTP (a server may bundle several tokens into one chunk; the output token
count then comes from ``usage``, not from the chunks).

Digests let runs be compared token for token: ``output_digest`` is BLAKE2b (8 bytes, hex) of
the output token ids as little-endian 64-bit integers (known in-process), ``text_digest`` of
the returned text as UTF-8 (known over HTTP). Equal digests mean equal outputs.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter

import numpy as np

from paged_bench.core.request import FinishReason, Request

_DIGEST_BYTES = 8
_SWAP = sys.byteorder != "little"  # digests hash little-endian ids on every machine
_BLAKE2B = hashlib.blake2b(digest_size=_DIGEST_BYTES)  # copied for each digest: a third cheaper than a new one


def _blake2b(data: bytes | array) -> str:
    h = _BLAKE2B.copy()
    h.update(data)
    return h.hexdigest()


# per request, looked up: an Enum's ``value`` and a property are Python code, 20,000 calls a big run
_REASON_TEXT: dict[FinishReason | None, str] = {None: "", **{reason: reason.value for reason in FinishReason}}
_SUCCEEDED = tuple(reason for reason in FinishReason if reason.succeeded)


def token_digest(token_ids: Sequence[int]) -> str:
    """The stable digest of a sequence of token ids."""
    # a request's array('Q') as it is: ids are never negative, so its bytes are array('q')'s
    ids = token_ids if token_ids.__class__ is array and token_ids.typecode in "qQ" else array("q", token_ids)
    if _SWAP:
        ids = array(ids.typecode, ids)  # a copy to swap: the caller's ids stay as they are
        ids.byteswap()
    return _blake2b(ids)


def text_digest(text: str) -> str:
    """The stable digest of a text."""
    return _blake2b(text.encode("utf-8"))


@dataclass(slots=True)
class RequestOutput:
    """One request as a client saw it; times are seconds on the run's clock."""

    request_id: int | str
    send_time: float
    max_tokens: int
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    chunk_times: list[float] = field(default_factory=list)  # chunks that carried content
    finish_time: float | None = None  # when the request was over: stream closed, failed or timed out
    finish_reason: str = ""  # length | stop | error | abort
    error: str | None = None
    text_digest: str = ""

    @property
    def succeeded(self) -> bool:
        return self.finish_reason in ("length", "stop")


def _floats(values) -> np.ndarray:
    """A float column; None becomes nan (unknown)."""
    return np.array(values, dtype=float)


@dataclass
class RequestRecords:
    """Every request of a run, in columns; ``chunk_times[chunk_offsets[i]:chunk_offsets[i + 1]]``
    are request ``i``'s. Unknown times are nan; unknown counts None."""

    request_id: list
    arrival_time: np.ndarray  # when the request arrived at the engine, or was sent over HTTP
    first_scheduled_time: np.ndarray
    finish_time: np.ndarray
    chunk_times: np.ndarray
    chunk_offsets: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    max_tokens: np.ndarray
    cached_tokens: list
    num_preemptions: list
    finish_reason: list[str]
    error: list[str]
    succeeded: np.ndarray
    output_digest: list[str]
    text_digest: list[str]

    def __len__(self) -> int:
        return len(self.request_id)

    @classmethod
    def from_requests(cls, requests: Sequence[Request]) -> RequestRecords:
        """The engine's requests, finished or not."""
        n = len(requests)

        def column(name: str) -> list:
            return list(map(attrgetter(name), requests))

        times = column("token_times")
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(list(map(len, times)), out=offsets[1:])
        reasons = column("finish_reason")
        return cls(
            request_id=column("request_id"),
            arrival_time=_floats(column("arrival_time")),
            first_scheduled_time=_floats(column("first_scheduled_time")),
            finish_time=_floats(column("finish_time")),
            chunk_times=np.fromiter(chain.from_iterable(times), float, int(offsets[-1])),
            chunk_offsets=offsets,
            prompt_tokens=np.array(column("num_prompt_tokens"), np.int64),
            output_tokens=np.array(column("num_output_tokens"), np.int64),
            max_tokens=np.array(column("max_tokens"), np.int64),
            cached_tokens=column("num_cached_tokens"),
            num_preemptions=column("num_preemptions"),
            finish_reason=list(map(_REASON_TEXT.__getitem__, reasons)),
            error=[e or "" for e in column("error")],
            succeeded=np.array(list(map(_SUCCEEDED.__contains__, reasons)), bool),
            # one output at a time: 20,000 live copies would wake the garbage collector
            output_digest=[token_digest(r.token_ids[r.num_prompt_tokens :]) for r in requests],
            text_digest=[""] * n,
        )

    @classmethod
    def from_outputs(cls, outputs: Sequence[RequestOutput]) -> RequestRecords:
        """The load generator's outputs; what a client cannot know (queueing, prefix hits,
        preemptions, token ids) stays unknown."""
        n = len(outputs)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum([len(o.chunk_times) for o in outputs], out=offsets[1:])
        return cls(
            request_id=[o.request_id for o in outputs],
            arrival_time=_floats([o.send_time for o in outputs]),
            first_scheduled_time=np.full(n, np.nan),
            finish_time=_floats([o.finish_time for o in outputs]),
            chunk_times=_floats(list(chain.from_iterable(o.chunk_times for o in outputs))),
            chunk_offsets=offsets,
            prompt_tokens=np.array([o.num_prompt_tokens for o in outputs], np.int64),
            output_tokens=np.array([o.num_output_tokens for o in outputs], np.int64),
            max_tokens=np.array([o.max_tokens for o in outputs], np.int64),
            cached_tokens=[None] * n,
            num_preemptions=[None] * n,
            finish_reason=[o.finish_reason for o in outputs],
            error=[o.error or "" for o in outputs],
            succeeded=np.array([o.succeeded for o in outputs], bool),
            output_digest=[""] * n,
            text_digest=[o.text_digest for o in outputs],
        )

    @property
    def num_chunks(self) -> np.ndarray:
        return np.diff(self.chunk_offsets)

    def _chunk_at(self, index: np.ndarray) -> np.ndarray:
        """``chunk_times[index]`` where the request has chunks, else nan."""
        has = self.num_chunks > 0
        out = np.full(len(self), np.nan)
        out[has] = self.chunk_times[index[has]]
        return out

    @property
    def first_chunk_time(self) -> np.ndarray:
        return self._chunk_at(self.chunk_offsets[:-1])

    @property
    def last_chunk_time(self) -> np.ndarray:
        """When the last content arrived: where E2EL ends (not when the stream closed)."""
        return self._chunk_at(self.chunk_offsets[1:] - 1)

    def chunk_gaps(self, selected: np.ndarray) -> np.ndarray:
        """Seconds between consecutive chunks of each selected request, pooled in request order."""
        counts = self.num_chunks
        in_selected = np.repeat(selected, counts)
        first = np.zeros(len(self.chunk_times), bool)
        first[self.chunk_offsets[:-1][counts > 0]] = True
        keep = in_selected[1:] & ~first[1:]
        return np.diff(self.chunk_times)[keep]

    def chunk_times_of(self, selected: np.ndarray) -> np.ndarray:
        return self.chunk_times[np.repeat(selected, self.num_chunks)]
