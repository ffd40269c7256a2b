"""What one client may cost the server, enforced before a request reaches a route.

``Guard`` is a pure ASGI middleware (streams pass through it untouched):

- the API key (``server.api_key`` or ``$PAGED_BENCH_API_KEY``): ``/v1/*`` needs
  ``Authorization: Bearer <key>``, else 401 (as vLLM's ``AuthenticationMiddleware``: only
  ``/v1`` paths, ``OPTIONS`` exempt, constant-time comparison);
- ``Content-Type`` of a POST must be JSON (or absent: then it is read as JSON), else 400, and
  its ``Content-Encoding`` none or ``identity``, else 415 (a compressed body is not inflated);
- the body is at most ``server.max_body_bytes`` (413, from ``Content-Length`` before reading,
  or as soon as a chunked body passes the bound) and must arrive within
  ``server.body_timeout_s`` (408);
- any exception a route lets through becomes an OpenAI-shaped 500 (``errors.internal``),
  answered rather than re-raised, so the keep-alive connection survives.

``BoundedHeadProtocol`` is uvicorn's HTTP protocol with bounds on a request's head (its
request line and headers): a deadline (``server.header_timeout_s``: a client that sends them
slowly, or connects and sends nothing, is disconnected instead of holding a connection open
forever) and a size (``server.max_header_bytes``: 431, then the connection is closed; the
parser joins a header's pieces by copying, so an unbounded header costs the event loop, and
every stream on it, time that grows with its square).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from paged_bench.serve import errors
from paged_bench.serve.errors import Refused
from paged_bench.serve.protocol import RequestError

JSON_TYPES = ("application/json",)
LINGER_S = 1.0  # a connection refused for its head is closed this long after the answer


@dataclass(frozen=True)
class GuardConfig:
    api_key: str | None
    max_body_bytes: int
    body_timeout_s: float


def _raw_header(scope: dict, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def _header(scope: dict, name: bytes) -> str | None:
    value = _raw_header(scope, name)
    return None if value is None else value.decode("latin-1")


JSON_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})  # the routes that read a JSON body


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return True
    mime = content_type.split(";")[0].strip().lower()
    return mime in JSON_TYPES or (mime.startswith("application/") and mime.endswith("+json"))


class Guard:
    def __init__(self, app: Callable, config: GuardConfig) -> None:
        self.app, self.cfg = app, config

    def _check_headers(self, scope: dict) -> None:
        cfg = self.cfg
        if cfg.api_key and scope["path"].startswith("/v1") and scope["method"] != "OPTIONS":
            # bytes as sent: clients (curl, httpx) send a non-ASCII key in UTF-8
            given = _raw_header(scope, b"authorization") or b""
            if not hmac.compare_digest(given, f"Bearer {cfg.api_key}".encode()):
                raise Refused(RequestError("missing or wrong API key: send 'Authorization: Bearer <key>'",
                                            status=401))  # fmt: skip
        if scope["method"] == "POST" and scope["path"] in JSON_ROUTES:  # elsewhere: the router's 404 or 405
            content_type = _header(scope, b"content-type")
            if not _is_json(content_type):
                raise Refused(RequestError(f"Content-Type must be application/json, got {content_type!r}"))
            # nothing here inflates a body: a compressed one would fail as "not JSON", naming nothing
            encoding = _header(scope, b"content-encoding")
            if encoding is not None and encoding.strip().lower() not in ("", "identity"):
                raise Refused(RequestError(f"Content-Encoding {encoding!r} is not supported; send the body "
                                            "uncompressed (identity)", status=415))  # fmt: skip
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > cfg.max_body_bytes:
            raise Refused(self._too_large(int(length)))

    def _too_large(self, size: int) -> RequestError:
        return RequestError(f"the request body has {size} bytes or more; at most {self.cfg.max_body_bytes}",
                            status=413)  # fmt: skip

    def _bounded(self, receive: Callable) -> Callable:
        """``receive`` that enforces the body's size and arrival deadline."""
        cfg, state = self.cfg, {"size": 0, "done": False}
        deadline = anyio.current_time() + cfg.body_timeout_s

        async def bounded_receive() -> dict:
            if state["done"]:
                return await receive()
            try:
                with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                    message = await receive()
            except TimeoutError:
                raise Refused(RequestError(f"the request body did not arrive within {cfg.body_timeout_s} s",
                                            status=408)) from None  # fmt: skip
            if message["type"] == "http.request":
                state["size"] += len(message.get("body", b""))
                if state["size"] > cfg.max_body_bytes:
                    raise Refused(self._too_large(state["size"]))
                state["done"] = not message.get("more_body", False)
            return message

        return bounded_receive

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] == "POST" and _raw_header(scope, b"content-type") is None:
            # a body without a Content-Type is JSON here (curl -d without -H); FastAPI would
            # hand it on as bytes, so say so for it
            scope = {**scope, "headers": [*scope["headers"], (b"content-type", b"application/json")]}
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            self._check_headers(scope)
            await self.app(scope, self._bounded(receive), tracking_send)
        except Refused as e:
            if not started:
                await _send_error(send, e.error)
        except Exception as e:  # noqa: BLE001 -- answered (and logged), not re-raised: the connection survives
            error = errors.internal(f"{scope['method']} {scope['path']}", e)
            if not started:
                await _send_error(send, error)


async def _send_error(send: Callable, error: RequestError) -> None:
    payload = json.dumps(errors.body(error)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in errors.refusal_headers(error).items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class BoundedHeadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing connections whose request line and headers do
    not arrive within ``header_timeout`` seconds of the connection or the request's first byte,
    and answering 431 to a head larger than ``max_header_bytes`` before the parser reads it."""

    header_timeout: float = 10.0
    max_header_bytes: int = 64 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: Any = None
        self._reading_head = False  # from a connection's start or a request's end to the next blank line
        self._head_bytes = 0
        self._head_tail = b""  # the last bytes read, for a blank line split between two reads
        self._refused = False

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._header_deadline)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_deadline(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _start_head(self) -> None:
        self._reading_head, self._head_bytes, self._head_tail = True, 0, b""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._start_head()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:  # what a refused client still sends is dropped unread
            return
        if self._reading_head:  # count the head up to its blank line, before the parser sees it
            seen = self._head_tail + data
            end = seen.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end + 4 - len(self._head_tail)
            if self._head_bytes > self.max_header_bytes:
                self._refuse_head()
                return
            self._head_tail = seen[-3:]
        super().data_received(data)

    def _refuse_head(self) -> None:
        self._disarm()
        error = RequestError(f"the request line and headers pass {self.max_header_bytes} bytes", status=431)
        payload = json.dumps(errors.body(error)).encode()
        head = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(payload))  # fmt: skip
        self.transport.write(head + payload)
        # a lingering close: the client gets the answer before the connection ends (closing with
        # its unread bytes pending would reset the connection, answer and all)
        self._refused = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._header_timer = self.loop.call_later(LINGER_S, self.transport.close)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._reading_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._start_head()  # what comes next on this connection is the next request's head


def bounded_head_protocol(seconds: float, max_bytes: int) -> type[BoundedHeadProtocol]:
    return type("BoundedHeadProtocol", (BoundedHeadProtocol,), {"header_timeout": seconds, "max_header_bytes": max_bytes})
