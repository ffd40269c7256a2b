"""Paged KV allocation (PagedAttention): blocks handed out on demand, with prefix caching.

Each request has a block table that grows one block at a time as its sequence does, so the
only memory a request wastes is the unfilled tail of its last block. Full, computed blocks
are indexed by a hash chain over (parent hash, block tokens); a new request takes the
longest chain already cached, and blocks freed by finished requests stay findable until
the pool needs them (see ``block_pool``). Preemption can move a request's blocks to a
bounded CPU swap space (a second pool) and back.
"""

from __future__ import annotations

from dataclasses import dataclass

from paged_bench.allocators.base import NO_HIT, Allocator, AllocatorCounters, KVLayout, PrefixHit
from paged_bench.allocators.block_pool import BlockPool
from paged_bench.errors import check, check_int
from paged_bench.request import Request

_NEVER = 1 << 62


@dataclass(slots=True)
class _Seq:
    blocks: list[int]  # the block table (CPU block ids while swapped out)
    num_slots: int  # tokens these blocks hold, computed or being computed this step
    capacity: int  # len(blocks) * block_size
    num_cached: int = 0  # leading blocks already indexed in the prefix cache
    cache_at: int = _NEVER  # computed tokens at which the next block is full and can be cached
    on_cpu: bool = False


