"""Every error the server answers is OpenAI-shaped: ``{"error": {"message", "type", "param",
"code"}}`` (vLLM's ``ErrorResponse``), with the right status, and leaves the connection usable.

- a ``RequestError`` from validation: its status (400, 404, 413, 429, ...);
- FastAPI's own (unknown route 404, wrong method 405 with every method of the path in
  ``Allow``, a body it cannot parse 400, saying why:
  not UTF-8, nested too deeply) and body
  validation errors (400, naming the parameter, as vLLM answers them: not 422);
- anything unexpected: 500 with a generic message and an id to find the traceback in the log.
  Python exception text is never sent to the client. The handler answers instead of
  re-raising, so uvicorn keeps the keep-alive connection open for the next request.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.routing import Route

from paged_bench.serve import protocol
from paged_bench.serve.protocol import GenerationParams, RequestError, ServingContext

log = logging.getLogger("paged_bench.serve")


class Refused(HTTPException):
    """A request refused before its route ran (``limits.Guard``); an HTTPException so that
    FastAPI's body reading lets it through unchanged."""

    def __init__(self, error: RequestError) -> None:
        super().__init__(error.status, error.message, refusal_headers(error))
        self.error = error


def refusal_headers(error: RequestError) -> dict[str, str]:
    headers = {}
    if error.status in (408, 413):  # the rest of the body is still on the wire: no reuse
        headers["Connection"] = "close"
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return headers


def body(e: RequestError) -> dict:
    return protocol.error_body(e.message, e.type, e.param, e.status)


def response(e: RequestError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body(e), e.status, headers=headers)


def internal(where: str, exc: BaseException) -> RequestError:
    """Log ``exc`` with an id; the client gets the id, not the exception's text."""
    ref = uuid.uuid4().hex[:12]
    log.error("internal error %s in %s", ref, where, exc_info=exc)
    return RequestError(f"internal server error (ref {ref}); the server logged the details", status=500)


def _parse(parse: Any, body: Any, ctx: ServingContext) -> GenerationParams | Response:
    try:
        return parse(body, ctx)
    except RequestError as e:
        return response(e)
    except RecursionError:
        return response(RequestError("the request is nested too deeply"))
    except Exception as e:  # noqa: BLE001 -- a tokenizer or template that chokes on this input
        return response(internal("request parsing", e))


def parse_completion(body: Any, ctx: ServingContext) -> GenerationParams | Response:
    return _parse(protocol.parse_completion, body, ctx)


def parse_chat(body: Any, ctx: ServingContext) -> GenerationParams | Response:
    return _parse(protocol.parse_chat, body, ctx)


def unparsable_body(cause: BaseException) -> RequestError:
    """Why FastAPI could not read a JSON body, said for the client (it says only that it could not)."""
    if isinstance(cause, UnicodeDecodeError):
        return RequestError(f"the request body is not valid UTF-8: byte 0x{cause.object[cause.start]:02x} "
                            f"at offset {cause.start}; send JSON encoded as UTF-8")  # fmt: skip
    if isinstance(cause, RecursionError):
        return RequestError("the request body nests arrays or objects too deeply to parse")
    return RequestError(f"the request body could not be parsed as JSON ({type(cause).__name__})")


_HTTP_MESSAGES = {404: "no such route", 405: "method not allowed on this route"}


def install(app: FastAPI) -> None:
    """OpenAI-shaped handlers for every error FastAPI and Starlette raise (the catch-all for
    the rest is ``limits.Guard``, an ASGI middleware, so that streams pass through untouched)."""

    @app.exception_handler(RequestValidationError)
    async def validation(request: HTTPRequest, exc: RequestValidationError) -> Response:
        return response(protocol.validation_error(list(exc.errors())))

    @app.exception_handler(HTTPException)
    async def http(request: HTTPRequest, exc: HTTPException) -> Response:
        if isinstance(exc, Refused):
            return response(exc.error, exc.headers)
        detail = exc.detail if isinstance(exc.detail, str) else None
        if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI's "error parsing the body"
            return response(unparsable_body(exc.__cause__))
        message = _HTTP_MESSAGES.get(exc.status_code, detail or "bad request")
        if exc.status_code in _HTTP_MESSAGES:
            message = f"{message}: {request.method} {request.url.path}"
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:  # Starlette's names the methods of one route of the path only
            headers = {**(headers or {}), "Allow": ", ".join(_methods(request))}
        return response(RequestError(message, status=exc.status_code), headers)


def _methods(request: HTTPRequest) -> list[str]:
    """Every method some route serves at the request's path (``GET`` and ``HEAD`` at ``/health``)."""
    path = request.scope["path"]
    routes = [r for r in request.app.routes if isinstance(r, Route) and r.path_regex.match(path)]
    return sorted({method for r in routes for method in r.methods or ()})
