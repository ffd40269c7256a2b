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

from paged_bench.core.kv.base import NO_HIT, KVLayout, PrefixHit
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.request import Request
from paged_bench.errors import MAX_TOKENS, check, check_int


class ContiguousAllocator(PagedAllocator):
    name = "contiguous"

    def __init__(self, *, num_blocks: int, block_size: int, max_model_len: int, prefix_hash: str = "builtin") -> None:
        check_int("num_blocks", num_blocks)
        check_int("block_size", block_size, 1, MAX_TOKENS)
        check_int("max_model_len", max_model_len)
        self.blocks_per_slab = -(-max_model_len // block_size)
        num_slabs = num_blocks // self.blocks_per_slab
        check(
            num_slabs >= 1,
            "num_blocks",
            num_blocks,
            f"at least one max_model_len={max_model_len} slab: num_blocks x block_size >= {max_model_len}",
        )
        # the pool's unit is the slab; the layout's unit stays the block
        super().__init__(
            num_blocks=num_slabs,
            block_size=self.blocks_per_slab * block_size,
            prefix_caching=False,
            swap_blocks=0,
            prefix_hash=prefix_hash,  # checked, unused: a slab is never shared
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
