"""Keep the numpy backend's freed temporaries for reuse, as an engine's caching allocator does.

glibc's malloc serves a block above its mmap threshold (128 KiB at start, raised on the fly
up to 32 MiB by the largest mmapped block freed so far) with a fresh ``mmap`` and unmaps it
when it is freed, and trims the heap's free top back to the system past a trim threshold.
An eager attention's score matrices are megabytes a layer (a slice of a prompt chunk's: up to
4 MiB, 16 MiB before 2026-12-07), so a step of the numpy backend page-faults its temporaries
in afresh (zeroed by the kernel, 4 KiB at a time) or reuses them depending on what the
*process* freed before: the same step measured 76-127 ms in one run (7,400 page faults or
none), and a chunk at 3,072 tokens of context 264-277 ms with page faults, 211-219 ms without.
No cost model can see a process's malloc history. ``hold_freed_memory`` pins it: no mmapped blocks and no
trimming, so temporaries are page-faulted in once (the first step of their size) and reused
after, as PyTorch's caching allocator and vLLM's preallocated workspaces make a GPU engine
do. ``release`` restores glibc's defaults and returns the held memory once every holder
(several backends may be bound in one process: a cluster's replicas) has released.

Held memory is reused, but the first step that needs more than any before it still grows
the heap, and faults the growth in: a run's first long prompt paid 40-92 ms more over its
eight 512-token chunks than the next one of its length (in 4 KiB pages and 16 MiB slices,
below). With 4 MiB slices that growth moved no named run's replayed busy time by more than
0.8%, and the simulator no longer prices it (docs/backends.md, "Which terms the CPU cost
model keeps").

Held memory is backed by 4 KiB pages: numpy asks the kernel for transparent huge pages on
its large arrays (``madvise(MADV_HUGEPAGE)``), and with the kernel's default
``defrag=madvise`` a huge-page fault in such a region may stall to compact memory. A fresh
process's first 4,096-token prompt then paid 276-327 ms more than the same prompt again, a
bimodal 2-70 ms a 512-token chunk, against 40-92 ms in 4 KiB pages
(``benchmarks/numpy_memory.py``). PyTorch's CPU allocator likewise asks for huge pages only
when told (``C10_THP_MEM_ALLOC_ENABLE``, default off, ``c10/core/alloc_cpu.h``).
``hold_freed_memory`` turns numpy's request off and ``release`` restores it.

Only glibc has ``mallopt`` and ``mallinfo2``; elsewhere (macOS, musl) these are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# glibc's defaults: a trim threshold of 128 KiB, at most 65,536 mmapped blocks
_DEFAULT_TRIM = 128 * 1024
_DEFAULT_MMAP_MAX = 65536
_NEVER_TRIM = (1 << 31) - 1  # an int: mallopt takes one
_holders = 0
_numpy_huge_pages: bool | None = None  # numpy's setting before the first holder turned it off


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None
    except OSError:
        return None


def _set_numpy_huge_pages(enabled: bool) -> bool:
    """Whether numpy asks for transparent huge pages on large arrays, set; the previous setting."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _set_madvise_hugepage  # type: ignore[no-redef]
    return bool(_set_madvise_hugepage(enabled))


def numpy_huge_pages() -> bool:
    """Whether numpy now asks the kernel for transparent huge pages on its large arrays."""
    before = _set_numpy_huge_pages(False)
    _set_numpy_huge_pages(before)
    return before


def hold_freed_memory() -> bool:
    """Serve every block from the heap in 4 KiB pages and never trim it; True where this is glibc."""
    global _holders, _numpy_huge_pages
    libc = _glibc()
    if libc is None:
        return False
    if not _holders:
        _numpy_huge_pages = _set_numpy_huge_pages(False)
    _holders += 1
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))


def release() -> None:
    """(Once the last holder releases) glibc's defaults back (mmapped large blocks, trimming),
    the held memory returned, numpy's huge-page setting restored."""
    global _holders
    libc = _glibc()
    _holders = max(_holders - 1, 0)
    if libc is None or _holders:
        return
    libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
    libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM)
    libc.malloc_trim(0)
    if _numpy_huge_pages is not None:
        _set_numpy_huge_pages(_numpy_huge_pages)


def _mallinfo() -> _MallInfo2 | None:
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2()


def heap_size() -> int | None:
    """Bytes the main heap holds from the system now (glibc 2.33+), else None."""
    info = _mallinfo()
    return None if info is None else int(info.arena)


def free_bytes() -> int | None:
    """Bytes free inside the heap (its bins and top) now (glibc 2.33+), else None."""
    info = _mallinfo()
    return None if info is None else int(info.fordblks)


def mmapped_bytes() -> int | None:
    """Bytes of blocks malloc serves with their own ``mmap`` now (glibc 2.33+), else None."""
    info = _mallinfo()
    return None if info is None else int(info.hblkhd)


def trim() -> None:
    """Return the heap's free memory to the system now (a fresh heap for the next measurement)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
