"""From a resolved config to a running server: blocking (the command) or in a thread.

The config is the benchmark command's (same groups and knobs, built by ``build.build``) plus a
``server`` section; the engine runs on the wall clock. ``start_in_thread`` (or ``serve_in_thread``, from
overrides) serves on a socket bound here (port 0 = any free port), for notebooks and tests.
Ctrl-C and SIGTERM both drain (``graceful_shutdown_s``) and exit 0. Binding beyond loopback
without an API key logs a warning.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import signal
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

from paged_bench.cluster.spec import cluster_spec
from paged_bench.core.engine import Engine
from paged_bench.errors import ConfigError, check, check_int, check_number
from paged_bench.model.tokenizers import TOKENIZER_CHOICES, serving_tokenizer
from paged_bench.run.bench import build_engine
from paged_bench.run.compose import check_settings, compose_config
from paged_bench.run.frontend import FrontendSettings
from paged_bench.serve.api import OpenAIServer, create_app
from paged_bench.serve.engine_loop import EngineLoop
from paged_bench.serve.limits import Guard, GuardConfig, bounded_head_protocol
from paged_bench.serve.prom import ServerMetrics
from paged_bench.serve.protocol import Limits, ServingContext
from paged_bench.serve.text import chat_renderer

log = logging.getLogger("paged_bench.serve")
API_KEY_ENV = "PAGED_BENCH_API_KEY"

# The engine thread drops the GIL in numpy/torch kernels and must get it back soon, not after
# the default 5 ms slice of the HTTP thread. Measured (backend=numpy, 16 req/s, 2 cores, 3 runs
# each): served TTFT p99 130-715 ms -> 22-72 ms; 0.1 ms is worse again (too many switches).
GIL_SWITCH_S = 0.0005
MAX_STEP_RECORDS = 1024  # a server runs for days: keep only the latest step records
MAX_GRACE_S = 3600  # the longest drain on Ctrl-C: an hour; longer is no drain but a hang
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None
    max_waiting: int = 256
    graceful_shutdown_s: float = 5.0
    log_level: str = "info"
    tokenizer: str = "auto"
    api_key: str | None = None
    max_body_bytes: int = 2 * 1024 * 1024
    body_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    max_stop: int = Limits.max_stop
    max_stop_chars: int = Limits.max_stop_chars
    max_prompts: int = Limits.max_prompts
    max_choices: int = Limits.max_choices
    max_logprobs: int = Limits.max_logprobs
    max_prefills_per_request: int = 1

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any] | None) -> ServerConfig:
        s = dict(section or {})
        for key, value in s.items():
            check(key in cls.__dataclass_fields__, f"server.{key}", value,
                  f"one of the server options {', '.join(cls.__dataclass_fields__)}")
        cfg = cls(**s)
        check(isinstance(cfg.host, str) and bool(cfg.host), "server.host", cfg.host, "a host name or address")
        # a bool is an int to Python: true bound port 1, false any free port
        port_ok = isinstance(cfg.port, int) and not isinstance(cfg.port, bool) and 0 <= cfg.port <= 65535
        check(port_ok, "server.port", cfg.port, "a port 0-65535 (0 = any free one)")
        check(cfg.model_name is None or (isinstance(cfg.model_name, str) and bool(cfg.model_name)),
              "server.model_name", cfg.model_name, "a non-empty name, or null")
        check_int("server.max_waiting", cfg.max_waiting)
        # a grace past what a timer holds (1e18) raised OverflowError in its thread at Ctrl-C
        grace_ok = check_number("server.graceful_shutdown_s", cfg.graceful_shutdown_s) <= MAX_GRACE_S
        check(grace_ok, "server.graceful_shutdown_s", cfg.graceful_shutdown_s, f"a number from 0 to {MAX_GRACE_S}")
        check(cfg.log_level in LOG_LEVELS, "server.log_level", cfg.log_level, ", ".join(LOG_LEVELS))
        check(cfg.tokenizer in TOKENIZER_CHOICES, "server.tokenizer", cfg.tokenizer, ", ".join(TOKENIZER_CHOICES))
        check(cfg.api_key is None or (isinstance(cfg.api_key, str) and bool(cfg.api_key)), "server.api_key",
              "<hidden>", "a non-empty string, or null")  # fmt: skip
        for key in ("max_body_bytes", "max_header_bytes", "max_stop", "max_stop_chars", "max_prompts", "max_choices"):
            check_int(f"server.{key}", getattr(cfg, key))
        check_int("server.max_logprobs", cfg.max_logprobs, 0)
        check_int("server.max_prefills_per_request", cfg.max_prefills_per_request)
        for key in ("body_timeout_s", "header_timeout_s"):
            check_number(f"server.{key}", getattr(cfg, key), 0, strict=True)
        return cfg

    @property
    def limits(self) -> Limits:
        return Limits(self.max_stop, self.max_stop_chars, self.max_prompts, self.max_choices, self.max_logprobs)

    def resolved_api_key(self) -> str | None:
        """``server.api_key``, else ``$PAGED_BENCH_API_KEY`` (as vLLM: --api-key, else VLLM_API_KEY)."""
        return self.api_key or os.environ.get(API_KEY_ENV) or None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_model_name(cfg: Mapping[str, Any]) -> str:
    backend = cfg.get("backend") or {}
    if backend.get("model_path"):
        return Path(str(backend["model_path"])).name
    return f"paged-bench-{backend.get('name', 'model')}"


def build_app(cfg: Mapping[str, Any]) -> tuple[FastAPI, ServerConfig]:
    """The app for a resolved config; raises ConfigError/PluginError before anything runs."""
    server_cfg = ServerConfig.from_mapping(cfg.get("server"))
    check(cfg.get("clock", "wall") in ("wall", "auto"), "clock", cfg.get("clock"), "wall (a server runs in real time)")
    spec = cluster_spec(cfg)  # the cluster and router groups come with the config; one engine serves
    check(spec is None, "cluster", f"{spec.num_replicas} replicas" if spec else None,
          "one replica: the server runs one engine (a cluster is simulated by python -m paged_bench)")  # fmt: skip
    frontend = FrontendSettings.from_config(cfg.get("frontend"))  # priced for in-process runs; this one is real
    frontend.refuse_priced("frontend=none for the server (its own HTTP front end is the real one)")
    check_settings(cfg, "serve")  # then the engine's own, without the server's section
    engine_cfg = {**{k: v for k, v in cfg.items() if k != "server"}, "clock": "wall"}
    built, _ = build_engine(engine_cfg)  # no workload: clients bring the requests
    engine = Engine(built.scheduler, built.backend, built.clock, max_step_records=MAX_STEP_RECORDS)
    backend = built.backend
    tokenizer = serving_tokenizer(server_cfg.tokenizer, backend.tokenizer, backend.vocab_size)
    ctx = ServingContext(
        model_name=server_cfg.model_name or default_model_name(cfg),
        max_model_len=built.scheduler.max_model_len,  # auto: the model's
        vocab_size=backend.vocab_size,
        encode=tokenizer.encode,
        render_chat=chat_renderer(tokenizer),
        limits=server_cfg.limits,
        computes_logprobs=hasattr(backend, "logprob_sinks"),
        max_token_bytes=getattr(tokenizer, "max_token_bytes", None),  # a plugin's tokenizer may not say
    )
    metrics = ServerMetrics()
    loop = EngineLoop(engine, max_prefills=server_cfg.max_prefills_per_request)
    metrics.attach(loop)
    server = OpenAIServer(loop, ctx, tokenizer.decode, metrics, server_cfg.max_waiting)
    app = create_app(server)
    api_key = server_cfg.resolved_api_key()
    app.add_middleware(Guard, config=GuardConfig(api_key, server_cfg.max_body_bytes, server_cfg.body_timeout_s))
    if not api_key and not is_loopback(server_cfg.host):
        log.warning("serving on %s without an API key: anyone who can reach it can use it "
                    "(set server.api_key or $%s)", server_cfg.host, API_KEY_ENV)  # fmt: skip
    return app, server_cfg


class _Server(uvicorn.Server):
    """uvicorn's server; on Ctrl-C (or ``stop``) it stops accepting requests, gives those in
    flight ``graceful_shutdown_s`` to finish, then ends the rest with an error event, so that
    no client sees a cut connection. uvicorn's own timeout is only a backstop."""

    def __init__(self, app: FastAPI, cfg: ServerConfig) -> None:
        super().__init__(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, lifespan="on",
                                        timeout_graceful_shutdown=cfg.graceful_shutdown_s + 5.0,
                                        http=bounded_head_protocol(cfg.header_timeout_s, cfg.max_header_bytes)))  # fmt: skip
        self.grace = cfg.graceful_shutdown_s

    def handle_exit(self, sig, frame) -> None:
        if not self.should_exit:
            timer = threading.Timer(self.grace, self.config.app.state.server.loop.stop)
            timer.daemon = True
            timer.start()
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signals it caught once it has stopped; SIGTERM's default action
        # would then kill the process (exit 143) after a clean drain: it has been handled
        self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]


