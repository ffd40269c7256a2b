"""Contiguous KV allocation, the pre-vLLM way: one ``max_model_len`` slab per request.

A slab is a run of consecutive blocks covering ``max_model_len`` slots, reserved whole at
admission, because nobody knows in advance how long the reply will run. So this is the
paged allocator handing out whole slabs, with no prefix caching, carved from the same KV
memory (``num_blocks x block_size`` slots) so that the two compare at equal memory. The
layout backends see is the same as paged's (``block_size``-slot blocks); a request's table
lists its slab's blocks in order. A running request never needs a second slab, so it never
triggers preemption (and needs no swap space); admission simply waits for a free slab.
Blocks past the last whole slab are never handed out but stay in the pool's memory (and its
capacity figures): that is what slabs cost when the memory is not a multiple of one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from paged_bench.core.kv.base import NO_HIT, KVLayout, PrefixHit
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.request import Request


class ContiguousAllocator(PagedAllocator):
    name = "contiguous"

    def __init__(
        self,
        *,  # checked before they get here, where the config is read (paged_bench.run.plugin_options)
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        prefix_hash: Literal["builtin", "sha256"] = "builtin",
    ) -> None:
        self.blocks_per_slab = -(-max_model_len // block_size)
        # at least one slab: the engine refuses a pool that cannot hold one max_model_len sequence
        num_slabs = num_blocks // self.blocks_per_slab
        # the pool's unit is the slab; the layout's unit stays the block
        super().__init__(
            num_blocks=num_slabs,
            block_size=self.blocks_per_slab * block_size,
            prefix_caching=False,
            swap_blocks=0,
            prefix_hash=prefix_hash,  # unused: a slab is never shared
        )
        self.layout = KVLayout(num_blocks, block_size, 0)
        self._tail_blocks = num_blocks - num_slabs * self.blocks_per_slab  # free for ever: no slab fits there

    def allocate_slots(
        self, req: Request, num_new_tokens: int, hit: PrefixHit = NO_HIT, min_free_blocks: int = 0
    ) -> tuple[int, ...] | None:
        slabs = super().allocate_slots(req, num_new_tokens, hit, min_free_blocks)
        return None if slabs is None else tuple(self._blocks_of(slabs))

    def block_table(self, req: Request) -> list[int]:
        return self._blocks_of(self._seqs[req].blocks)

    def _blocks_of(self, slabs: Iterable[int]) -> list[int]:
        """The layout's blocks that make up ``slabs``, in order (a slab is a pool block)."""
        k = self.blocks_per_slab
        return [slab * k + j for slab in slabs for j in range(k)]

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free * self.blocks_per_slab + self._tail_blocks
