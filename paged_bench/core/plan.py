"""What passes between scheduler, backend and engine in one step: the plan and its output.

The plan is frozen and self-contained, as vLLM v1's ``SchedulerOutput``: a backend, a
tensor-parallel rank or a simulated replica consumes it without reaching into the scheduler
or touching a live ``Request``. It is compact enough to broadcast every step:

- every scheduled request is a row of three parallel columns (``req_ids``,
  ``num_computed_tokens``: where its new tokens start, ``num_new_tokens``);
- a request the backend has not seen since it last held KV (first admission, or back after
  a preemption) also comes once as a ``NewRequestData``: its tokens, whole block table and
  sampling parameters. A request scheduled again carries no tokens: the backend appends the
  token it sampled itself, and learns of blocks added to its table through
  ``new_block_ids``;
- ``finished_req_ids`` and ``preempted_req_ids`` tell a backend which per-request state
  to drop.

A row samples a token when its chunk reaches the end of the request's tokens; the rows
whose chunk stops short (a chunked prefill) are listed in ``partial_rows``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple

from mypy_extensions import mypyc_attr

if TYPE_CHECKING:
    from paged_bench.core.request import Request

ReqId = int | str
_tuple_new: Final = tuple.__new__


class SamplingParams(NamedTuple):
    """How a request's tokens are drawn and when it stops (greedy when temperature == 0)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 1  # output tokens at most (after the scheduler's max_model_len cap)
    ignore_eos: bool = True


class NewRequestData(NamedTuple):
    """Everything a backend needs to start (or restart) a request; sent once. A named tuple, as
    the plan: immutable and picklable."""

    req_id: ReqId
    token_ids: tuple[int, ...]  # every token known now: the prompt, then any generated before a
    # preemption; () for a backend that reads no tokens (``Backend.reads_token_ids``: the sim)
    num_prompt_tokens: int
    block_ids: tuple[int, ...]  # the whole block table
    num_computed_tokens: int  # already in the cache (a prefix hit, or swapped back in)
    sampling: SamplingParams

    @classmethod
    def from_request(cls, req: Request, block_ids: Iterable[int], with_tokens: bool = True) -> NewRequestData:
        sampling = new_sampling_params(
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.sampling_seed,
            max_tokens=req.max_num_tokens - req.num_prompt_tokens,
            ignore_eos=req.ignore_eos,
        )
        return new_request_data(
            req_id=req.request_id,
            token_ids=tuple(req.token_ids) if with_tokens else (),
            num_prompt_tokens=req.num_prompt_tokens,
            block_ids=tuple(block_ids),
            num_computed_tokens=req.num_computed_tokens,
            sampling=sampling,
        )


class ScheduledRow(NamedTuple):
    """One scheduled request, read from the plan's columns."""

    req_id: ReqId
    num_computed_tokens: int  # where its new tokens start
    num_new_tokens: int
    samples: bool  # its chunk reaches the end of its tokens, so a token is sampled


