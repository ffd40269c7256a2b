"""The command's side of the tracking helper (``helper``): connect to it, starting it if no
helper of this checkout and Python is running, and hand it run folders to log.

A single run waits for its reply before the command exits; a sweep's jobs do not wait, and
the sweep waits for all of them when it ends (``close``): a finished command's results are in
the store, and tracking costs the command about the time of the upload itself. The command
connects as it starts (``prestart``), so a helper that must be started imports mlflow while
the job runs.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from paged_bench.tracking import store

START_TIMEOUT_S = 60.0
_started: list[subprocess.Popen] = []  # helpers this process started (kept: each outlives the command)


class UploadError(Exception):
    """The helper could not log something; its message is the store's one-line error."""

    names_its_cause = True  # "ValueError: ...", as the helper saw it


def helper_folder() -> Path:
    folder = Path(tempfile.gettempdir()) / f"paged_bench-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def helper_key() -> str:
    """One helper per Python, code version and MLflow settings: a helper never runs old code."""
    package = Path(__file__).resolve().parents[1]
    code = max((p.stat().st_mtime_ns for p in package.rglob("*.py")), default=0)
    mlflow_env = sorted((k, v) for k, v in os.environ.items() if k.startswith("MLFLOW_"))
    return hashlib.sha1(repr((sys.executable, str(package), code, mlflow_env)).encode()).hexdigest()[:16]


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        raise
    return sock


def wait_for_helper() -> None:
    """Let a running helper finish the upload it is doing (``sync`` must not race it)."""
    with contextlib.suppress(OSError, ValueError):
        with _connect(helper_folder() / f"{helper_key()}.sock") as sock, sock.makefile("r") as reader:
            sock.sendall(b'{"op": "ping"}\n')
            reader.readline()


def connect() -> socket.socket:
    """A connection to the running helper, started first if there is none."""
    folder, key = helper_folder(), helper_key()
    path = folder / f"{key}.sock"
    with contextlib.suppress(OSError):
        return _connect(path)
    with (folder / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one command starts it; the others wait and connect
        with contextlib.suppress(OSError):
            return _connect(path)
        with (folder / f"{key}.log").open("a") as log:
            _started.append(subprocess.Popen([sys.executable, "-m", "paged_bench.tracking.helper", "--socket", str(path)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, cwd=folder,
                             start_new_session=True, close_fds=True))  # fmt: skip  (cwd: one that stays)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                return _connect(path)
            except OSError as e:
                if time.monotonic() > deadline:
                    raise UploadError(f"the tracking helper did not start (see {folder / key}.log)") from e
                time.sleep(0.02)


class Uploader:
    """One connection: requests in, replies out, in order."""

    def __init__(self) -> None:
        try:
            self._sock = connect()
        except OSError as e:
            raise UploadError(f"cannot reach the tracking helper: {e}") from e
        self._reader = self._sock.makefile("r")
        self._sent = 0
        self._answered = 0
        self.failures: list[str] = []  # errors of requests nobody waited for

    def _reply(self) -> dict[str, Any]:
        line = self._reader.readline()
        if not line:
            raise UploadError("the tracking helper went away")
        self._answered += 1
        return json.loads(line)

    def request(self, op: str, wait: bool = True, **fields: Any) -> dict[str, Any] | None:
        """Send ``op``; with ``wait``, its reply (raises UploadError on failure)."""
        try:
            self._sock.sendall((json.dumps({"op": op, **fields}, default=str) + "\n").encode())
        except OSError as e:
            raise UploadError(f"the tracking helper went away: {e}") from e
        self._sent += 1
        if not wait:
            return None
        while self._answered < self._sent - 1:  # earlier requests nobody waited for
            self._note(self._reply())
        reply = self._reply()
        if "error" in reply:
            raise UploadError(reply["error"])
        return reply

    def _note(self, reply: dict[str, Any]) -> None:
        if "error" in reply:
            self.failures.append(reply["error"])

    def close(self) -> list[str]:
        """Wait for every request to be done; the errors of those nobody waited for."""
        try:
            while self._answered < self._sent:
                self._note(self._reply())
        except (UploadError, OSError, ValueError) as e:
            self.failures.append(str(e))
        self._reader.close()
        self._sock.close()
        return self.failures


_shared: Uploader | None = None


def shared() -> Uploader:
    """This process's connection, made on first use and closed (waited for) at exit."""
    global _shared
    if _shared is None:
        _shared = Uploader()
        atexit.register(close_shared)
    return _shared


def prestart(argv: list[str]) -> None:
    """Connect as the command starts (a helper that must be started then imports mlflow while
    the job runs), unless the command line says it will not track."""
    skip = ("tracking.enabled=false", "--help", "-h", "--hydra-help", "--info", "--shell-completion")
    if any(a in skip or a.startswith(("--cfg", "-c")) for a in argv):
        return
    with contextlib.suppress(UploadError):  # the job will say so, once, if tracking fails
        shared()


def close_shared() -> None:
    """Wait for the helper; one warning if something it was given could not be logged."""
    global _shared
    uploader, _shared = _shared, None
    if uploader is not None:
        failures = uploader.close()
        if failures:
            store.report_failure(UploadError(failures[0]), "their run folders")
