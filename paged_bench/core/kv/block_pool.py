"""A pool of fixed-size KV blocks: reference counts, a free queue and the prefix-cache index.

Freed blocks that hold a cached (hashed) block stay findable until the pool needs them:
the free queue is ordered least-recently-freed first and allocation evicts from its head
(lazy LRU, as in vLLM). Blocks holding nothing worth keeping go to the head instead, so
that they are reused before any cached block is evicted (as vLLM since early 2026; its
earlier v1 appended every freed block to the tail). The queue is a doubly linked list
(``free_queue``), so popping the head, appending at either end, and removing a block from
the middle (a cache hit on a free block) are all O(1).

Indexing a block costs a hash of its tokens, and most blocks are never shared: a chain whose
first block (its *root*) no other chain has shown can be hit by nobody, since a hit walks a
chain from its root. Such a chain's other full blocks may therefore be held *deferred*: in
the cache (kept at the free queue's tail, evicted in turn like any cached block) under a
``DeferredRun`` instead of their hashes. The allocator indexes a run (``index_deferred``)
as soon as another chain shows the same root, before anyone could hit it, so what hits,
what is evicted and when, is what eager indexing gives; only the hashing is saved. Roots are
"shown" while any indexed block of their chain, or a deferred run under them, is cached
(``root_known``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from mypy_extensions import mypyc_attr

from paged_bench.core.kv.free_queue import FreeQueue


class DeferredRun:
    """Full blocks of one chain held in the cache without their hashes: ``blocks[i]`` holds
    chain position ``i``; positions ``1 .. end - 1`` are deferred (while ``end`` is None the
    chain's table is still held and growing). ``owner`` is what the allocator needs to hash
    the chain later: the request while it holds the table, then its token ids."""

    __slots__ = ("blocks", "end", "num_live", "owner", "root")

    def __init__(self, root: Hashable, owner: Any, blocks: list[int]) -> None:
        self.root = root
        self.owner = owner
        self.blocks = blocks
        self.end: int | None = None
        self.num_live = 0  # deferred blocks not evicted yet


@mypyc_attr(allow_interpreted_subclasses=True)  # the tests tear its operations midway, as a signal would
class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        # what a cached block is held under: its hash (indexed), its DeferredRun, or None
        self.block_hash: list[Hashable | DeferredRun | None] = [None] * num_blocks
        self.block_root: list[Hashable | None] = [None] * num_blocks  # an indexed block's chain root
        self.cached: dict[Hashable, int] = {}  # block hash -> block id (the first indexed of its copies)
        self.copies: dict[Hashable, list[int]] = {}  # block hash -> later copies, in the order indexed
        self.roots: dict[Hashable, int] = {}  # chain root -> indexed blocks of its chains
        self.deferred: dict[Hashable, DeferredRun] = {}  # chain root -> its (only) deferred run
        self._free = FreeQueue(num_blocks)
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
            block = free.popleft()
            ref_cnt[block] = 1
            h = block_hash[block]
            if h is not None:  # evict: this block's cached content is overwritten
                if h.__class__ is DeferredRun and h.num_live > 1:  # the common case, inlined
                    h.num_live -= 1
                    block_hash[block] = None
                else:
                    self._drop(block)
                evicted += 1
            out.append(block)
        self.num_evictions += evicted
        return out

    def touch(self, block: int) -> bool:
        """Take one more reference to a cached block; True if it was free (revived)."""
        self.ref_cnt[block] += 1
        if self.ref_cnt[block] == 1:
            self._free.remove(block)
            return True
        return False

    def release(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block, in order; a block nobody holds any more joins the
        free queue: at its tail if cached (evicted last), else at its head (reused first)."""
        ref_cnt, block_hash, free = self.ref_cnt, self.block_hash, self._free
        for block in blocks:
            ref_cnt[block] -= 1
            if not ref_cnt[block]:
                if block_hash[block] is None:
                    free.appendleft(block)
                else:
                    free.append(block)

    def cache(self, blocks: list[int], hashes: list[Hashable], root: Hashable) -> None:
        """Index full blocks of a chain rooted at ``root`` under their hashes. A block whose
        content another block already holds is indexed too, as a copy, as vLLM's
        ``BlockHashToBlockMap`` keeps both (block tables stay append-only): a hit takes the
        first indexed, and a copy takes its place when it is evicted."""
        cached, block_hash, block_root = self.cached, self.block_hash, self.block_root
        for block, h in zip(blocks, hashes):
            if h in cached:
                self.copies.setdefault(h, []).append(block)
            else:
                cached[h] = block
            block_hash[block] = h
            block_root[block] = root
        if blocks:
            self.roots[root] = self.roots.get(root, 0) + len(blocks)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks in the cache: indexed, or deferred after their table was released."""
        copies = sum(map(len, self.copies.values()))
        return len(self.cached) + copies + sum(run.num_live for run in self.deferred.values())

    def root_known(self, root: Hashable) -> bool:
        """Whether a chain with this root may have blocks in the cache (indexed or deferred)."""
        return root in self.roots or root in self.deferred

    def open_run(self, root: Hashable, owner: Any, blocks: list[int]) -> DeferredRun:
        """A chain whose blocks past its indexed root are to be deferred: its table is held."""
        run = self.deferred[root] = DeferredRun(root, owner, blocks)
        return run

    def close_run(self, run: DeferredRun) -> None:
        """Forget ``run``: it is indexed, or it holds no deferred block."""
        if self.deferred.get(run.root) is run:
            del self.deferred[run.root]

    def defer(self, run: DeferredRun, end: int) -> None:
        """Hold ``run.blocks[1:end]`` in the cache under ``run``, unhashed (the chain's root is
        indexed, and known to no other chain)."""
        run.end, run.num_live = end, end - 1
        block_hash = self.block_hash
        for block in run.blocks[1:end]:
            block_hash[block] = run

    def index_deferred(self, run: DeferredRun, hashes: list[Hashable]) -> None:
        """Index the run's blocks still in the cache under ``hashes`` (chain positions from 0)."""
        self.close_run(run)
        block_hash = self.block_hash
        live = [(block, h) for block, h in zip(run.blocks[1 : run.end], hashes[1:]) if block_hash[block] is run]
        for block, _ in live:
            block_hash[block] = None
        self.cache([block for block, _ in live], [h for _, h in live], run.root)

    def uncache(self, block: int) -> None:
        """Drop a block from the index (its K/V will never be computed)."""
        if self.block_hash[block] is not None:
            self._drop(block)

    def _drop(self, block: int) -> None:
        """Forget what ``block`` is cached under (evicted, or never computed)."""
        h = self.block_hash[block]
        self.block_hash[block] = None
        if h.__class__ is DeferredRun:
            h.num_live -= 1
            if not h.num_live:
                self.close_run(h)
            return
        copies = self.copies.get(h)
        if self.cached[h] != block:  # a recomputed copy: the index keeps the first
            copies.remove(block)  # type: ignore[union-attr]  # a copy is always listed
        elif copies:
            self.cached[h] = copies.pop(0)
        else:
            del self.cached[h]
        if copies == []:
            del self.copies[h]
        root = self.block_root[block]
        self.block_root[block] = None
        left = self.roots[root] - 1
        if left:
            self.roots[root] = left
        else:
            del self.roots[root]

    def reclaim(self) -> None:
        """Take every block back into the free queue. For a run cut off mid-operation (Ctrl-C,
        SIGTERM) once every table is freed: an allocation or a release the signal interrupted
        may hold references that no table records, and one inside the free queue's pointer moves
        (interpreted) may leave it torn: it is made again, its blocks in their order, then every
        other block."""
        self.ref_cnt[:] = [0] * self.num_blocks
        queued = dict.fromkeys(self._free.blocks())  # each once, in order, should the queue be torn
        rest = [block for block in range(self.num_blocks) if block not in queued]
        self._free = FreeQueue(self.num_blocks, [*queued, *rest])

    def is_free(self, block: int) -> bool:
        return self.ref_cnt[block] == 0

    def held_blocks(self) -> list[int]:
        return [b for b, n in enumerate(self.ref_cnt) if n]
