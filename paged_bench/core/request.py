"""A request's lifecycle: its tokens, how far the engine has computed them, and its timestamps.

Follows vLLM v1's request model: ``token_ids`` holds the prompt followed by every generated
token, and ``num_computed_tokens`` (tokens whose K/V is in the cache) catches up to
``num_tokens``. Prefill, chunked prefill, decode and resumption after a recompute-preemption
are therefore one mechanism: schedule ``num_tokens - num_computed_tokens`` more tokens.

Its state changes only through its own methods (the scheduler advances
``num_computed_tokens`` as steps compute, as vLLM's does)::

    WAITING --admit--> RUNNING --append_token; check_stop says why--> finish --> FINISHED
                        |    ^
                 preempt|    |admit
                        v    |
             PREEMPTED (K/V lost) or SWAPPED (K/V in swap space)

``finish`` also ends a request in any other state (rejected at the door, aborted, a run
stopped). ``check_stop`` is the one stop rule: the scheduler applies it to every sampled
token, and a cluster to the token a prefill replica hands over.

``token_ids`` is an ``array('Q')``: indexed, sliced, appended to and measured as a list is,
8 bytes a token instead of a list's pointer plus an int object, and cut from a workload's
draw in one copy (``workloads.base.random_prompts``). Unsigned, as token ids (vocabulary
indices) are: appending to it is cheaper than to a signed ``array('q')``, whose setter parses
each value with ``PyArg_Parse``, and the engine appends a token to every running request every
step. It compares equal only to another array: compare ``list(req.token_ids)`` with a list.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import SupportsIndex

import numpy as np
from mypy_extensions import mypyc_attr


def token_array(token_ids: Iterable[int] | np.ndarray) -> array:
    """Token ids as the ``array('Q')`` a request holds (a numpy prompt in one copy)."""
    if isinstance(token_ids, np.ndarray):
        if token_ids.size and token_ids.min() < 0:  # a signed array's would wrap round silently
            raise ValueError(_negative(token_ids.min()))
        return array("Q", token_ids.astype(np.uint64, copy=False).tobytes())
    try:
        return array("Q", token_ids)
    except OverflowError:  # a negative id (or one past 2**64)
        raise ValueError(_negative(min(token_ids))) from None


def _negative(token: object) -> str:
    return f"token id {token} is not a vocabulary index: token ids are integers from 0"


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # arrived, holds no KV
    RUNNING = "running"  # holds KV blocks, scheduled every step
    PREEMPTED = "preempted"  # lost its KV (recompute); waits to be re-prefilled
    SWAPPED = "swapped"  # its KV sits in CPU swap space; waits to be swapped back in
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    LENGTH = "length"  # reached max_tokens or max_model_len
    STOP = "stop"  # sampled EOS or matched a stop string
    ABORT = "abort"  # the client went away
    REJECTED = "rejected"  # can never run here (prompt too long, larger than the pool)
    ERROR = "error"  # the run stopped before this request could finish

    @property
    def succeeded(self) -> bool:
        return self in (FinishReason.LENGTH, FinishReason.STOP)


@mypyc_attr(allow_interpreted_subclasses=True)  # the server's LogprobsRequest subclasses it
@dataclass(eq=False, init=False, slots=True)  # __init__ written out: compiled; a dataclass's generated one runs interpreted
class Request:
    """One request. Timestamps are seconds on the engine's clock (virtual or wall)."""

    request_id: int | str
    arrival_time: float
    token_ids: array  # array('Q'); any sequence of ints, or a numpy array, is converted
    max_tokens: int
    ignore_eos: bool = True
    prefix_group: int | None = None
    # sampling knobs read by real backends (greedy when temperature == 0)
    temperature: float = 0.0
    top_p: float = 1.0
    sampling_seed: int | None = None
    want_prompt_logprobs: bool = False  # score the prompt: every position is computed, no prefix cache hit

    num_prompt_tokens: int = field(init=False)
    max_num_tokens: int = field(init=False)  # stops for length here (``cap_length``: an engine's max_model_len)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens already in the cache at its first admission

    def __init__(
        self,
        request_id: int | str,
        arrival_time: float,
        token_ids: array | Iterable[int] | np.ndarray,
        max_tokens: int,
        ignore_eos: bool = True,
        prefix_group: int | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        sampling_seed: int | None = None,
        want_prompt_logprobs: bool = False,
    ) -> None:
        self.request_id = request_id
        self.arrival_time = arrival_time
        self.token_ids = token_ids  # type: ignore[assignment]  # made an array by _take_prompt
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos
        self.prefix_group = prefix_group
        self.temperature = temperature
        self.top_p = top_p
        self.sampling_seed = sampling_seed
        self.want_prompt_logprobs = want_prompt_logprobs
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.first_scheduled_time = None
        self.token_times = []
        self.finish_time = None
        self.finish_reason = None
        self.error = None
        self.num_preemptions = 0
        self.num_cached_tokens = 0
        _take_prompt(self)

    def __post_init__(self) -> None:  # a dataclass subclass's generated __init__ calls it
        _take_prompt(self)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens].tolist()

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :].tolist()

    @property
    def first_token_time(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def cap_length(self, max_model_len: int) -> None:
        """Stop for length at ``max_model_len`` tokens if that comes before ``max_tokens``
        output tokens: an engine's limit, as vLLM caps ``max_tokens`` by the model's length."""
        self.max_num_tokens = min(self.max_num_tokens, max_model_len)

    def admit(self, num_computed_tokens: int, now: float) -> None:
        """Scheduled to run, its first ``num_computed_tokens`` tokens' K/V in the cache already
        (a prefix hit, K/V swapped back in or handed over by another replica)."""
        self.status = RequestStatus.RUNNING
        self.num_computed_tokens = num_computed_tokens
        if self.first_scheduled_time is None:  # its first admission: what the prefix cache served
            self.first_scheduled_time = now
            self.num_cached_tokens = num_computed_tokens

    def preempt(self, swapped: bool) -> None:
        """Taken off the GPU: its K/V copied to swap space (``swapped``), or lost, to be
        recomputed from its tokens (which it keeps, generated ones included)."""
        self.num_preemptions += 1
        if swapped:
            self.status = RequestStatus.SWAPPED
        else:
            self.status = RequestStatus.PREEMPTED
            self.num_computed_tokens = 0

    def append_token(self, token: SupportsIndex, now: float) -> None:
        """A token sampled for it at ``now`` (any integer type: numpy's too)."""
        self.token_ids.append(token)
        self.token_times.append(now)

    def finish(self, reason: FinishReason, now: float, error: str | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.finish_time = now
        self.error = error


def check_stop(req: Request, end_token_ids: frozenset[int]) -> FinishReason | None:
    """Why ``req`` stops after its latest token, or None: EOS (or another end token) unless it
    ignores EOS, then its length, in vLLM v1's ``check_stop`` order (since PR #27555; before it,
    length first): an EOS that is also the last token allowed is a stop."""
    if not req.ignore_eos and req.token_ids[-1] in end_token_ids:
        return FinishReason.STOP
    if len(req.token_ids) >= req.max_num_tokens:
        return FinishReason.LENGTH
    return None


def _take_prompt(req: Request) -> None:
    """Hold the token ids given as the prompt in an ``array('Q')``, and count them. (A function,
    shared by ``Request.__init__`` and the ``__post_init__`` a dataclass subclass's generated
    ``__init__`` calls instead.)"""
    if req.token_ids.__class__ is not array or req.token_ids.typecode != "Q":
        req.token_ids = token_array(req.token_ids)
    req.num_prompt_tokens = len(req.token_ids)
    req.max_num_tokens = req.num_prompt_tokens + req.max_tokens
