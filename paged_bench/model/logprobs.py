"""Log-probabilities for the requests that ask for them (the server's ``logprobs``,
``top_logprobs`` and ``echo``), computed by the real backends from the step's logits.

A ``LogprobsRequest`` is a ``Request`` that also wants, for each generated token, its
log-probability and the ``num_logprobs`` most likely tokens' (``logprobs`` is appended to as
tokens are sampled), and optionally the same for every prompt token after the first
(``prompt_logprobs``: what ``echo`` with ``logprobs`` returns, and how lm-eval-harness scores
log-likelihoods). Log-probabilities are of the model's distribution before temperature and
top-p, as vLLM returns by default (its ``logprobs_mode=raw_logprobs``).

Prompt positions are only computed when their K/V is: a request that wants prompt
log-probabilities must not be served from the prefix cache (the paged allocator skips the
lookup for it, as vLLM v1 does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paged_bench.request import Request
from paged_bench.step import StepPlan


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the most likely (token id, logprob), best first


@dataclass(eq=False, slots=True)
class LogprobsRequest(Request):
    num_logprobs: int = 0  # top entries per token besides the chosen one
    want_prompt_logprobs: bool = False
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # prompt tokens 1..P-1


def wants_logprobs(req: Request) -> bool:
    return isinstance(req, LogprobsRequest)


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


def record_sampled(req: LogprobsRequest, logits_row: np.ndarray, token_id: int) -> None:
    """Note the log-probability of the token just sampled for ``req``."""
    req.logprobs.append(token_logprob(log_softmax(logits_row[None, :])[0], token_id, req.num_logprobs))


def record_prompt(req: LogprobsRequest, start: int, logits_rows: np.ndarray) -> None:
    """Logits of positions ``start, start+1, ...`` predict prompt tokens ``start+1, ...``."""
    logp = log_softmax(logits_rows)
    for i, row in enumerate(logp):
        target = start + i + 1
        if target < req.num_prompt_tokens and len(req.prompt_logprobs) == target - 1:
            req.prompt_logprobs.append(token_logprob(row, req.token_ids[target], req.num_logprobs))


@dataclass(frozen=True)
class PromptSpan:
    index: int  # the request's place in the plan
    start: int  # its first prompt position whose logits are extra rows
    first_row: int  # where those rows start in the step's logits


@dataclass(frozen=True)
class PromptRows:
    """Which extra rows of a step's logits hold the prompt positions that requests wanting
    prompt log-probabilities computed in this step (after the one sampling row per request)."""

    spans: tuple[PromptSpan, ...]

    @classmethod
    def extend(cls, batch: Any, plan: StepPlan) -> PromptRows | None:
        """None when no request of the step wants log-probabilities (the common case: nothing
        changes); else adds the prompt rows to ``batch.sample_rows`` so the forward computes
        their logits too. Position ``p`` predicts token ``p + 1``: a chunk of positions
        ``[start, start + n)`` scores prompt tokens up to ``num_prompt_tokens - 1``."""
        if not any(isinstance(r, LogprobsRequest) for r in plan.reqs):
            return None
        spans, extra, offset, num_reqs = [], [], 0, len(plan.reqs)
        for i, (req, n) in enumerate(zip(plan.reqs, plan.num_new_tokens)):
            start = req.num_computed_tokens
            end = min(start + n, req.num_prompt_tokens - 1)
            if isinstance(req, LogprobsRequest) and req.want_prompt_logprobs and end > start:
                spans.append(PromptSpan(i, start, num_reqs + len(extra)))
                extra.extend(range(offset, offset + end - start))
            offset += n
        if extra:
            batch.sample_rows = np.concatenate([batch.sample_rows, np.asarray(extra, np.int64)])
        return cls(tuple(spans))


def record_logprobs(plan: StepPlan, rows: np.ndarray, tokens: list[int], prompt_rows: PromptRows) -> None:
    """After sampling: each logprobs request's sampled token (when this step samples for it)
    and its prompt positions computed in this step."""
    for i, (req, n) in enumerate(zip(plan.reqs, plan.num_new_tokens)):
        if isinstance(req, LogprobsRequest) and req.num_computed_tokens + n == req.num_tokens:
            record_sampled(req, rows[i], tokens[i])
    for span in prompt_rows.spans:
        req = plan.reqs[span.index]
        count = min(span.start + plan.num_new_tokens[span.index], req.num_prompt_tokens - 1) - span.start
        record_prompt(req, span.start, rows[span.first_row : span.first_row + count])
