"""Contiguous KV allocation, the pre-vLLM way: one ``max_model_len`` slab per request.

A slab is a block of ``max_model_len`` slots reserved whole at admission, because nobody
knows in advance how long the reply will run. So this is the paged allocator with one
block per request and no prefix caching, carved from the same KV memory (``num_blocks x
block_size`` slots) so that the two compare at equal memory. A running request never needs
a second slab, so it never triggers preemption (and needs no swap space); admission simply
waits for a free slab.
"""

from __future__ import annotations

from paged_bench.allocators.paged import PagedAllocator
from paged_bench.errors import check, check_int


class ContiguousAllocator(PagedAllocator):
    name = "contiguous"

    def __init__(self, *, num_blocks: int, block_size: int, max_model_len: int) -> None:
        capacity = check_int("num_blocks", num_blocks) * check_int("block_size", block_size)
        check_int("max_model_len", max_model_len)
        num_slabs = capacity // max_model_len
        check(
            num_slabs >= 1,
            "num_blocks",
            num_blocks,
            f"at least one max_model_len={max_model_len} slab: num_blocks x block_size >= {max_model_len}",
        )
        super().__init__(
            num_blocks=num_slabs,
            block_size=max_model_len,
            prefix_caching=False,
            swap_blocks=0,
        )
