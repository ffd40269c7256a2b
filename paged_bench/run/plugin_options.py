"""What the built-in schedulers and KV allocators take from their config sections, typed and
checked before they are built (vLLM's ``SchedulerConfig`` and ``CacheConfig``, as far as a
policy and a pool read them); the backends' are in ``backend_options``, and ``registry`` says
which class each schema reads the options of.

The core's classes are compiled and take these values as they are: a check there would be a
bare TypeError, so every check is here, naming the key as the config does. A plugin derived
from one of our classes has the options its base takes checked by that base's schema (the
nearest in its class hierarchy); its own options, and a plugin with no such base, it checks
itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from paged_bench.core.kv.prefix_hash import PREFIX_HASHES
from paged_bench.core.scheduler.preemptive import VICTIMS
from paged_bench.errors import MAX_TOKENS, check, check_choice, check_int, check_number


@dataclass(frozen=True, kw_only=True)
class PluginOptions:
    """Base of a built-in plugin's options schema: its fields are the options its class takes
    (and values the engine passes it that its checks read). ``__post_init__`` checks each
    value; ``verify`` checks them against each other, as the plugin is built."""

    def verify(self) -> None:
        """Checks across options that the engine makes as it builds the plugin, once the pool is
        sized and checked (a run too big for memory is told so first, naming the knob the user set)."""


@dataclass(frozen=True, kw_only=True)
class SchedulerOptions(PluginOptions):
    """What every scheduler takes (``core.scheduler.base.Scheduler``): its section's copies of
    the engine's limits, whether a prompt may be prefilled over several steps, whether prompt
    steps run alone (``prefill_first``, vLLM 0.x), the steps a decode batch runs per scheduling
    (``num_scheduler_steps``, vLLM 0.6's multi-step), the most prompt tokens one request gets a
    step (``long_prefill_token_threshold``, vLLM v1's; 0 = no cap) and the top level's
    ``max_model_len`` (auto until the backend's model says)."""

    max_batch: int
    max_num_batched_tokens: int
    chunked_prefill: bool = True
    prefill_first: bool = False
    num_scheduler_steps: int = 1
    long_prefill_token_threshold: int = 0
    max_model_len: int | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        check_int("max_batch", self.max_batch)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens)
        chunked = self.chunked_prefill
        check(isinstance(chunked, bool), "scheduler.chunked_prefill", chunked, "true or false")
        check(isinstance(self.prefill_first, bool), "scheduler.prefill_first", self.prefill_first, "true or false")
        # vLLM 0.x runs prompts first only without chunked prefill (_schedule_default)
        check(not (self.prefill_first and chunked), "scheduler.prefill_first", self.prefill_first,
              "false while scheduler.chunked_prefill is true (vLLM 0.x runs prompt steps first only without "
              "chunked prefill: set scheduler.chunked_prefill=false too, or use scheduler=vllm_v0)")  # fmt: skip
        check_int("scheduler.num_scheduler_steps", self.num_scheduler_steps, 1, 1024)
        check_int("scheduler.long_prefill_token_threshold", self.long_prefill_token_threshold, 0, MAX_TOKENS)

    def verify(self) -> None:
        """The step's token budget holds a token for each running sequence, as vLLM's
        ``SchedulerConfig`` checks (a budget below max_batch would silently cap concurrency),
        and without chunking a whole prompt (once max_model_len is known)."""
        tokens = self.max_num_batched_tokens
        check(tokens >= self.max_batch, "max_num_batched_tokens", tokens,
              f">= max_batch={self.max_batch} (each running sequence needs a token a step)")  # fmt: skip
        if self.max_model_len != "auto":
            check(self.chunked_prefill or tokens >= self.max_model_len, "max_num_batched_tokens", tokens,
                  f">= max_model_len={self.max_model_len} when chunked_prefill is off (a prompt must fit one step)")  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class PreemptiveOptions(SchedulerOptions):
    """``scheduler=preemptive``: how a victim is preempted (``mode``), the fraction of the pool
    admission keeps free (``watermark``) and who is preempted (``victim``)."""

    mode: Literal["recompute", "swap"] = "recompute"
    watermark: float = 0.0
    victim: Literal["last_admitted", "latest_arrival"] = "last_admitted"

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.mode in ("recompute", "swap"), "scheduler.mode", self.mode, "recompute or swap")
        check_number("scheduler.watermark", self.watermark)
        check(self.watermark < 1, "scheduler.watermark", self.watermark, "a fraction of the pool in [0, 1)")
        check(self.victim in VICTIMS, "scheduler.victim", self.victim, " or ".join(VICTIMS))


@dataclass(frozen=True, kw_only=True)
class PagedOptions(PluginOptions):
    """``allocator=paged``: the pool (its section's copies of the top level's ``num_blocks``,
    null or auto until the engine sizes it, and ``block_size``), prefix caching, the CPU swap
    space (null: as many blocks as the pool), the block hash and deferred hashing."""

    num_blocks: int | Literal["auto"] | None = None
    block_size: int
    prefix_caching: bool = True
    swap_blocks: int | None = None
    prefix_hash: Literal["builtin", "sha256"] = "builtin"
    defer_unshared: bool = True

    def __post_init__(self) -> None:
        if self.num_blocks not in (None, "auto"):
            check_int("num_blocks", self.num_blocks)
        check_int("block_size", self.block_size, 1, MAX_TOKENS)
        if self.swap_blocks is not None:
            check_int("allocator.swap_blocks", self.swap_blocks, 0)
        check(isinstance(self.prefix_caching, bool), "allocator.prefix_caching", self.prefix_caching, "true or false")
        check_choice("allocator.prefix_hash", self.prefix_hash, PREFIX_HASHES, " or ")
        check(isinstance(self.defer_unshared, bool), "allocator.defer_unshared", self.defer_unshared, "true or false")


@dataclass(frozen=True, kw_only=True)
class ContiguousOptions(PluginOptions):
    """``allocator=contiguous``: the same pool, carved into ``max_model_len`` slabs (its section's
    copy of the top level's; at least one slab fits: the engine refuses a pool that cannot hold
    one such sequence before it builds the allocator)."""

    num_blocks: int | Literal["auto"] | None = None
    block_size: int
    max_model_len: int | Literal["auto"]
    prefix_hash: Literal["builtin", "sha256"] = "builtin"

    def __post_init__(self) -> None:
        if self.num_blocks not in (None, "auto"):
            check_int("num_blocks", self.num_blocks)
        check_int("block_size", self.block_size, 1, MAX_TOKENS)
        if self.max_model_len != "auto":
            check_int("max_model_len", self.max_model_len)
        check_choice("allocator.prefix_hash", self.prefix_hash, PREFIX_HASHES, " or ")
