"""Prefix affinity (cache-aware routing, as SGLang's router and llm-d do): send a request to
the replica most likely to hold its prompt's prefix, so the prefill it skips there is not
computed again elsewhere; fall back to load when nobody holds it or when following the
cache would overload a replica.

"Most likely to hold" is the larger of two signals: what the replica's prefix cache holds
now (asked of its allocator), and what this router last sent there (a request routed a
moment ago has not been cached yet, so a burst of one system prompt would otherwise be
spread over every replica). The router remembers, per leading ``match_tokens`` tokens, the
replica it chose last (at most ``memory`` keys, least recently used dropped first).
Candidates are the replicas with at most ``max_imbalance`` more requests in flight than the
least loaded one; among them the best match wins, then the least loaded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from paged_bench.errors import check_int
from paged_bench.request import Request
from paged_bench.routers.base import ReplicaView, Router


class PrefixAffinityRouter(Router):
    name = "prefix_affinity"

    def __init__(self, *, max_imbalance: int = 8, match_tokens: int = 64, memory: int = 4096) -> None:
        self.max_imbalance = check_int("router.max_imbalance", max_imbalance, 0)
        self.match_tokens = check_int("router.match_tokens", match_tokens)
        self.memory = check_int("router.memory", memory)
        self._last: OrderedDict[tuple[int, ...], int] = OrderedDict()  # leading tokens -> replica index

    def route(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        key = tuple(req.token_ids[: self.match_tokens])
        remembered = self._last.get(key)
        least = min(r.num_in_flight for r in replicas)
        candidates = [r for r in replicas if r.num_in_flight <= least + self.max_imbalance]

        def score(r: ReplicaView) -> tuple:
            match = max(r.cached_prefix_tokens(req), len(key) if r.index == remembered else 0)
            return (-match, r.num_in_flight, r.index)

        choice = min(candidates, key=score).index
        self._last[key] = choice
        self._last.move_to_end(key)
        if len(self._last) > self.memory:
            self._last.popitem(last=False)
        return choice
