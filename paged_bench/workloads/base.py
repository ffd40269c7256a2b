"""The workload protocol, and the synthetic workload every arrival process builds on.

A workload turns its config and a seed into a list of timed requests, sorted by arrival.
A synthetic workload draws, from independent random streams (so that changing one knob
does not reshuffle the others): inter-arrival gaps (the subclass's arrival process),
prompt and output lengths (``lengths``), prompt tokens, and optionally which of K shared
system prompts each request starts with, to exercise prefix caching.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from paged_bench.core.clock import HORIZON_S
from paged_bench.core.request import Request
from paged_bench.errors import MAX_TOKENS, ConfigError, check, check_choice, check_int, check_number
from paged_bench.run.memory import check_requests_fit
from paged_bench.workloads.lengths import ShareGPT, length_dist
from paged_bench.workloads.schedule import SCHEDULES, first_at_zero, vllm_arrivals
from paged_bench.workloads.sharegpt import sharegpt_sample


@dataclass(frozen=True)
class WorkloadContext:
    """What a workload may need from the engine it feeds."""

    vocab_size: int
    encode: Callable[[str], list[int]]  # text -> token ids, for workloads that carry text
    # where the requests go: engine (in process), openai (a server, measured as vllm bench serve
    # measures it: workload.schedule=auto is then vLLM's, so the same knobs offer the same load)
    # or served (our server with this config, compared with the same run in-process: ours)
    target: str = "engine"


class Workload(ABC):
    name: ClassVar[str] = ""
    # closed loop: at most this many requests in flight, the next sent as one ends (None: open loop)
    max_concurrency: int | None = None

    @abstractmethod
    def requests(self, ctx: WorkloadContext) -> list[Request]:
        """Every request of the run, each due at its ``arrival_time`` (seconds from the start);
        in any order: the engine sends them by arrival time."""


def check_max_concurrency(value: Any) -> int | None:
    return None if value is None else check_int("workload.max_concurrency", value)


def check_shared_prefix(spec: Mapping[str, Any] | None, num_requests: int) -> tuple[int, int]:
    """(num_prefixes, length) of ``workload.shared_prefix``: both set or both 0 (one alone was
    ignored), and no more prefixes than requests (each is drawn, used or not: 1e9 of them hung)."""
    key = "workload.shared_prefix"
    check(spec is None or isinstance(spec, Mapping), key, spec, "a mapping with num_prefixes and length, or null")
    prefix = dict(spec or {})
    count = prefix.get("num_prefixes", 0)
    check_int(f"{key}.num_prefixes", count, 0)
    check(count <= num_requests, f"{key}.num_prefixes", count,
          f"at most workload.num_requests ({num_requests:,}) prefixes: more are drawn and never sent")  # fmt: skip
    length = check_int(f"{key}.length", prefix.get("length", 0), 0, MAX_TOKENS)
    if bool(count) != bool(length):
        missing, given = ("length", f"num_prefixes={count}") if count else ("num_prefixes", f"length={length}")
        raise ConfigError(f"{key}.{missing}", prefix.get(missing, 0),
                          f"an integer >= 1 when {key}.{given} is set (or both 0: no shared prefix)")  # fmt: skip
    return count, length


# ids drawn per numpy call: 64 KiB, under glibc's mmap threshold, so each draw reuses the memory
# of the last (2 MiB draws were mapped and page-faulted in afresh, 18 MB for 20,000 prompts)
_DRAW_TOKENS = 1 << 13


def random_prompts(rng: np.random.Generator, lengths: np.ndarray, vocab_size: int) -> list[array]:
    """One prompt of random token ids per length: the same ids as one ``rng.integers`` call per
    prompt (numpy's stream does not depend on how draws are split), drawn many prompts at a
    time, each copied from the draw's bytes into the ``array('Q')`` a ``Request`` holds as it is
    (the ids are never negative, so their int64 bytes are their uint64 bytes). Drawn in batches: the
    whole Azure trace's 22M ids at once were 176 MB held beside their copies."""
    prompts: list[array] = []
    sizes = lengths.tolist()
    start = 0
    while start < len(sizes):
        stop, total = start + 1, sizes[start]
        while stop < len(sizes) and total + sizes[stop] <= _DRAW_TOKENS:
            total += sizes[stop]
            stop += 1
        drawn = memoryview(rng.integers(0, vocab_size, total)).cast("B")
        at = 0
        for n in sizes[start:stop]:
            prompt = array("Q")
            prompt.frombytes(drawn[at : at + 8 * n])  # one copy, straight from the draw
            prompts.append(prompt)
            at += 8 * n
        start = stop
    return prompts


class SyntheticWorkload(Workload):
    """``num_requests`` requests at ``rate`` per second; subclasses give the gaps' shape, and
    ``schedule`` where the gaps put the requests (``workloads.schedule``): ``first_at_zero``,
    ``vllm`` (vllm bench serve's), or ``auto``: vLLM's with target=openai, else ours."""

    # the gamma shape of the gaps, as vLLM's --burstiness (1: Poisson, inf: even), which the
    # vllm schedule draws as vLLM does; None: some other process, whose own gaps it lays out
    burstiness: float | None = None

    def __init__(
        self,
        *,
        num_requests: int,
        rate: float,
        prompt_len: Mapping[str, Any] | int,
        output_len: Mapping[str, Any] | int,
        shared_prefix: Mapping[str, Any] | None = None,
        max_concurrency: int | None = None,
        seed: int = 0,
        schedule: str = "auto",
    ) -> None:
        self.num_requests = check_int("workload.num_requests", num_requests)
        self.rate = check_number("workload.rate", rate, 0, strict=True, finite=False)
        check(self.num_requests / self.rate < HORIZON_S, "workload.rate", rate,
              f"a rate at which {self.num_requests:,} requests arrive within the clock's {HORIZON_S:.0e} s: "
              f"above {self.num_requests / HORIZON_S:.3g}")  # fmt: skip
        self.prompt_len = length_dist("workload.prompt_len", prompt_len)
        self.prompt_spec = prompt_len if isinstance(prompt_len, int) else dict(prompt_len)  # as configured
        self.output_len = length_dist("workload.output_len", output_len)
        # ShareGPT's lengths are pairs (a conversation's prompt and completion): both or neither
        self.sharegpt = isinstance(self.prompt_len, ShareGPT)
        mine, other = ("output_len", "prompt_len") if self.sharegpt else ("prompt_len", "output_len")
        check(self.sharegpt == isinstance(self.output_len, ShareGPT), f"workload.{mine}",
              output_len if self.sharegpt else prompt_len,
              f"{{dist: sharegpt}}, as workload.{other} is: ShareGPT's prompt and output lengths are "
              "drawn in pairs")  # fmt: skip
        self.num_prefixes, self.prefix_len = check_shared_prefix(shared_prefix, self.num_requests)
        self.max_concurrency = check_max_concurrency(max_concurrency)
        self.seed = check_int("workload.seed", seed, 0)
        self.schedule = check_choice("workload.schedule", schedule, SCHEDULES, ", ")

    @abstractmethod
    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` inter-arrival gaps in seconds, with mean ``1 / rate``."""

    def _check_fit(self) -> None:
        """The requests fit in memory; if not one does, the longer of its prefix and its own
        tokens is the knob named."""
        lengths_key, lengths = "workload.prompt_len", self.prompt_spec
        if self.prefix_len > self.prompt_len.expected:
            lengths_key, lengths = "workload.shared_prefix.length", self.prefix_len
        n = self.num_requests
        check_requests_fit(n, self.prompt_len.expected + self.prefix_len, count_key="workload.num_requests", count=n,
                           lengths_key=lengths_key, lengths=lengths)  # fmt: skip

    def requests(self, ctx: WorkloadContext) -> list[Request]:
        n = self.num_requests
        self._check_fit()
        arrival_rng, prompt_rng, output_rng, token_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(self.seed).spawn(4)
        )
        if self.schedule == "vllm" or (self.schedule == "auto" and ctx.target == "openai"):
            arrivals = vllm_arrivals(n, self.rate, self.burstiness, self.seed, lambda k: self.gaps(arrival_rng, k))
        else:
            arrivals = first_at_zero(self.gaps(arrival_rng, n - 1))
        if self.sharegpt:  # one conversation's prompt and completion, drawn together
            prompt_lens, output_lens = sharegpt_sample(n, prompt_rng).T.copy()
        else:
            prompt_lens = self.prompt_len.sample(prompt_rng, n)
            output_lens = self.output_len.sample(output_rng, n)
        prefixes = random_prompts(token_rng, np.full(self.num_prefixes, self.prefix_len), ctx.vocab_size)
        groups = token_rng.integers(0, self.num_prefixes, n) if self.num_prefixes and self.prefix_len else None
        prompts = random_prompts(token_rng, prompt_lens, ctx.vocab_size)
        if groups is not None:
            prompts = [prefixes[g] + tokens for g, tokens in zip(groups.tolist(), prompts)]
        requests = [
            Request(i, arrival, tokens, output_len)
            for i, (arrival, tokens, output_len) in enumerate(zip(arrivals.tolist(), prompts, output_lens.tolist()))
        ]
        if groups is not None:  # set apart: a keyword argument doubles a compiled constructor's call
            for req, group in zip(requests, groups.tolist()):
                req.prefix_group = group
        return requests