class PagedAllocator(Allocator):
    name = "paged"

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        prefix_caching: bool = True,
        swap_blocks: int | None = None,
    ) -> None:
        check_int("num_blocks", num_blocks)
        check_int("block_size", block_size)
        check(isinstance(prefix_caching, bool), "allocator.prefix_caching", prefix_caching, "true or false")
        swap = num_blocks if swap_blocks is None else check_int("allocator.swap_blocks", swap_blocks, 0)
        self.layout = KVLayout(num_blocks, block_size, swap)
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.pool = BlockPool(num_blocks)
        self.cpu_pool = BlockPool(swap)
        self.counters = AllocatorCounters()
        self.live_slots = 0
        self._seqs: dict[Request, _Seq] = {}
        self._hashes: dict[Request, list[int]] = {}

    # -- the protocol -------------------------------------------------------------------

    def lookup_prefix(self, req: Request) -> PrefixHit:
        num_full = (req.num_tokens - 1) // self.block_size
        # a request scoring its prompt (server echo + logprobs) must compute every position
        if not self.prefix_caching or num_full == 0 or getattr(req, "want_prompt_logprobs", False):
            return NO_HIT
        cached = self.pool.cached
        blocks = []
        for h in self._block_hashes(req, num_full)[:num_full]:
            block = cached.get(h)
            if block is None:
                break
            blocks.append(block)
        return PrefixHit(tuple(blocks), len(blocks) * self.block_size)

    def allocate_slots(
        self, req: Request, num_new_tokens: int, hit: PrefixHit = NO_HIT, min_free_blocks: int = 0
    ) -> bool:
        # the hot path: called for every running request at every step
        seq = self._seqs.get(req)
        if seq is None:
            return self._admit(req, num_new_tokens, hit, min_free_blocks)
        computed = req.num_computed_tokens
        total = computed + num_new_tokens
        if total > seq.capacity:
            need = -(-total // self.block_size) - len(seq.blocks)
            if self.pool.num_free - need < min_free_blocks:
                return False
            seq.blocks += self.pool.allocate(need)
            seq.capacity = len(seq.blocks) * self.block_size
        self.live_slots += total - seq.num_slots
        seq.num_slots = total
        if computed >= seq.cache_at:
            self._cache_computed(req, seq)
        return True

    def free(self, req: Request) -> None:
        seq = self._seqs.pop(req, None)
        if seq is not None:
            if seq.on_cpu:
                for block in seq.blocks:
                    self.cpu_pool.release(block)
            else:
                if self.prefix_caching:
                    self._cache_computed(req, seq)
                self._release(seq.blocks, seq.num_slots)
        self._hashes.pop(req, None)

    def swap_out(self, req: Request) -> list[tuple[int, int]] | None:
        seq = self._seqs[req]
        keep = -(-req.num_computed_tokens // self.block_size)  # blocks that hold computed K/V
        if self.cpu_pool.num_free < keep:
            return None
        if self.prefix_caching:
            self._cache_computed(req, seq)
        cpu_blocks = self.cpu_pool.allocate(keep)
        pairs = list(zip(seq.blocks[:keep], cpu_blocks))
        self._release(seq.blocks, seq.num_slots)
        seq.blocks, seq.num_slots, seq.on_cpu = cpu_blocks, req.num_computed_tokens, True
        seq.num_cached, seq.cache_at = 0, _NEVER  # the swapped-in copies are re-indexed
        return pairs

    def swap_in(self, req: Request, num_new_tokens: int) -> list[tuple[int, int]] | None:
        seq = self._seqs[req]
        total = req.num_computed_tokens + num_new_tokens
        need = -(-total // self.block_size)
        if self.pool.num_free < need:
            return None
        gpu_blocks = self.pool.allocate(need)
        pairs = list(zip(seq.blocks, gpu_blocks))
        for block in seq.blocks:
            self.cpu_pool.release(block)
        seq.blocks, seq.num_slots, seq.on_cpu = gpu_blocks, total, False
        seq.capacity = len(gpu_blocks) * self.block_size
        seq.cache_at = self.block_size if self.prefix_caching else _NEVER
        self.live_slots += total
        return pairs

    def block_table(self, req: Request) -> list[int]:
        return self._seqs[req].blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def leaks(self) -> list[str]:
        out = []
        if held := self.pool.held_blocks():
            out.append(f"{len(held)} KV blocks still referenced: {held[:8]}")
        if held := self.cpu_pool.held_blocks():
            out.append(f"{len(held)} swap blocks still held")
        if self._seqs:
            out.append(f"{len(self._seqs)} requests still hold block tables")
        if self.live_slots:
            out.append(f"{self.live_slots} live slots still counted")
        return out

    # -- internals ------------------------------------------------------------------------

    def _admit(self, req: Request, num_new_tokens: int, hit: PrefixHit, min_free_blocks: int) -> bool:
        pool, bs = self.pool, self.block_size
        total = hit.num_tokens + num_new_tokens
        need = -(-total // bs) - len(hit.blocks)
        # cached blocks nobody holds sit in the free queue: taking them uses free capacity too
        revived = sum(1 for b in hit.blocks if pool.ref_cnt[b] == 0)
        if pool.num_free - revived - need < min_free_blocks:
            return False
        for block in hit.blocks:
            pool.touch(block)
        blocks = list(hit.blocks) + pool.allocate(need)
        num_cached = len(hit.blocks)
        cache_at = (num_cached + 1) * bs if self.prefix_caching else _NEVER
        self._seqs[req] = _Seq(blocks, total, len(blocks) * bs, num_cached, cache_at)
        self.live_slots += num_new_tokens + revived * bs
        c = self.counters
        c.prefix_query_tokens += req.num_tokens
        c.prefix_hit_tokens += hit.num_tokens
        return True

    def _release(self, blocks: list[int], num_slots: int) -> None:
        """Drop a table's references, tail first so that its tail is evicted first."""
        bs, release, freed_slots = self.block_size, self.pool.release, 0
        for i in range(len(blocks) - 1, -1, -1):
            if release(blocks[i]):
                freed_slots += min(bs, num_slots - i * bs)
        self.live_slots -= freed_slots

    def _cache_computed(self, req: Request, seq: _Seq) -> None:
        num_full = req.num_computed_tokens // self.block_size
        if num_full <= seq.num_cached:
            return
        hashes = self._block_hashes(req, num_full)
        for i in range(seq.num_cached, num_full):
            self.pool.cache(seq.blocks[i], hashes[i])
        seq.num_cached = num_full
        seq.cache_at = (num_full + 1) * self.block_size

    def _block_hashes(self, req: Request, num_blocks: int) -> list[int]:
        """Hash chain over the request's first ``num_blocks`` full blocks, extended lazily.

        Python hashes ints and tuples of ints identically in every process, so runs stay
        reproducible; a 64-bit collision is as unlikely here as in vLLM's default."""
        hashes = self._hashes.setdefault(req, [])
        bs, tokens = self.block_size, req.token_ids
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), num_blocks):
            parent = hash((parent, tuple(tokens[i * bs : (i + 1) * bs])))
            hashes.append(parent)
        return hashes
