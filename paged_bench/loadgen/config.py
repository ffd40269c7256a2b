"""The ``target`` config section of a remote run (conf/target/openai.yaml), checked."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from paged_bench.errors import check, check_int, check_number

ENDPOINTS = ("completions", "chat")
MAX_WARMUP = 1000  # sent one after another before the timed run


def _is_http_url(value: Any) -> bool:
    """An http(s) URL with a host and a port a socket takes (99999 and 'abc' were tracebacks)."""
    try:
        url = urlsplit(str(value))
        return url.scheme in ("http", "https") and bool(url.hostname) and (url.port is None or url.port >= 0)
    except ValueError:  # a port out of range or not a number, a broken IPv6 host
        return False


@dataclass(frozen=True)
class TargetConfig:
    name: str = "openai"
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"  # the key itself never sits in a config (it is logged)
    endpoint: str = "completions"
    concurrency: int | None = None
    timeout_s: float = 300.0
    warmup: int = 1
    ignore_eos: bool = True
    spawn: bool = False  # always on for name "served"
    spawn_timeout_s: float = 300.0

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any]) -> TargetConfig:
        names = [f.name for f in fields(cls)]
        for key, value in section.items():
            check(key in names, f"target.{key}", value, f"one of the target options {', '.join(names)}")
        cfg = cls(**section)
        check(cfg.name in ("openai", "served"), "target", cfg.name, "engine, openai or served")
        check(_is_http_url(cfg.base_url), "target.base_url", cfg.base_url,
              "an http(s) URL of an OpenAI-compatible API with a port from 0 to 65535, e.g. http://127.0.0.1:8000/v1")
        api_root = _api_root(cfg.url)
        check(api_root == cfg.url, "target.base_url", cfg.base_url,
              f"the API's root, not one endpoint's URL: {api_root} (target.endpoint picks completions or chat)")
        check(cfg.model is None or (isinstance(cfg.model, str) and bool(cfg.model)), "target.model", cfg.model,
              "a model name, or null (the server's first model)")  # fmt: skip
        check(isinstance(cfg.api_key_env, str) and bool(cfg.api_key_env), "target.api_key_env", cfg.api_key_env,
              "the name of an environment variable holding the API key")
        key = os.environ.get(cfg.api_key_env, "")
        # an HTTP header holds ASCII; the key itself is never printed (configs and errors are logged)
        check(key.isascii() and key.isprintable(), "target.api_key_env", cfg.api_key_env,
              "a variable whose key is printable ASCII (this one holds other characters)")  # fmt: skip
        check(cfg.endpoint in ENDPOINTS, "target.endpoint", cfg.endpoint, " or ".join(ENDPOINTS))
        if cfg.concurrency is not None:
            check_int("target.concurrency", cfg.concurrency)
        check_number("target.timeout_s", cfg.timeout_s, 0, strict=True)
        check_int("target.warmup", cfg.warmup, 0, MAX_WARMUP)
        check(isinstance(cfg.ignore_eos, bool), "target.ignore_eos", cfg.ignore_eos, "true or false")
        check(isinstance(cfg.spawn, bool), "target.spawn", cfg.spawn, "true or false")
        check(cfg.spawn or cfg.name != "served", "target.spawn", cfg.spawn,
              "true with target=served (it starts its own server; target=openai reaches one already running)")
        check_number("target.spawn_timeout_s", cfg.spawn_timeout_s, 0, strict=True)
        return cfg

    @property
    def spawns(self) -> bool:
        return self.spawn or self.name == "served"

    @property
    def url(self) -> str:
        return str(self.base_url).rstrip("/")

    @property
    def headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}


def _api_root(url: str) -> str:
    """``url`` less an endpoint's path (``.../v1/chat/completions``: the client adds it to the
    API's root, and every request went to ``.../chat/completions/completions``, a 404)."""
    path = urlsplit(url).path
    for endpoint in ("/chat/completions", "/completions", "/models"):
        if path.endswith(endpoint):
            return url[: len(url) - len(endpoint)]
    return url
