"""A pool of fixed-size KV blocks, as vLLM v1's ``BlockPool``: reference counts, a free queue
and the prefix cache's hash -> block map.

Freed blocks that hold a cached (hashed) block stay findable until the pool needs them:
the free queue is ordered least-recently-freed first and ``get_new_blocks`` evicts from its
head (lazy LRU, as in vLLM). Blocks holding nothing worth keeping go to the head instead, so
that they are reused before any cached block is evicted (as vLLM since early 2026; its
earlier v1 appended every freed block to the tail). The queue is a doubly linked list
(``free_queue``), so popping the head, appending at either end, and removing a block from
the middle (a cache hit on a free block) are all O(1).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from mypy_extensions import mypyc_attr

from paged_bench.core.kv.free_queue import FreeQueue


@mypyc_attr(allow_interpreted_subclasses=True)  # the tests tear its operations midway, as a signal would
class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.free_queue = FreeQueue(num_blocks)
        self.block_hash: list[Hashable | None] = [None] * num_blocks  # what a cached block holds, or None
        self.cached: dict[Hashable, int] = {}  # block hash -> block id (the first indexed of its copies)
        self.copies: dict[Hashable, list[int]] = {}  # block hash -> later copies, in the order indexed
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose content the cache keeps, held or free."""
        return len(self.cached) + sum(map(len, self.copies.values()))

    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue (the caller checked ``num_free``),
        evicting what they held."""
        blocks = []
        for _ in range(n):
            block = self.free_queue.popleft()
            if self.block_hash[block] is not None:
                self.evict(block)
                self.num_evictions += 1
            self.ref_cnt[block] = 1
            blocks.append(block)
        return blocks

    def touch(self, block: int) -> bool:
        """Take one more reference to a cached block; True if it was free (revived)."""
        self.ref_cnt[block] += 1
        if self.ref_cnt[block] == 1:
            self.free_queue.remove(block)
            return True
        return False

    def free_blocks(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block, in order; a block nobody holds any more joins the
        free queue: at its tail if cached (evicted last), else at its head (reused first)."""
        for block in blocks:
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                if self.block_hash[block] is None:
                    self.free_queue.appendleft(block)
                else:
                    self.free_queue.append(block)

    def cache_full_blocks(self, blocks: list[int], hashes: list[Hashable]) -> None:
        """Index full blocks under their hashes. A block whose content another block already
        holds is indexed too, as a copy, as vLLM's ``BlockHashToBlockMap`` keeps both (block
        tables stay append-only): a hit takes the first indexed, and a copy takes its place
        when it is evicted."""
        for block, h in zip(blocks, hashes):
            if h in self.cached:
                self.copies.setdefault(h, []).append(block)
            else:
                self.cached[h] = block
            self.block_hash[block] = h

    def get_cached_block(self, h: Hashable) -> int | None:
        return self.cached.get(h)

    def evict(self, block: int) -> None:
        """Forget what ``block`` holds: it is reused, or its K/V will never be computed."""
        h = self.block_hash[block]
        self.block_hash[block] = None
        copies = self.copies.get(h)
        if self.cached[h] != block:  # a recomputed copy: the index keeps the first
            copies.remove(block)  # type: ignore[union-attr]  # a copy is always listed
        elif copies:
            self.cached[h] = copies.pop(0)
        else:
            del self.cached[h]
        if copies == []:
            del self.copies[h]

    def reclaim(self) -> None:
        """Take every block back into the free queue. For a run cut off mid-operation (Ctrl-C,
        SIGTERM) once every table is freed: an allocation or a release the signal interrupted
        may hold references that no table records, and one inside the free queue's pointer moves
        (interpreted) may leave it torn: it is made again, its blocks in their order, then every
        other block."""
        self.ref_cnt[:] = [0] * self.num_blocks
        queued = dict.fromkeys(self.free_queue.blocks())  # each once, in order, should the queue be torn
        rest = [block for block in range(self.num_blocks) if block not in queued]
        self.free_queue = FreeQueue(self.num_blocks, [*queued, *rest])

    def is_free(self, block: int) -> bool:
        return self.ref_cnt[block] == 0

    def held_blocks(self) -> list[int]:
        return [b for b, n in enumerate(self.ref_cnt) if n]
