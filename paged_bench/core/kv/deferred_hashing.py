"""Hashing only what can be hit: a block pool that holds the blocks of unshared chains in the
cache without their hashes until another chain could hit them.

Indexing a block costs a hash of its tokens, and most blocks are never shared: a hit walks a
chain from its first block (its *root*), so a chain whose root no other chain has shown can
be hit by nobody. Such a chain's root is indexed, and its other full blocks may be held
*deferred*: in the cache (kept at the free queue's tail, evicted in turn like any cached
block) under a ``DeferredRun`` instead of their hashes. The allocator indexes a run
(``index_deferred``) as soon as another chain shows the same root, before anyone could hit
it, so what hits, what is evicted and when, is what indexing every block gives; only the
hashing is saved. Roots are "shown" while any indexed block of their chain, or a deferred run
under them, is cached (``root_known``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from mypy_extensions import mypyc_attr

from paged_bench.core.kv.block_pool import BlockPool


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
class DeferredHashingPool(BlockPool):
    """A ``BlockPool`` that knows each indexed block's chain root, and holds deferred runs."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.block_root: list[Hashable | None] = [None] * num_blocks  # an indexed block's chain root
        self.roots: dict[Hashable, int] = {}  # chain root -> indexed blocks of its chains
        self.deferred: dict[Hashable, DeferredRun] = {}  # chain root -> its (only) deferred run

    @property
    def num_cached_blocks(self) -> int:
        """Blocks in the cache: indexed, or deferred after their table was released."""
        return super().num_cached_blocks + sum(run.num_live for run in self.deferred.values())

    def cache_chain(self, blocks: list[int], hashes: list[Hashable], root: Hashable) -> None:
        """Index full blocks of a chain rooted at ``root`` under their hashes."""
        self.cache_full_blocks(blocks, hashes)
        for block in blocks:
            self.block_root[block] = root
        if blocks:
            self.roots[root] = self.roots.get(root, 0) + len(blocks)

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
        for block in run.blocks[1:end]:
            self.block_hash[block] = run

    def index_deferred(self, run: DeferredRun, hashes: list[Hashable]) -> None:
        """Index the run's blocks still in the cache under ``hashes`` (chain positions from 0)."""
        self.close_run(run)
        live = [(block, h) for block, h in zip(run.blocks[1 : run.end], hashes[1:]) if self.block_hash[block] is run]
        self.cache_chain([block for block, _ in live], [h for _, h in live], run.root)

    def evict(self, block: int) -> None:
        run = self.block_hash[block]
        if isinstance(run, DeferredRun):
            self.block_hash[block] = None
            run.num_live -= 1
            if not run.num_live:
                self.close_run(run)
            return
        super().evict(block)
        root = self.block_root[block]
        self.block_root[block] = None
        left = self.roots[root] - 1
        if left:
            self.roots[root] = left
        else:
            del self.roots[root]
