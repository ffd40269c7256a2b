"""Our own server as a subprocess, for self-contained served runs (``target.spawn=true``).

The job's resolved config (its scheduler, allocator, backend and top-level knobs) is written
to ``<run_dir>/server/serve_config.yaml`` with a ``server`` section on a free loopback port,
and ``python -m paged_bench.serve`` runs it; its output goes to ``<run_dir>/server/server.log``.
The load generator waits for ``/health``, runs, then stops the server with SIGINT (Ctrl-C),
the clean shutdown path.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from omegaconf import OmegaConf

from paged_bench.errors import ConfigError, PagedBenchError
from paged_bench.loadgen.config import TargetConfig

HOST = "127.0.0.1"
_NOT_SERVER_KEYS = ("target", "hydra", "tracking")  # build() still wants the workload section


class ServerStartError(PagedBenchError):
    """The spawned server did not come up."""


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_server_section(section: Mapping[str, Any] | None) -> None:
    """The spawned server takes the job's ``+server.*`` settings, but where it listens is its
    own to pick (a ``+server.port`` was dropped without a word)."""
    for key in ("host", "port"):
        if key in (section or {}):
            raise ConfigError(f"server.{key}", section[key],
                              f"left out with target=served, whose server listens on a free loopback port; to "
                              f"choose the {key}, start python -m paged_bench.serve server.{key}=... and aim "
                              "target=openai target.base_url=http://HOST:PORT/v1 at it")  # fmt: skip


def server_config(cfg: Mapping[str, Any], port: int, server_dir: Path) -> dict[str, Any]:
    """The job's config as the server's: the same engine, on a loopback port."""
    out = {k: v for k, v in cfg.items() if k not in _NOT_SERVER_KEYS}
    out["clock"] = "wall"
    out["server"] = {"log_level": "warning", **(cfg.get("server") or {}), "host": HOST, "port": port}
    out["hydra"] = {"run": {"dir": str(server_dir)}, "output_subdir": None}
    return out


def _tail(path: Path, n: int = 3) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.exists() else []
    return " | ".join(lines[-n:]) or "(no output)"


@contextmanager
def spawned_server(cfg: Mapping[str, Any], target: TargetConfig, run_dir: Path) -> Iterator[TargetConfig]:
    """Run our server for ``cfg``; yields ``target`` pointed at it."""
    server_dir = (run_dir / "server").resolve()
    server_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (server_dir / "serve_config.yaml").write_text(OmegaConf.to_yaml(server_config(cfg, port, server_dir)))
    log_path = server_dir / "server.log"
    cmd = [sys.executable, "-m", "paged_bench.serve", f"--config-path={server_dir}", "--config-name=serve_config"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://{HOST}:{port}"
    try:
        _wait_healthy(proc, url, target.spawn_timeout_s, log_path)
        yield replace(target, base_url=f"{url}/v1")
    finally:
        _stop(proc)


def _wait_healthy(proc: subprocess.Popen, url: str, timeout: float, log_path: Path) -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per probe in the run's output
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(f"the spawned server exited with code {proc.returncode}: {_tail(log_path)}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise ServerStartError(f"the spawned server did not answer {url}/health within {timeout:g} s: {_tail(log_path)}")


def _stop(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
