"""Paged KV allocation (PagedAttention): blocks handed out on demand, with prefix caching.

Each request has a block table that grows one block at a time as its sequence does, so the
only memory a request wastes is the unfilled tail of its last block. Full blocks are indexed
by a hash chain over (parent hash, block tokens) as soon as they are allocated for
computation, as vLLM v1 does: a request admitted later in the same step already hits them
(the step writes every new token's K/V before any attention reads it). A new request takes
the longest chain already cached, and blocks freed by finished requests stay findable until
the pool needs them (``block_pool``); blocks of a chain no other chain shares are held
unhashed until one does (``deferred_hashing``, ``defer_unshared``). Preemption can move a
request's blocks to a bounded CPU swap space (a second pool) and back.

Live slots are derived, not counted at every change: reserved slots (held blocks) minus the
empty tail slots of the tables, which change only in ``allocate_slots`` (grow) and
``_release`` (give back). A full block may be shared; an unfilled tail never is.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Hashable, Iterable
from typing import Final, Literal

from mypy_extensions import mypyc_attr

from paged_bench.core.kv.base import NO_HIT, Allocator, AllocatorCounters, KVLayout, PrefixHit
from paged_bench.core.kv.block_pool import BlockPool
from paged_bench.core.kv.deferred_hashing import DeferredHashingPool, DeferredRun
from paged_bench.core.kv.prefix_hash import NO_EXTRA_KEYS, PREFIX_HASHES
from paged_bench.core.request import Request

_NEVER: Final = 1 << 61  # past any table's slots, and still a machine integer compiled (1 << 62 is boxed)


class _Seq:
    """One request's block table and where it stands. (A plain class, not a dataclass:
    compiled, a dataclass's generated __init__ runs interpreted, and one is made per admission.)"""

    __slots__ = ("blocks", "cache_at", "capacity", "hashes", "num_cached", "num_slots", "on_cpu", "run")

    def __init__(self, blocks: list[int], num_slots: int, num_cached: int, cache_at: int, hashes: list[Hashable],
                 block_slots: int) -> None:  # fmt: skip
        self.blocks = blocks  # the block table (CPU block ids while swapped out)
        self.num_slots = num_slots  # tokens these blocks hold, computed or being computed this step
        self.capacity = len(blocks) * block_slots
        self.num_cached = num_cached  # leading blocks already indexed in the prefix cache
        self.cache_at = cache_at  # slots at which the next block is full and can be cached
        self.on_cpu = False
        self.hashes = hashes  # the request's hash chain (the allocator's list)
        # while its chain's root is known to no other chain: its blocks past the root, unhashed
        self.run: DeferredRun | None = None


