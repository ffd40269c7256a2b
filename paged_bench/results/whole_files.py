"""Files written whole: through a temporary file beside the target, renamed over it, so a
reader in another process, or whatever a process killed mid-write leaves, sees the old file or
the new one, never half of one. A job's record is read back by ``sync`` after its process was
killed; a sweep's by its jobs as they start; the tokenizer cache by concurrent first uses. A
write that fails (a full disk) leaves no temporary file, and its error names the target."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO


def write_whole(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole (a temporary name of its own per call: processes and
    threads writing the same file at once each rename a complete one over it)."""
    with opened_whole(path) as f:
        f.write(text)
    return path


@contextmanager
def opened_whole(path: Path, newline: str | None = None) -> Iterator[IO[str]]:
    """A text file to write ``path`` through: renamed over it once the block ends, removed if
    the block (or closing the file: a full disk) fails. An OSError names ``path``, not the
    temporary name a reader never sees."""
    try:
        temp, fd = _create_beside(path)
    except OSError as e:
        _naming(e, path, None)
        raise
    try:
        with os.fdopen(fd, "w", newline=newline) as f:  # closing flushes: where ENOSPC often comes
            yield f
        os.replace(temp, path)
    except BaseException as e:
        with suppress(OSError):  # a second failure must not hide the first
            temp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            _naming(e, path, temp)
        raise


def _naming(error: OSError, path: Path, temp: Path | None) -> None:
    """Make ``error`` name ``path`` where it named nothing or the temporary file."""
    if error.filename is None or (temp is not None and error.filename == str(temp)):
        error.filename = str(path)  # (filename2, os.replace's, stays: once set, None would show)


def _create_beside(path: Path) -> tuple[Path, int]:
    """A new empty file beside ``path`` with a name of its own, and its descriptor. Made with
    the umask's mode, as ``path`` would be (tempfile's are 0600: a shared run folder would turn
    unreadable to the others who read it)."""
    while True:
        temp = path.parent / f".{path.name}.{secrets.token_hex(4)}"
        try:
            return temp, os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:  # another writer's, this instant: draw again
            continue


def cannot_write(error: OSError, where: Path | str | None = None) -> str:
    """``error`` as one line: ``cannot write <path>: <reason>``; the path the OS named, else
    ``where``."""
    path = error.filename if error.filename is not None else where
    reason = error.strerror or str(error) or type(error).__name__
    return f"cannot write {os.fsdecode(path)}: {reason}" if path is not None else f"cannot write: {reason}"


def folder_name(name: str) -> str:
    """``name`` (an experiment's) as one folder name: nothing that climbs out (``..``, ``/``) or
    that a file system refuses."""
    return re.sub(r"[^\w.-]", "_", name).lstrip(".") or "_"
