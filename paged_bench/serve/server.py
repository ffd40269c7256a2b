"""From a resolved config to a running server: blocking (the command) or in a thread.

The config is the benchmark command's (same groups and knobs, built by ``build.build``) plus a
``server`` section; the engine runs on the wall clock. ``start_in_thread`` (or ``serve_in_thread``, from
overrides) serves on a socket bound here (port 0 = any free port), for notebooks and tests.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from paged_bench.build import build
from paged_bench.config import compose_config
from paged_bench.engine import Engine
from paged_bench.errors import check, check_int, check_number
from paged_bench.serve.api import OpenAIServer, create_app
from paged_bench.serve.engine_loop import EngineLoop
from paged_bench.serve.prom import ServerMetrics
from paged_bench.serve.protocol import ServingContext
from paged_bench.serve.text import chat_renderer

# The engine thread drops the GIL in numpy/torch kernels and must get it back soon, not after
# the default 5 ms slice of the HTTP thread. Measured (backend=numpy, 16 req/s, 2 cores, 3 runs
# each): served TTFT p99 130-715 ms -> 22-72 ms; 0.1 ms is worse again (too many switches).
GIL_SWITCH_S = 0.0005
MAX_STEP_RECORDS = 1024  # a server runs for days: keep only the latest step records
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None
    max_waiting: int = 256
    graceful_shutdown_s: float = 5.0
    log_level: str = "info"

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any] | None) -> ServerConfig:
        s = dict(section or {})
        for key, value in s.items():
            check(key in cls.__dataclass_fields__, f"server.{key}", value,
                  f"one of the server options {', '.join(cls.__dataclass_fields__)}")
        cfg = cls(**s)
        check(isinstance(cfg.host, str) and bool(cfg.host), "server.host", cfg.host, "a host name or address")
        check(isinstance(cfg.port, int) and 0 <= cfg.port <= 65535, "server.port", cfg.port, "a port 0-65535 (0 = any free one)")
        check(cfg.model_name is None or (isinstance(cfg.model_name, str) and bool(cfg.model_name)),
              "server.model_name", cfg.model_name, "a non-empty name, or null")
        check_int("server.max_waiting", cfg.max_waiting)
        check_number("server.graceful_shutdown_s", cfg.graceful_shutdown_s)
        check(cfg.log_level in LOG_LEVELS, "server.log_level", cfg.log_level, ", ".join(LOG_LEVELS))
        return cfg


def default_model_name(cfg: Mapping[str, Any]) -> str:
    backend = cfg.get("backend") or {}
    if backend.get("model_path"):
        return Path(str(backend["model_path"])).name
    return f"paged-bench-{backend.get('name', 'model')}"


def build_app(cfg: Mapping[str, Any]) -> tuple[FastAPI, ServerConfig]:
    """The app for a resolved config; raises ConfigError/PluginError before anything runs."""
    server_cfg = ServerConfig.from_mapping(cfg.get("server"))
    check(cfg.get("clock", "wall") in ("wall", "auto"), "clock", cfg.get("clock"), "wall (a server runs in real time)")
    bench = build({**cfg, "clock": "wall"})
    engine = Engine(bench.engine.scheduler, bench.backend, bench.engine.clock, max_step_records=MAX_STEP_RECORDS)
    backend, tokenizer = bench.backend, bench.backend.tokenizer
    ctx = ServingContext(
        model_name=server_cfg.model_name or default_model_name(cfg),
        max_model_len=cfg["max_model_len"],
        vocab_size=backend.vocab_size,
        encode=tokenizer.encode,
        render_chat=chat_renderer(tokenizer),
    )
    metrics = ServerMetrics()
    loop = EngineLoop(engine)
    metrics.attach(loop)
    server = OpenAIServer(loop, ctx, tokenizer.decode, metrics, server_cfg.max_waiting)
    return create_app(server), server_cfg


class _Server(uvicorn.Server):
    """uvicorn's server; on Ctrl-C (or ``stop``) it stops accepting requests, gives those in
    flight ``graceful_shutdown_s`` to finish, then ends the rest with an error event, so that
    no client sees a cut connection. uvicorn's own timeout is only a backstop."""

    def __init__(self, app: FastAPI, cfg: ServerConfig) -> None:
        super().__init__(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, lifespan="on",
                                        timeout_graceful_shutdown=cfg.graceful_shutdown_s + 5.0))
        self.grace = cfg.graceful_shutdown_s

    def handle_exit(self, sig, frame) -> None:
        if not self.should_exit:
            timer = threading.Timer(self.grace, self.config.app.state.server.loop.stop)
            timer.daemon = True
            timer.start()
        super().handle_exit(sig, frame)


def serve(app: FastAPI, cfg: ServerConfig) -> None:
    """Serve until Ctrl-C / SIGTERM, then shut down cleanly."""
    sys.setswitchinterval(GIL_SWITCH_S)
    try:
        _Server(app, cfg).run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it has already handled
        pass


@dataclass
class ServerHandle:
    """A server running in a background thread of this process."""

    server: uvicorn.Server
    thread: threading.Thread
    url: str  # http://host:port

    @property
    def app(self) -> FastAPI:
        return self.server.config.app

    def stop(self, timeout: float = 30.0) -> None:
        self.server.handle_exit(None, None)
        self.thread.join(timeout)


def start_in_thread(app: FastAPI, cfg: ServerConfig, timeout: float = 30.0) -> ServerHandle:
    """Start serving ``app`` in a daemon thread; returns once it accepts requests."""
    sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((cfg.host, cfg.port))
    host, port = sock.getsockname()[:2]
    server = _Server(app, cfg)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="paged-bench-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.01)
    shown = f"[{host}]" if ":" in host else host
    return ServerHandle(server, thread, f"http://{shown}:{port}")


def serve_in_thread(*overrides: str) -> ServerHandle:
    """Serve a config in this process, e.g. from a notebook::

        handle = serve_in_thread("backend=numpy", "server.port=0")
        ...  # requests to handle.url + "/v1"
        handle.stop()
    """
    app, cfg = build_app(compose_config(*overrides, config_name="serve"))
    return start_in_thread(app, cfg)

