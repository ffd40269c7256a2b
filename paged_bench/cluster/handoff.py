"""Disaggregated prefill -> decode: the prefill-side copy of a request, and handing its first
token and K/V over to a decode replica (as Splitwise and DistServe do).

The prefill replica runs a copy of the request that stops after its first token (the
prompt's prefill samples it). The original then takes that token and its time, and, unless
it is already done, moves to a decode replica: its prompt's K/V (``kv_bytes_per_token`` x
prompt tokens) crosses the link, and the decode replica admits it with the prompt computed,
so its first decode step computes one token. The prefill copy frees its blocks when its
token is sampled (they stay in that replica's prefix cache); the transfer is not charged
against the prefill pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from paged_bench.core.request import FinishReason, Request, check_stop


@dataclass(frozen=True, slots=True)
class Transfer:
    """One request's prompt K/V moving from a prefill replica to a decode replica."""

    request: Request
    source: int  # replica indices in the cluster
    target: int
    num_bytes: int
    ready: float  # when the first token was sampled
    done: float  # when the last byte has arrived

    @property
    def seconds(self) -> float:
        """From the first token to the K/V in place: queueing for the wire + latency + bytes."""
        return self.done - self.ready


def prefill_copy(req: Request) -> Request:
    """The request as its prefill replica runs it: the same prompt, one output token."""
    return Request(
        request_id=req.request_id,
        arrival_time=req.arrival_time,
        token_ids=req.token_ids[:],  # a copy: the prefill replica appends its token
        max_tokens=1,
        ignore_eos=req.ignore_eos,
        prefix_group=req.prefix_group,
        temperature=req.temperature,
        top_p=req.top_p,
        sampling_seed=req.sampling_seed,
    )


def take_prefill(req: Request, copy: Request, max_model_len: int, end_token_ids: frozenset[int]) -> bool:
    """Give ``req`` what its prefill copy did; True if it goes on to a decode replica."""
    req.first_scheduled_time = copy.first_scheduled_time
    req.num_cached_tokens = copy.num_cached_tokens
    req.num_preemptions += copy.num_preemptions
    if not copy.token_times:  # rejected, or the run stopped before its prefill finished
        req.finish(copy.finish_reason or FinishReason.ERROR, copy.finish_time or 0.0, copy.error)
        return False
    now = copy.token_times[0]
    req.append_token(copy.token_ids[-1], now)
    req.cap_length(max_model_len)
    reason = check_stop(req, end_token_ids)  # the stop rule the decode replica's scheduler would apply
    if reason is not None:
        req.finish(reason, now)
    return reason is None
