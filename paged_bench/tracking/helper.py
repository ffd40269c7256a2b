"""The tracking helper: a local process that keeps mlflow imported and its stores open, and
logs run folders for the commands that ask it to (``uploader`` is the commands' side).

``import mlflow`` and opening a store (a SQLite store checks its schema) cost about two
seconds, several times a default sim run. The first tracked command starts this process; it
serves every later command of the same checkout and Python until it has been idle for
``PAGED_BENCH_TRACKING_IDLE_S`` seconds (default 600), then exits. It listens on a Unix
socket in a private folder (``/tmp/paged_bench-<uid>/``); each connection sends JSON lines
(one request each) and gets one reply line per request, in order. Requests of all
connections are done one at a time. It runs in its own session, so Ctrl-C, ``timeout`` or a
closed terminal that stop a command do not stop the upload of what that command measured.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import paged_bench.tracking  # noqa: F401  (telemetry off before mlflow is imported)
from paged_bench.errors import one_line
from paged_bench.report.document import run_plots
from paged_bench.tracking import store
from paged_bench.tracking.runs import Link, complete_upload, finish_sweep, start_sweep, upload_run

IDLE_ENV = "PAGED_BENCH_TRACKING_IDLE_S"
DEFAULT_IDLE_S = 600.0


class Session:
    """One command's connection: after its store fails once, its later runs are skipped."""

    def __init__(self) -> None:
        self.failed: str | None = None

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "run" and self.failed:
            return {"error": f"skipped: the store failed earlier ({self.failed})"}
        try:
            return OPS[op](request)
        except Exception as e:  # noqa: BLE001  (reported to the command, which warns once)
            error = one_line(e)
            if op != "sweep_finish":
                self.failed = self.failed or error
            return {"error": error}


def _run(request: dict[str, Any]) -> dict[str, Any]:
    run_dir = Path(request["run_dir"])
    if request.get("plots"):  # first: a run whose store fails still gets its plots
        _plots(run_dir)
    parent = Link(**request["parent"]) if request.get("parent") else None
    uri = parent.uri if parent else request["uri"]
    client = store.client(uri)
    experiment = parent.experiment_id if parent else store.experiment_id(client, request["experiment"], uri)
    done = complete_upload(client, experiment, run_dir)
    if done is not None:  # ``sync`` uploaded it as it ended: a second upload would log it twice
        return {"run_id": done.info.run_id, "present": True}
    run_id = upload_run(client, experiment, run_dir, request.get("settings") or {}, parent.run_id if parent else None)
    return {"run_id": run_id}


def _plots(run_dir: Path) -> None:
    try:
        run_plots(run_dir)
    except Exception as e:  # noqa: BLE001  (a plot is not worth a run)
        print(f"warning: plots of {run_dir} failed: {type(e).__name__}: {e}", file=sys.stderr)


def _sweep_start(request: dict[str, Any]) -> dict[str, Any]:
    client = store.client(request["uri"])
    exp = store.experiment_id(client, request["experiment"], request["uri"])
    run_id = start_sweep(client, exp, request["run_name"], request["tags"], request["params"], request["experiment"])
    return {"link": asdict(Link(request["uri"], exp, run_id))}


def _sweep_finish(request: dict[str, Any]) -> dict[str, Any]:
    link = request["link"]
    view = finish_sweep(store.client(link["uri"]), link["run_id"], request["status"],
                        [Path(p) for p in request["artifacts"]], request["tags"])  # fmt: skip
    return {"view": view}


def _ping(request: dict[str, Any]) -> dict[str, Any]:
    return {"pid": os.getpid()}


OPS = {"run": _run, "sweep_start": _sweep_start, "sweep_finish": _sweep_finish, "ping": _ping}


class Server:
    def __init__(self, path: Path, idle_s: float) -> None:
        self.path, self.idle_s = path, idle_s
        self.lock = threading.Lock()  # one request at a time, whichever command sent it
        self.active = 0
        self.last = time.monotonic()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.staging = path.with_name(f".{path.name}.{os.getpid()}")  # where it binds before it listens

    def bind(self) -> None:
        """Bind and listen under another name, then take the socket's: bind makes the file before
        listen, and a command that saw the file in between was refused."""
        self.path.unlink(missing_ok=True)  # a dead helper's socket (the caller holds the start lock)
        self.sock.bind(str(self.staging))
        self.sock.listen(64)
        os.replace(self.staging, self.path)

    def _connection(self, conn: socket.socket) -> None:
        session = Session()
        try:
            with conn, conn.makefile("r") as reader, conn.makefile("w") as writer:
                for line in reader:
                    with self.lock:
                        reply = session.handle(json.loads(line))
                        self.last = time.monotonic()
                    writer.write(json.dumps(reply) + "\n")
                    writer.flush()
        except (OSError, ValueError):
            pass  # the command went away (killed): what it handed over is logged all the same
        finally:
            with self.lock:
                self.active -= 1
                self.last = time.monotonic()

    def _idle_watch(self) -> None:
        while True:
            time.sleep(min(5.0, self.idle_s / 2))
            with self.lock:
                if self.active == 0 and time.monotonic() - self.last > self.idle_s:
                    self._exit()

    def _exit(self) -> None:
        """Leave no socket behind (the lock file stays: a command may hold it); the caller
        holds ``lock``, so no request is half done."""
        self.path.unlink(missing_ok=True)
        self.staging.unlink(missing_ok=True)  # a SIGTERM before the socket took its name
        log = self.path.with_suffix(".log")
        if log.is_file() and not log.stat().st_size:
            log.unlink()
        os._exit(0)

    def _terminate(self, signum: int, frame: object) -> None:
        # a thread of its own: the main thread may hold the lock, a connection's surely does
        threading.Thread(target=self._exit_after_request).start()

    def _exit_after_request(self) -> None:
        with self.lock:  # the run being logged is logged whole; the requests waiting are not taken
            self._exit()

    def serve(self) -> None:
        threading.Thread(target=self._idle_watch, daemon=True).start()
        while True:
            conn, _ = self.sock.accept()
            with self.lock:
                self.active += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    args = argparse.ArgumentParser(prog="python -m paged_bench.tracking.helper")
    args.add_argument("--socket", type=Path, required=True)
    args.add_argument("--idle", type=float, default=float(os.environ.get(IDLE_ENV, DEFAULT_IDLE_S)))
    opts = args.parse_args(argv)
    server = Server(opts.socket, opts.idle)
    # the handler first: a SIGTERM just after the socket appears must still take the socket away
    signal.signal(signal.SIGTERM, server._terminate)
    server.bind()  # commands can connect now; their requests wait for the import below
    with server.lock:
        from mlflow import MlflowClient  # noqa: F401
    server.serve()


if __name__ == "__main__":
    main()