class StepPlan(NamedTuple):
    """The scheduler's decision for one step (immutable: a named tuple). Swap copies (block
    pairs) are done before the step computes anything: swap-outs first, then swap-ins."""

    req_ids: tuple[ReqId, ...] = ()
    num_computed_tokens: tuple[int, ...] = ()
    num_new_tokens: tuple[int, ...] = ()
    new_reqs: tuple[NewRequestData, ...] = ()
    new_block_ids: dict[ReqId, tuple[int, ...]] = {}  # noqa: RUF012 - blocks appended to a table; never mutated
    partial_rows: frozenset[int] = frozenset()  # rows that sample nothing (their chunk stops short)
    num_decode_tokens: int = 0  # rows computing one generated token and sampling the next
    swap_out: tuple[tuple[int, int], ...] = ()  # (gpu block, cpu block)
    swap_in: tuple[tuple[int, int], ...] = ()  # (cpu block, gpu block)
    preempted_req_ids: tuple[ReqId, ...] = ()
    finished_req_ids: tuple[ReqId, ...] = ()  # ended since the previous plan: their state may go
    # 0: the scheduler planned this step (its CPU work is paid); k >= 1: the k-th step of a
    # multi-step window (scheduler.num_scheduler_steps), run on without the scheduler
    window_step: int = 0
    # a window's requests that ended inside it -> their K/V length: vLLM 0.6 runs the window's
    # whole batch to its last step and drops what these rows sample, so the simulator prices
    # them (``as_computed``); a real backend computes only the rows above
    idle_rows: dict[ReqId, int] = {}  # noqa: RUF012 - never mutated

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def num_prefill_tokens(self) -> int:
        """Every scheduled token that is not a decode: prompt chunks and recomputation."""
        return self.num_scheduled_tokens - self.num_decode_tokens

    @property
    def num_preempted(self) -> int:
        return len(self.preempted_req_ids)

    @property
    def is_empty(self) -> bool:
        return not (self.req_ids or self.idle_rows or self.swap_in or self.swap_out)

    def as_computed(self) -> StepPlan:
        """The step as vLLM 0.6's GPU computes it: the idle rows as decodes of their own."""
        idle = self.idle_rows
        if not idle:
            return self
        return self._replace(req_ids=self.req_ids + tuple(idle), num_computed_tokens=self.num_computed_tokens
                             + tuple(idle.values()), num_new_tokens=self.num_new_tokens + (1,) * len(idle),
                             num_decode_tokens=self.num_decode_tokens + len(idle), idle_rows={})  # fmt: skip

    @classmethod
    def starting(cls, rows: Iterable[tuple[NewRequestData, int]]) -> StepPlan:
        """A plan that (re)starts each request and computes ``n`` tokens from its
        ``num_computed_tokens``: for calibration and tests that drive a backend directly."""
        rows = list(rows)
        news = tuple(new for new, _ in rows)
        nums = tuple(n for _, n in rows)
        starts = tuple(new.num_computed_tokens for new in news)
        partial = frozenset(i for i, (new, n) in enumerate(rows) if new.num_computed_tokens + n < len(new.token_ids))
        decodes = sum(n == 1 and s >= new.num_prompt_tokens for new, s, n in zip(news, starts, nums))
        return cls(req_ids=tuple(new.req_id for new in news), num_computed_tokens=starts, num_new_tokens=nums,
                   new_reqs=news, partial_rows=partial, num_decode_tokens=decodes)  # fmt: skip

    def rows(self) -> Iterator[ScheduledRow]:
        partial = self.partial_rows
        for i, (rid, start, n) in enumerate(zip(self.req_ids, self.num_computed_tokens, self.num_new_tokens)):
            yield ScheduledRow(rid, start, n, i not in partial)


# The scheduler builds a plan every step and a NewRequestData at every admission. A named
# tuple's own constructor is Python code, slow to call by keyword from compiled code (which
# builds a dict of the arguments for it to parse); these build the same tuples in C, their
# fields taken by name (docs/engine.md, Speed, has what this saves).


def new_sampling_params(*, temperature: float, top_p: float, seed: int | None, max_tokens: int,
                        ignore_eos: bool) -> SamplingParams:  # fmt: skip
    return _tuple_new(SamplingParams, (temperature, top_p, seed, max_tokens, ignore_eos))


def new_request_data(*, req_id: ReqId, token_ids: tuple[int, ...], num_prompt_tokens: int, block_ids: tuple[int, ...],
                     num_computed_tokens: int, sampling: SamplingParams) -> NewRequestData:  # fmt: skip
    return _tuple_new(NewRequestData, (req_id, token_ids, num_prompt_tokens, block_ids, num_computed_tokens, sampling))


def new_step_plan(
    *,
    req_ids: tuple[ReqId, ...],
    num_computed_tokens: tuple[int, ...],
    num_new_tokens: tuple[int, ...],
    new_reqs: tuple[NewRequestData, ...],
    new_block_ids: dict[ReqId, tuple[int, ...]],
    partial_rows: frozenset[int],
    num_decode_tokens: int,
    swap_out: tuple[tuple[int, int], ...],
    swap_in: tuple[tuple[int, int], ...],
    preempted_req_ids: tuple[ReqId, ...],
    finished_req_ids: tuple[ReqId, ...],
    window_step: int = 0,
    idle_rows: dict[ReqId, int],
) -> StepPlan:
    return _tuple_new(StepPlan, (
        req_ids, num_computed_tokens, num_new_tokens, new_reqs, new_block_ids, partial_rows, num_decode_tokens,
        swap_out, swap_in, preempted_req_ids, finished_req_ids, window_step, idle_rows,
    ))  # fmt: skip


@mypyc_attr(native_class=False)  # a plugin's answer, checked by the engine (compiled, a wrong type fails in the plugin)
@dataclass(slots=True)
class StepOutput:
    """What a backend returns: one sampled token per scheduled row (ignored for a row in
    ``partial_rows``), and, for a virtual-time backend, how long the step takes in seconds."""

    token_ids: list[int]
    duration: float = 0.0
