"""Block hashes for the prefix cache: a chain over (parent hash, block tokens, extra keys).

``builtin`` is Python's ``hash()`` of that tuple: fast, and the same in every process (ints
and tuples of ints are not salted), so simulated runs stay reproducible; it is 64 bits and
not collision-resistant. ``sha256`` hashes the pickled tuple, as vLLM v1's ``sha256`` block
hash does (vLLM's default since v0.10.2; advisory GHSA-rm76-4mrf-v9r8 showed collisions made on
purpose): use it wherever users share
a cache (the server's default), where a crafted prompt must not collide with another user's
blocks. The first block's parent is a fixed seed, so equal prompts hash equally across runs
(vLLM's is random per process unless ``PYTHONHASHSEED`` is set).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Hashable
from typing import Any

# a block's key is the tuple (parent hash, block tokens, extra keys); no extra keys here: an
# empty tuple, not None (hash(None) is its address until Python 3.12: it differs per process)
BlockHasher = Callable[[tuple[Hashable, tuple[int, ...], Any]], Hashable]
NO_EXTRA_KEYS: tuple = ()

ROOT_SEED = b"paged_bench prefix cache"


def sha256_hash(key: tuple[Hashable, tuple[int, ...], Any]) -> bytes:
    return hashlib.sha256(pickle.dumps(key, protocol=pickle.HIGHEST_PROTOCOL)).digest()


_ROOT_DIGEST = hashlib.sha256(ROOT_SEED).digest()

PREFIX_HASHES: dict[str, tuple[BlockHasher, Hashable]] = {
    # the C builtin itself, no Python call per block; the root is an int, as hash() of
    # bytes would differ per process (PYTHONHASHSEED) while ints and tuples of ints do not
    "builtin": (hash, int.from_bytes(_ROOT_DIGEST[:8], "big")),
    "sha256": (sha256_hash, _ROOT_DIGEST),
}
