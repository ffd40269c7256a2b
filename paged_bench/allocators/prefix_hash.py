"""Block hashes for the prefix cache: a chain over (parent hash, block tokens, extra keys).

``builtin`` is Python's ``hash()`` of that tuple: fast, and the same in every process (ints
and tuples of ints are not salted), so simulated runs stay reproducible; it is 64 bits and
not collision-resistant. ``sha256`` hashes the pickled tuple, as vLLM v1's ``sha256`` block
hash does (vLLM moved to it after advisory GHSA-rm76-4mrf-v9r8): use it wherever users share
a cache (the server's default), where a crafted prompt must not collide with another user's
blocks. The first block's parent is a fixed seed, so equal prompts hash equally across runs.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Hashable
from typing import Any

BlockHasher = Callable[[Hashable, tuple[int, ...]], Hashable]

ROOT_SEED = b"paged_bench prefix cache"


def builtin_hash(parent: Hashable, tokens: tuple[int, ...], extra_keys: Any = None) -> int:
    return hash((parent, tokens, extra_keys))


def sha256_hash(parent: Hashable, tokens: tuple[int, ...], extra_keys: Any = None) -> bytes:
    return hashlib.sha256(pickle.dumps((parent, tokens, extra_keys), protocol=pickle.HIGHEST_PROTOCOL)).digest()


PREFIX_HASHES: dict[str, tuple[BlockHasher, Hashable]] = {
    "builtin": (builtin_hash, hash(ROOT_SEED)),
    "sha256": (sha256_hash, hashlib.sha256(ROOT_SEED).digest()),
}
