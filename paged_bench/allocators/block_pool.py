"""A pool of fixed-size KV blocks: reference counts, a free queue and the prefix-cache index.

Freed blocks that hold a cached (hashed) block stay findable until the pool needs them:
the free queue is ordered least-recently-freed first and allocation evicts from its head
(lazy LRU, as in vLLM). Blocks holding nothing worth keeping go to the head instead, so
that they are reused before any cached block is evicted. The queue is an OrderedDict: a
C-implemented doubly linked list, so popping the head, appending, and removing a block
from the middle (a cache hit on a free block) are all O(1).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[Hashable | None] = [None] * num_blocks
        self.cached: dict[Hashable, int] = {}  # block hash -> block id
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue (caller checked num_free)."""
        out = []
        free, ref_cnt, block_hash = self._free, self.ref_cnt, self.block_hash
        evicted = 0
        for _ in range(n):
            block = free.popitem(last=False)[0]
            ref_cnt[block] = 1
            h = block_hash[block]
            if h is not None:  # evict: this block's cached content is overwritten
                del self.cached[h]
                block_hash[block] = None
                evicted += 1
            out.append(block)
        self.num_evictions += evicted
        return out

    def touch(self, block: int) -> bool:
        """Take one more reference to a cached block; True if it was free (revived)."""
        self.ref_cnt[block] += 1
        if self.ref_cnt[block] == 1:
            del self._free[block]
            return True
        return False

    def release(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block, in order; a block nobody holds any more joins the
        free queue: at its tail if cached (evicted last), else at its head (reused first)."""
        ref_cnt, block_hash, free = self.ref_cnt, self.block_hash, self._free
        for block in blocks:
            ref_cnt[block] -= 1
            if not ref_cnt[block]:
                free[block] = None
                if block_hash[block] is None:
                    free.move_to_end(block, last=False)

    def cache(self, blocks: Iterable[int], hashes: Iterable[Hashable]) -> None:
        """Index full blocks under their hashes (first writer wins: a block whose content
        is already indexed elsewhere stays unindexed)."""
        cached, block_hash = self.cached, self.block_hash
        for block, h in zip(blocks, hashes):
            if h not in cached:
                cached[h] = block
                block_hash[block] = h

    def uncache(self, block: int) -> None:
        """Drop a block from the index (its K/V will never be computed)."""
        h = self.block_hash[block]
        if h is not None:
            if self.cached.get(h) == block:
                del self.cached[h]
            self.block_hash[block] = None

    def is_free(self, block: int) -> bool:
        return self.ref_cnt[block] == 0

    def held_blocks(self) -> list[int]:
        return [b for b, n in enumerate(self.ref_cnt) if n]