def listen_socket(cfg: ServerConfig) -> socket.socket:
    """The server's socket, bound before the engine is built, as vLLM's ``setup_server`` does:
    a port in use, or a host that is not this machine's, fails in one line before any model
    loads (not in uvicorn's log once it has). Port 0 takes any free port."""
    sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((cfg.host, cfg.port))
    except OSError as e:
        sock.close()
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            raise ConfigError("server.port", cfg.port, f"a port this process may listen on at {cfg.host} "
                              f"({e.strerror}; 0 takes any free port)") from None  # fmt: skip
        raise ConfigError("server.host", cfg.host, f"a name or address of this machine ({e.strerror})") from None
    # listening from here on: a client that connects once the URL is printed waits in the
    # backlog while the engine is built, rather than being refused
    sock.listen(2048)
    return sock


def listen_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(app: FastAPI, cfg: ServerConfig, sock: socket.socket) -> None:
    """Serve on ``sock`` until Ctrl-C / SIGTERM, then shut down cleanly."""
    sys.setswitchinterval(GIL_SWITCH_S)
    try:
        _Server(app, cfg).run(sockets=[sock])
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
    sock = listen_socket(cfg)
    url = listen_url(sock)
    server = _Server(app, cfg)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="paged-bench-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {url}")
        time.sleep(0.01)
    return ServerHandle(server, thread, url)


def serve_in_thread(*overrides: str) -> ServerHandle:
    """Serve a config in this process, e.g. from a notebook::

        handle = serve_in_thread("backend=numpy", "server.port=0")
        ...  # requests to handle.url + "/v1"
        handle.stop()
    """
    app, cfg = build_app(compose_config(*overrides, config_name="serve"))
    return start_in_thread(app, cfg)

