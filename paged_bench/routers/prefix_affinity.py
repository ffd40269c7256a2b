"""Prefix affinity (cache-aware routing, as SGLang's router and llm-d do): send a request to
the replica most likely to hold its prompt's prefix, so the prefill it skips there is not
computed again elsewhere; fall back to load when nobody holds enough of it or when following
the cache would overload a replica.

"Most likely to hold" is the larger of two signals: what the replica's prefix cache holds
now (asked of its allocator), and what this router last sent there (a request routed a
moment ago has not been cached yet, so a burst of one system prompt would otherwise be
spread over every replica). The router remembers, per leading ``match_tokens`` tokens, the
replica it chose last (at most ``memory`` keys, least recently used dropped first); a
remembered choice counts as a match of the whole key, all the router compared.

A cached match counts only if it covers more than ``cache_threshold`` of the prompt, as
SGLang's ``--cache-threshold``: one shared block of a long prompt saves little prefill and
is no reason to pile requests onto a replica. Candidates are the replicas with at most
``max_imbalance`` more requests in flight than the least loaded one; among them the best
counted match wins, then the least loaded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from paged_bench.core.request import Request
from paged_bench.errors import check, check_int, check_number
from paged_bench.routers.base import ReplicaView, Router


class PrefixAffinityRouter(Router):
    name = "prefix_affinity"

    def __init__(
        self, *, max_imbalance: int = 8, cache_threshold: float = 0.3, match_tokens: int = 64, memory: int = 4096
    ) -> None:
        self.max_imbalance = check_int("router.max_imbalance", max_imbalance, 0)
        self.cache_threshold = check_number("router.cache_threshold", cache_threshold)
        check(self.cache_threshold < 1, "router.cache_threshold", cache_threshold, "a share of the prompt: 0 to below 1")
        self.match_tokens = check_int("router.match_tokens", match_tokens)
        self.memory = check_int("router.memory", memory)
        self._last: OrderedDict[tuple[int, ...], int] = OrderedDict()  # leading tokens -> replica index

    def route(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        key = tuple(req.token_ids[: self.match_tokens])
        remembered = self._last.get(key)
        least = min(r.num_in_flight for r in replicas)
        candidates = [r for r in replicas if r.num_in_flight <= least + self.max_imbalance]
        enough = self.cache_threshold * req.num_prompt_tokens

        def score(r: ReplicaView) -> tuple:
            cached = r.cached_prefix_tokens(req)
            match = max(cached if cached > enough else 0, len(key) if r.index == remembered else 0)
            return (-match, r.num_in_flight, r.index)

        choice = min(candidates, key=score).index
        self._last[key] = choice
        self._last.move_to_end(key)
        if len(self._last) > self.memory:
            self._last.popitem(last=False)
        return choice
