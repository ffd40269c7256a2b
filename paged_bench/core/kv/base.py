"""The allocator protocol: who owns KV-cache slots, as the scheduler and the backends see it.

The scheduler asks an allocator for room (``lookup_prefix``, ``allocate_slots``,
``swap_out``/``swap_in``, ``free``) and never touches blocks itself. Backends read where a
request's K/V lives through ``block_table``: token position ``p`` of a request is slot
``table[p // block_size] * block_size + p % block_size`` of a pool of ``num_blocks``
blocks. ``allocate_slots`` returns the blocks it appended to a table, as vLLM v1's
``KVCacheManager.allocate_slots`` does, and the scheduler lists them in the step plan, so a
backend can mirror the tables without asking. Counters are kept up to date incrementally, so
reading them each step is O(1).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Final

from mypy_extensions import mypyc_attr

from paged_bench.core.request import Request


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Shape of the KV pool a backend must allocate (per layer): blocks of block_size slots."""

    num_blocks: int
    block_size: int  # slots per block, always (a contiguous slab is a run of consecutive blocks)
    num_cpu_blocks: int  # swap space, in blocks of the same size

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """The cached blocks that hold a request's first ``num_tokens`` tokens."""

    blocks: tuple[int, ...] = ()
    num_tokens: int = 0


NO_HIT: Final = PrefixHit()


@dataclass(slots=True)
class AllocatorCounters:
    """What an allocator has done so far; read by the engine after every step."""

    prefix_query_tokens: int = 0  # tokens looked up in the prefix cache at first admission
    prefix_hit_tokens: int = 0  # ... of which were found cached
    # re-admissions after a recompute preemption (a victim reviving its own blocks), counted
    # apart as vLLM v1's PrefixCacheStats does, so they do not inflate the hit rate
    preempted_prefix_query_tokens: int = 0
    preempted_prefix_hit_tokens: int = 0


@mypyc_attr(allow_interpreted_subclasses=True)  # every allocator, plugins too
class Allocator(ABC):
    """Owns the KV slots of one engine."""

    name: ClassVar[str] = ""
    # the methods marked @abstractmethod below, by name: compiled (paged_bench.native.guard), a method
    # loses the mark, and Python builds a subclass that lacks one; the registry refuses it instead
    abstract_methods: ClassVar[tuple[str, ...]] = ("live_slots", "lookup_prefix", "allocate_slots", "free",
                                                   "block_table", "num_free_blocks", "leaks")  # fmt: skip
    layout: KVLayout
    counters: AllocatorCounters

    @property
    @abstractmethod
    def live_slots(self) -> int:
        """Slots holding K/V (computed or being computed) of requests that hold them."""

    @abstractmethod
    def lookup_prefix(self, req: Request) -> PrefixHit:
        """The longest cached prefix of ``req`` (at most ``num_tokens - 1`` tokens, so that the
        last token is computed and yields a sample). Changes nothing."""

    @abstractmethod
    def allocate_slots(
        self,
        req: Request,
        num_new_tokens: int,
        hit: PrefixHit = NO_HIT,
        min_free_blocks: int = 0,
    ) -> tuple[int, ...] | None:
        """Make room for ``num_new_tokens`` more tokens of ``req``; returns the blocks appended
        to its table (often none: the tokens fit its last block), or None, changing nothing,
        if that would leave fewer than ``min_free_blocks`` free blocks.

        For a request that holds no KV yet, ``hit`` (from ``lookup_prefix``) is taken and the
        new tokens follow it (the hit's blocks are not among those returned). Full blocks are
        indexed in the prefix cache as they are allocated for computation (as vLLM v1 does),
        so a request admitted later in the same step already hits them.
        """

    @abstractmethod
    def free(self, req: Request) -> None:
        """Release everything ``req`` holds (GPU blocks and swap space). Idempotent."""

    def free_all(self, reqs: Iterable[Request]) -> None:
        """Release what any of ``reqs`` still holds after a run was cut off mid-step (Ctrl-C,
        SIGTERM), when a request may have left the scheduler's lists before its blocks were
        freed and counters kept incrementally may be torn. An allocator with such counters
        recounts them here."""
        for req in reqs:
            self.free(req)

    def swap_out(self, req: Request) -> list[tuple[int, int]] | None:
        """Move ``req``'s computed K/V to CPU swap space; returns (gpu, cpu) block pairs for the
        backend to copy, or None if this allocator cannot (the caller recomputes instead)."""
        return None

    def swap_in(self, req: Request, num_new_tokens: int, min_free_blocks: int = 0) -> list[tuple[int, int]] | None:
        """Bring a swapped-out ``req`` back with room for ``num_new_tokens`` more tokens;
        returns (cpu, gpu) block pairs to copy, or None if that would leave fewer than
        ``min_free_blocks`` free blocks."""
        return None

    def cached_prefix_tokens(self, req: Request) -> int:
        """Leading tokens of ``req`` this pool holds cached now. Read-only and keeps nothing
        about ``req``: a cluster's router asks every replica, most of which never see it."""
        return self.lookup_prefix(req).num_tokens

    @abstractmethod
    def block_table(self, req: Request) -> list[int]:
        """The blocks holding ``req``'s tokens, in order."""

    @property
    @abstractmethod
    def num_free_blocks(self) -> int:
        """Blocks no request holds: free, or cached with nobody holding them (at the end of a run,
        every block)."""

    @property
    def reserved_slots(self) -> int:
        """Slots in blocks some request holds: what the KV memory is spent on."""
        return (self.layout.num_blocks - self.num_free_blocks) * self.layout.block_size

    @property
    def capacity_slots(self) -> int:
        return self.layout.num_slots

    @abstractmethod
    def leaks(self) -> list[str]:
        """What is still held (blocks with references, swap blocks, request state); empty when
        every request has been freed. Checked by the engine at the end of a run."""
