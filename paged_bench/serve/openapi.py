"""The server's ``/openapi.json``: FastAPI's, made to say what the server does.

- every error a route may answer is listed with its OpenAI-shaped body, and FastAPI's own
  422 is not (validation errors are 400 here, as vLLM answers them);
- request bodies carry the bounds that this server's settings set, beside the fixed ones
  that ``schemas`` declares: ``max_tokens`` below the context length, token ids inside the
  vocabulary, ``n``, ``logprobs``, stop strings and prompt lists within ``server.max_*``.
  What the schema cannot say, the server still refuses with a 400: a prompt and
  ``max_tokens`` that together pass the context length, an unknown model (404), ``top_logprobs``
  without ``logprobs``, ``n`` above 1 with greedy sampling, ``stream_options`` without ``stream``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from paged_bench.serve import schemas
from paged_bench.serve.protocol import ServingContext


def error(description: str) -> dict[str, Any]:
    return {"model": schemas.ErrorResponse, "description": description}


KEY = {401: error("missing or wrong API key")}
GENERATE_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: error("a bad request"),
    **KEY,
    404: error("unknown model"),
    408: error("the body did not arrive in time"),
    413: error("request body too large"),
    415: error("a compressed body"),
    429: error("too many requests waiting"),
    500: error("the engine failed a step"),
    503: error("the engine is not running, or the server is shutting down"),
}


def _token_ids(node: Any, top: int) -> None:
    """Every token id under ``node`` (an integer at least 0) at most ``top``."""
    if isinstance(node, dict):
        if node.get("type") == "integer" and node.get("minimum") == 0:
            node["maximum"] = top
        for value in node.values():
            _token_ids(value, top)
    elif isinstance(node, list):
        for value in node:
            _token_ids(value, top)


def _limit(props: dict[str, Any], ctx: ServingContext) -> None:
    """The bounds of one request body's properties that this server's settings set."""
    limits = ctx.limits
    # at the property's level: a bound on numbers, which leaves null (and chat's boolean logprobs) be
    tops = {"max_tokens": ctx.max_model_len - 1, "max_completion_tokens": ctx.max_model_len - 1,  # a prompt has a token
            "n": limits.max_choices, "logprobs": limits.max_logprobs, "top_logprobs": limits.max_logprobs}  # fmt: skip
    for key, top in tops.items():
        if key in props:
            props[key]["maximum"] = top
    props["stop"]["maxLength"] = limits.max_stop_chars  # a string's (an array's items: below)
    for member in props["stop"]["anyOf"]:
        if member.get("type") == "array":
            member["maxItems"] = limits.max_stop
            member["items"]["maxLength"] = limits.max_stop_chars
    _token_ids(props["stop_token_ids"], ctx.vocab_size - 1)
    if "prompt" in props:
        _token_ids(props["prompt"], ctx.vocab_size - 1)
        for member in props["prompt"]["anyOf"]:
            if member.get("type") == "array" and member["items"].get("type") != "integer":
                member["maxItems"] = limits.max_prompts  # a list of prompts


def openapi(app: FastAPI, ctx: ServingContext) -> dict[str, Any]:
    """The app's schema, made once (FastAPI caches it in ``app.openapi_schema``)."""
    spec = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    for path in spec["paths"].values():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
    components = spec.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    for body in ("CompletionRequest", "ChatRequest"):
        _limit(components[body]["properties"], ctx)
    app.openapi_schema = spec
    return spec
