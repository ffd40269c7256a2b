"""Log-probabilities for the requests that ask for them (the server's ``logprobs``,
``top_logprobs`` and ``echo``), computed by the real backends from the step's logits.

The step plan carries no live requests, so a request that wants log-probabilities registers a
``LogprobSink`` with the backend under its request id (the server's engine loop does this on
the engine thread, and drops it when the request ends). For each token sampled for that
request, the backend appends its log-probability and the ``num_logprobs`` most likely tokens';
with ``want_prompt``, also every prompt token's after the first (what ``echo`` with
``logprobs`` returns, and how lm-eval-harness scores log-likelihoods). Log-probabilities are
of the model's distribution before temperature and top-p, as vLLM returns by default (its
``logprobs_mode=raw_logprobs``).

Prompt positions are only computed when their K/V is: a request that wants prompt
log-probabilities must not be served from the prefix cache (the paged allocator skips the
lookup for a request whose ``want_prompt_logprobs`` is set, as vLLM v1 does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paged_bench.core.plan import ReqId, StepPlan
from paged_bench.core.request import Request


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the most likely (token id, logprob), best first


@dataclass(slots=True)
class LogprobSink:
    """Where the backend writes one request's log-probabilities."""

    num_logprobs: int = 0  # top entries per token besides the chosen one
    want_prompt: bool = False
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # prompt tokens 1..P-1

    def record_sampled(self, logits_row: np.ndarray, token_id: int) -> None:
        self.logprobs.append(token_logprob(log_softmax(logits_row[None, :])[0], token_id, self.num_logprobs))

    def record_prompt(self, start: int, logits_rows: np.ndarray, targets: list[int]) -> None:
        """Logits of positions ``start, start+1, ...`` predict ``targets`` (prompt tokens
        ``start+1, ...``); positions already recorded (a recompute after preemption) are skipped."""
        logp = log_softmax(logits_rows)
        for i, (row, target) in enumerate(zip(logp, targets)):
            if len(self.prompt_logprobs) == start + i:
                self.prompt_logprobs.append(token_logprob(row, target, self.num_logprobs))


@dataclass(eq=False)  # no slots: they would shadow the compiled base's fields (paged_bench.native.guard)
class LogprobsRequest(Request):
    """A ``Request`` that wants log-probabilities: its sink (whether to score its prompt is
    ``Request.want_prompt_logprobs``, read by the paged allocator)."""

    sink: LogprobSink = field(default_factory=LogprobSink)

    @property
    def logprobs(self) -> list[TokenLogprob]:
        return self.sink.logprobs

    @property
    def prompt_logprobs(self) -> list[TokenLogprob]:
        return self.sink.prompt_logprobs


def log_softmax(rows: np.ndarray) -> np.ndarray:
    z = rows.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def token_logprob(logp: np.ndarray, token_id: int, k: int) -> TokenLogprob:
    """One position's entry from its log-softmax row."""
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        best = np.argpartition(-logp, min(k, len(logp) - 1))[:k]
        best = best[np.argsort(-logp[best], kind="stable")]
        top = tuple((int(t), float(logp[t])) for t in best)
    return TokenLogprob(int(token_id), float(logp[token_id]), top)


@dataclass(frozen=True)
class PromptSpan:
    index: int  # the request's row in the plan
    start: int  # its first prompt position whose logits are extra rows
    first_row: int  # where those rows start in the step's logits
    targets: list[int]  # the prompt tokens they predict


@dataclass(frozen=True)
class PromptRows:
    """The extra rows of a step's logits that hold prompt positions to score (after the one
    sampling row per request)."""

    spans: tuple[PromptSpan, ...]


class LogprobSinks:
    """The backend's registry: request id -> sink."""

    def __init__(self) -> None:
        self.by_id: dict[ReqId, LogprobSink] = {}

    def extend_batch(self, batch: Any, plan: StepPlan, states: list[Any]) -> PromptRows | None:
        """None when no request of the step wants log-probabilities (the common case: nothing
        changes); else adds the prompt rows to ``batch.sample_rows`` so that the forward
        computes their logits too. Position ``p`` predicts token ``p + 1``: a chunk of
        positions ``[start, start + n)`` scores prompt tokens up to ``num_prompt_tokens - 1``."""
        by_id = self.by_id
        if not by_id or not any(rid in by_id for rid in plan.req_ids):
            return None
        spans, extra, offset = [], [], 0
        rows = zip(plan.req_ids, states, plan.num_computed_tokens, plan.num_new_tokens)
        for i, (rid, state, start, n) in enumerate(rows):
            sink, end = by_id.get(rid), min(start + n, state.num_prompt_tokens - 1)
            if sink is not None and sink.want_prompt and end > start:
                spans.append(PromptSpan(i, start, plan.num_reqs + len(extra), state.token_ids[start + 1 : end + 1]))
                extra.extend(range(offset, offset + end - start))
            offset += n
        if extra:
            batch.sample_rows = np.concatenate([batch.sample_rows, np.asarray(extra, np.int64)])
        return PromptRows(tuple(spans))

    def record(self, plan: StepPlan, rows: np.ndarray, tokens: list[int], prompt_rows: PromptRows) -> None:
        """After sampling: each sink's sampled token (for a row that samples) and its prompt
        positions computed in this step."""
        for i, rid in enumerate(plan.req_ids):
            sink = self.by_id.get(rid)
            if sink is not None and i not in plan.partial_rows:
                sink.record_sampled(rows[i], tokens[i])
        for span in prompt_rows.spans:
            rows_of_span = rows[span.first_row : span.first_row + len(span.targets)]
            self.by_id[plan.req_ids[span.index]].record_prompt(span.start, rows_of_span, span.targets)
