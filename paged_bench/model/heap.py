"""Keep the numpy backend's freed temporaries for reuse, as an engine's caching allocator does.

glibc's malloc serves a block above its mmap threshold (128 KiB at start, raised on the fly
up to 32 MiB by the largest mmapped block freed so far) with a fresh ``mmap`` and unmaps it
when it is freed, and trims the heap's free top back to the system past a trim threshold.
An eager attention's score matrices are megabytes a layer (a 512-token chunk after 512 tokens
of context: 16 MiB), so a step of the numpy backend page-faults its temporaries in afresh
(zeroed by the kernel, 4 KiB at a time) or reuses them depending on what the *process* freed
before: the same step measured 76-127 ms in one run (7,400 page faults or none), and a chunk
at 3,072 tokens of context 264-277 ms with page faults, 211-219 ms without. No cost model can
see a process's malloc history. ``hold_freed_memory`` pins it: no mmapped blocks and no
trimming, so temporaries are page-faulted in once (the first step of their size) and reused
after, as PyTorch's caching allocator and vLLM's preallocated workspaces make a GPU engine
do. ``release`` restores glibc's defaults and returns the held memory once every holder
(several backends may be bound in one process: a cluster's replicas) has released.

Held memory is reused, but the first step that needs more than any before it still grows
the heap, and faults the growth in: a run's first long prompt paid 150-320 ms more over its
eight 512-token chunks than the next one of its length. ``heap_size`` (the heap's size now)
lets calibration measure what that costs a byte, and the simulator prices it
(``RooflineCost.duration``).

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


def hold_freed_memory() -> bool:
    """Serve every block from the heap and never trim it; True where this is glibc."""
    global _holders
    libc = _glibc()
    if libc is None:
        return False
    _holders += 1
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))


def release() -> None:
    """(Once the last holder releases) glibc's defaults back (mmapped large blocks, trimming), and the held memory returned."""
    global _holders
    libc = _glibc()
    _holders = max(_holders - 1, 0)
    if libc is None or _holders:
        return
    libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
    libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM)
    libc.malloc_trim(0)


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
