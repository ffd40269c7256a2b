"""Files written whole: through a temporary file beside the target, renamed over it, so a
reader in another process, or whatever a process killed mid-write leaves, sees the old file or
the new one, never half of one. A job's record is read back by ``sync`` after its process was
killed; a sweep's by its jobs as they start; the tokenizer cache by concurrent first uses."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path


def write_whole(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole (a temporary name of its own per call: processes and
    threads writing the same file at once each rename a complete one over it)."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as f:
        f.write(text)
    os.replace(f.name, path)
    return path


def folder_name(name: str) -> str:
    """``name`` (an experiment's) as one folder name: nothing that climbs out (``..``, ``/``) or
    that a file system refuses."""
    return re.sub(r"[^\w.-]", "_", name).lstrip(".") or "_"
