"""What fits in this machine's memory. A run too big for it (a KV pool, a cluster of them, a
workload's requests) is refused before anything is allocated, in one line naming the knob,
instead of a MemoryError traceback or the OOM killer minutes later."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paged_bench.backends.base import Backend
from paged_bench.errors import ConfigError
from paged_bench.run.config import CacheSettings

# the allocator's tables per block of either pool (free queue, ref counts, hashes, swap map):
# ~300 B measured with PagedAllocator(num_blocks=2_000_000), which also makes 2,000,000 swap
# blocks, and 1.35 GB RSS for swap_blocks=10_000_000 beside a small pool; rounded up
BOOKKEEPING_BYTES_PER_BLOCK = 200
# a request in the engine, on its own and per prompt token (drawn as int64, kept as a Python int
# in a list): the 20,000-request Poisson run (112 prompt and 62 output tokens a request) peaks at
# 249 MB RSS against 53 MB for 50 requests, about 56 B per token held and 0.5 KB per request
# besides; rounded up, outputs left out (max_model_len caps them, which a workload does not know)
BYTES_PER_REQUEST = 1024
BYTES_PER_TOKEN = 64


def available_memory() -> int | None:
    """Bytes this process can still allocate: MemAvailable, or the cgroup's limit if lower."""
    found = []
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        found.append(int(meminfo["MemAvailable"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def _gib(need: float, available: int) -> str:
    return f"{need / 2**30:,.1f} GiB needed, {available / 2**30:,.1f} GiB available"


def check_kv_pool_fits(cache: CacheSettings, max_batch: int, num_blocks: int, swap_blocks: int | None,
                       backend: Backend, copies: int = 1) -> None:  # fmt: skip
    """A KV pool of ``num_blocks`` blocks (sized by ``cache``, or for ``max_batch`` sequences) and
    ``swap_blocks`` of swap space (None: as many) fits, ``copies`` times over (a cluster's
    replicas each hold one); else the knob that sized it is named."""
    available = available_memory()
    if available is None:
        return
    blocks, block_size = num_blocks, cache.block_size
    swap = blocks if swap_blocks is None else swap_blocks
    per_block = BOOKKEEPING_BYTES_PER_BLOCK
    kv = (backend.kv_bytes_per_token or 0) if backend.clock == "wall" else 0  # real models hold K/V
    on_host = str(getattr(backend, "device", "cpu")).startswith("cpu")
    one = (blocks + swap) * per_block + (blocks * on_host + swap) * block_size * kv
    if one * copies <= available:
        return
    pool = blocks * (per_block + on_host * block_size * kv)  # the same pool without its swap space
    if swap_blocks is not None and pool * copies <= available:
        raise ConfigError("allocator.swap_blocks", swap_blocks, f"swap space that fits in memory beside the pool "
                          f"({_gib(one * copies, available)}): at most about "
                          f"{(available // copies - pool) // (per_block + block_size * kv):,}")  # fmt: skip
    if one <= available:
        raise ConfigError("cluster.replicas", copies, f"replicas whose KV pools fit in memory ({blocks:,} blocks "
                          f"each: {_gib(one * copies, available)}): at most about {available // one:,}, or fewer "
                          "num_blocks")  # fmt: skip
    most = available // (2 * per_block + (1 + on_host) * block_size * kv)
    if cache.auto_sized:
        raise ConfigError("max_batch", max_batch, f"a KV pool of max_batch full sequences that fits in memory "
                          f"({blocks:,} blocks: {_gib(one, available)}); set a smaller max_batch or num_blocks <= {most:,}")  # fmt: skip
    raise ConfigError("num_blocks", cache.num_blocks, f"a KV pool that fits in memory ({_gib(one, available)}): at most about {most:,}")  # fmt: skip


def check_requests_fit(num_requests: int, prompt_tokens: float, *, count_key: str, count: Any, lengths_key: str,
                       lengths: Any) -> None:  # fmt: skip
    """``num_requests`` prompts of about ``prompt_tokens`` tokens each fit, with what a run keeps
    of each request; else the knob that set their number (``count_key=count``) is named, or the
    one that set their lengths when not one prompt fits."""
    available = available_memory()
    if available is None:
        return
    one = BYTES_PER_REQUEST + BYTES_PER_TOKEN * prompt_tokens
    if one * num_requests <= available:
        return
    if one > available:
        raise ConfigError(lengths_key, lengths, f"prompts that fit in memory (one request: {_gib(one, available)})")
    raise ConfigError(count_key, count, f"requests that fit in memory ({num_requests:,} of {prompt_tokens:,.0f} prompt "
                      f"tokens: {_gib(one * num_requests, available)}): at most about {int(available // one):,}")  # fmt: skip