@mypyc_attr(allow_interpreted_subclasses=True)  # contiguous and allocator plugins subclass it
class PagedAllocator(Allocator):
    name = "paged"

    def __init__(
        self,
        *,  # checked before they get here, where the config is read (paged_bench.run.plugin_options)
        num_blocks: int,
        block_size: int,
        prefix_caching: bool = True,
        swap_blocks: int | None = None,
        prefix_hash: Literal["builtin", "sha256"] = "builtin",
        defer_unshared: bool = True,
    ) -> None:
        swap = num_blocks if swap_blocks is None else swap_blocks
        self.layout = KVLayout(num_blocks, block_size, swap)
        self.pool_block_slots: int = block_size  # slots per pool block: a slab for contiguous
        self.prefix_caching: bool = prefix_caching
        # hash a chain's blocks past its root only once another chain shows the same root
        # (block_pool); False hashes every full block as it is allocated: the reference
        self.defer_unshared: bool = defer_unshared
        self._hash_block, self._root_hash = PREFIX_HASHES[prefix_hash]
        # a block's token ids read as a tuple of ints straight from the request's array('Q') (its
        # machine's byte order): a third of the cost of tuple() of a slice, which boxes one id at a time
        self._block_ids = struct.Struct(f"={block_size}Q")
        self.pool = DeferredHashingPool(num_blocks)
        self.cpu_pool = BlockPool(swap)
        self.counters = AllocatorCounters()
        self._seqs: dict[Request, _Seq] = {}
        self._hashes: dict[Request, list[Hashable]] = {}
        self._unfilled_slots = 0  # empty slots at the tails of GPU tables

    # -- the protocol -------------------------------------------------------------------

    @property
    def live_slots(self) -> int:
        return (self.pool.num_blocks - self.pool.num_free) * self.pool_block_slots - self._unfilled_slots

    def lookup_prefix(self, req: Request) -> PrefixHit:
        num_full = (req.num_tokens - 1) // self.pool_block_slots
        # a request scoring its prompt (server echo + logprobs) must compute every position
        if not self.prefix_caching or num_full == 0 or req.want_prompt_logprobs:
            return NO_HIT
        if not self._shown(self._block_hashes(req, 1)[0]):  # no chain starts so: one hash, no hit
            return NO_HIT
        blocks = []
        for h in self._block_hashes(req, num_full)[:num_full]:
            block = self.pool.get_cached_block(h)
            if block is None:
                break
            blocks.append(block)
        return PrefixHit(tuple(blocks), len(blocks) * self.pool_block_slots)

    def allocate_slots(
        self, req: Request, num_new_tokens: int, hit: PrefixHit = NO_HIT, min_free_blocks: int = 0
    ) -> tuple[int, ...] | None:
        seq = self._seqs.get(req)
        if seq is not None:
            return self._grow(req, seq, req.num_computed_tokens + num_new_tokens, min_free_blocks)
        seq = self._admit(req, num_new_tokens, hit, min_free_blocks)
        if seq is None:
            return None
        # _admit checked the room for the hit and the new tokens
        return self._grow(req, seq, req.num_computed_tokens + hit.num_tokens + num_new_tokens, 0)

    def _grow(self, req: Request, seq: _Seq, total: int, min_free_blocks: int) -> tuple[int, ...] | None:
        """Room for ``total`` tokens in the request's table: the blocks it needs past its
        capacity (returned), its full blocks indexed; None if those blocks would leave fewer
        than ``min_free_blocks`` free."""
        new: tuple[int, ...] = ()
        if total > seq.capacity:
            bs = self.pool_block_slots
            need = -(-total // bs) - len(seq.blocks)
            if self.pool.num_free - need < min_free_blocks:
                return None
            new = tuple(self.pool.get_new_blocks(need))
            seq.blocks += new
            seq.capacity += need * bs
            self._unfilled_slots += need * bs
        self._unfilled_slots -= total - seq.num_slots
        seq.num_slots = total
        if total >= seq.cache_at:
            self._cache_full_blocks(req, seq)
        return new

    def free(self, req: Request) -> None:
        seq = self._seqs.pop(req, None)
        if seq is not None:
            if seq.on_cpu:
                self.cpu_pool.free_blocks(seq.blocks)
            else:
                self._release(req, seq)
        self._hashes.pop(req, None)

    def free_all(self, reqs: Iterable[Request]) -> None:
        super().free_all([*reqs, *self._seqs])
        # every table is gone, so no tail is unfilled and no block is held: an interrupt inside
        # an allocation can leave the incremental count out of step with a table it had grown,
        # one inside a pool's get_new_blocks or free_blocks references no table records
        self._unfilled_slots = 0
        self.pool.reclaim()
        self.cpu_pool.reclaim()

    def swap_out(self, req: Request) -> list[tuple[int, int]] | None:
        seq = self._seqs[req]
        keep = -(-req.num_computed_tokens // self.pool_block_slots)  # blocks that hold computed K/V
        if self.cpu_pool.num_free < keep:
            return None
        cpu_blocks = self.cpu_pool.get_new_blocks(keep)
        pairs = list(zip(seq.blocks[:keep], cpu_blocks))
        self._release(req, seq)
        seq.blocks, seq.num_slots, seq.on_cpu = cpu_blocks, req.num_computed_tokens, True
        return pairs

    def swap_in(self, req: Request, num_new_tokens: int, min_free_blocks: int = 0) -> list[tuple[int, int]] | None:
        cpu = self._seqs.pop(req)
        # back as a new table: allocate_slots takes the pool's room, watermark included
        if self.allocate_slots(req, num_new_tokens, NO_HIT, min_free_blocks) is None:
            self._seqs[req] = cpu
            return None
        self.cpu_pool.free_blocks(cpu.blocks)
        return list(zip(cpu.blocks, self._seqs[req].blocks))

    def cached_prefix_tokens(self, req: Request) -> int:
        known = req in self._hashes
        hit = self.lookup_prefix(req)
        if not known:  # forget the hash chain lookup_prefix memoised for a request not held here
            self._hashes.pop(req, None)
        return hit.num_tokens

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
        if self._unfilled_slots:
            out.append(f"{self._unfilled_slots} unfilled slots still counted")
        return out

    # -- internals ------------------------------------------------------------------------

    def _admit(self, req: Request, num_new_tokens: int, hit: PrefixHit, min_free_blocks: int) -> _Seq | None:
        """A table for a request that holds no KV yet, starting with the hit's blocks; None
        if the hit and the new tokens would leave fewer than ``min_free_blocks`` free."""
        pool, bs = self.pool, self.pool_block_slots
        total = req.num_computed_tokens + hit.num_tokens + num_new_tokens
        need = -(-total // bs) - len(hit.blocks)
        # cached blocks nobody holds sit in the free queue: taking them uses free capacity too
        revived = sum(1 for b in hit.blocks if pool.ref_cnt[b] == 0) if hit.blocks else 0
        if pool.num_free - revived - need < min_free_blocks:
            return None
        for block in hit.blocks:
            pool.touch(block)
        num_hit = len(hit.blocks)
        cache_at = (num_hit + 1) * bs if self.prefix_caching else _NEVER
        hashes = self._hashes.setdefault(req, [])  # memoised by lookup_prefix, if it ran
        seq = self._seqs[req] = _Seq(list(hit.blocks), hit.num_tokens, num_hit, cache_at, hashes, bs)
        # a lookup, not a swap-in; as vLLM, a request that skipped the lookup is no query
        if not req.num_computed_tokens and self.prefix_caching and not req.want_prompt_logprobs:
            self._count_lookup(req, hit.num_tokens)
        return seq

    def _count_lookup(self, req: Request, hit_tokens: int) -> None:
        c = self.counters
        if req.num_preemptions:
            c.preempted_prefix_query_tokens += req.num_tokens
            c.preempted_prefix_hit_tokens += hit_tokens
        else:
            c.prefix_query_tokens += req.num_tokens
            c.prefix_hit_tokens += hit_tokens

    def _release(self, req: Request, seq: _Seq) -> None:
        """Drop a GPU table's references, tail first so that its tail is evicted first."""
        if seq.num_slots > req.num_computed_tokens and seq.num_cached:
            self._uncache_uncomputed(req, seq)
        if seq.run is not None:
            self._defer_run(req, seq)
        self._unfilled_slots -= seq.capacity - seq.num_slots
        self.pool.free_blocks(reversed(seq.blocks))  # the table is dropped (free) or replaced (swap_out)

    def _uncache_uncomputed(self, req: Request, seq: _Seq) -> None:
        """A table released before its step ran (preempted, or the step failed): blocks it
        indexed for this step hold no K/V, so nobody may hit them."""
        first = req.num_computed_tokens // self.pool_block_slots
        for block in seq.blocks[first : seq.num_cached]:
            if self.pool.ref_cnt[block] == 1 and self.pool.block_hash[block] is not None:
                self.pool.evict(block)
        seq.num_cached = min(seq.num_cached, first)

    def _cache_full_blocks(self, req: Request, seq: _Seq) -> None:
        bs, first = self.pool_block_slots, seq.num_cached
        num_full = seq.num_slots // bs
        hashes = seq.hashes
        if not hashes:  # the chain's root: whether another chain showed it decides what is indexed
            self._extend_hashes(req.token_ids, hashes, 1)
        root = hashes[0]
        if first == 0 and self.defer_unshared and not self._shown(root):
            # a chain nobody else has shown: index its root alone and defer the rest
            self.pool.cache_chain([seq.blocks[0]], [root], root)
            seq.run = self.pool.open_run(root, req, seq.blocks)
            seq.num_cached, seq.cache_at = 1, _NEVER
            return
        self._extend_hashes(req.token_ids, hashes, num_full)
        self.pool.cache_chain(seq.blocks[first:num_full], hashes[first:num_full], root)
        seq.num_cached = num_full
        seq.cache_at = (num_full + 1) * bs

    def _shown(self, root: Hashable) -> bool:
        """Whether a chain with this root may be in the cache; if one is deferred, it is
        indexed now, so that this chain's blocks meet it as eager indexing would."""
        pool = self.pool
        if root in pool.deferred:
            self._index_run(pool.deferred[root])
        return pool.root_known(root)

    def _index_run(self, run: DeferredRun) -> None:
        """Index a deferred chain: a held table as far as it is full, or the blocks of a
        released table still in the cache."""
        if run.end is None:  # its request still holds the table
            req = run.owner
            seq = self._seqs[req]
            seq.run = None
            self.pool.close_run(run)
            seq.cache_at = 2 * self.pool_block_slots
            if seq.num_slots >= seq.cache_at:
                self._cache_full_blocks(req, seq)
            return
        hashes: list[Hashable] = []
        self._extend_hashes(run.owner, hashes, run.end)
        self.pool.index_deferred(run, hashes)

    def _defer_run(self, req: Request, seq: _Seq) -> None:
        """A released table of a deferred chain: its computed full blocks stay cached, unhashed."""
        run, seq.run = seq.run, None
        assert run is not None  # called for a deferred chain's table only
        end = req.num_computed_tokens // self.pool_block_slots
        if end > 1:
            run.owner = req.token_ids  # positions below end never change: hashable later
            self.pool.defer(run, end)
        else:
            self.pool.close_run(run)

    def _block_hashes(self, req: Request, num_blocks: int) -> list[Hashable]:
        """Hash chain over the request's first ``num_blocks`` full blocks, extended lazily (kept
        from a lookup to the admission that follows it, and while the request holds KV)."""
        hashes = self._hashes.get(req)
        if hashes is None:
            hashes = self._hashes[req] = []
        if len(hashes) < num_blocks:
            self._extend_hashes(req.token_ids, hashes, num_blocks)
        return hashes

    def _extend_hashes(self, tokens: array, hashes: list[Hashable], num_blocks: int) -> None:
        """Extend a hash chain over ``tokens`` (a request's ids) to its first ``num_blocks`` full blocks."""
        block_bytes, block_ids, hash_block = self._block_ids.size, self._block_ids.unpack_from, self._hash_block
        parent = hashes[-1] if hashes else self._root_hash
        for i in range(len(hashes), num_blocks):
            parent = hash_block((parent, block_ids(tokens, i * block_bytes), NO_EXTRA_KEYS))
            hashes.append(parent)
