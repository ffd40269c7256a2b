"""One streaming request to an OpenAI-compatible endpoint, timed as vLLM's benchmark client
(``vllm/benchmarks/lib/endpoint_request_func.py`` at 02cfb534) times it, over its HTTP stack: an
``aiohttp.ClientSession`` (its C parser), the body read as it arrives (``iter_any``) and cut
into server-sent events here (vLLM's ``StreamedResponseHandler`` splits on blank lines; we cut
at each line end, so ``\\r\\n`` endings and a ``data:`` without its space read as well).

Every chunk that carries a choice is stamped when it is parsed (the role chunk of a chat stream
comes with the first token on our server and on vLLM): TTFT ends at the first, ITL is measured
between them, E2EL ends at the last; the usage chunk and ``[DONE]`` that follow carry no
content and end nothing but the stream (``end_time``). The text is kept for its digest and
for counting tokens when the server sends no ``usage`` (we always ask for it). Every failure
(connection refused, HTTP error, error event, timeout, malformed stream) becomes the
outcome's ``error``, never an exception: one bad request must not stop a run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from paged_bench.core.request import Request
from paged_bench.loadgen.config import TargetConfig


@dataclass
class Outcome:
    send_time: float
    chunk_times: list[float] = field(default_factory=list)  # chunks that carried a choice
    text: list[str] = field(default_factory=list)  # their text, piece by piece
    end_time: float | None = None  # when the stream closed, or the request failed
    prompt_tokens: int | None = None  # from usage
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None


def request_body(target: TargetConfig, model: str | None, req: Request, text: str | None) -> dict[str, Any]:
    """The request as a benchmark client sends it: streaming, usage asked for, exact lengths
    (a chat's ``text`` reads back as the prompt's length: ``prompts``)."""
    body: dict[str, Any] = {
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": req.temperature,
        "top_p": req.top_p,
        "ignore_eos": target.ignore_eos,
    }
    if model is not None:
        body["model"] = model
    if req.sampling_seed is not None:
        body["seed"] = req.sampling_seed
    if target.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": text}]
        body["max_completion_tokens"] = req.max_tokens
    else:  # token ids keep the prompt length exact (vLLM accepts them too)
        body["prompt"] = req.prompt_token_ids
        body["max_tokens"] = req.max_tokens
    return body


@dataclass(frozen=True)
class Endpoint:
    """Where a run's requests go, worked out once per run: the URL, the headers (the API key
    read from the environment once) and the proxy the environment names for that URL, if any
    (``HTTP_PROXY``/``NO_PROXY``: ``vllm bench serve``'s session has ``trust_env=True``, which
    looks the proxy and ``~/.netrc`` up on a worker thread for every request, two thread hops a
    request; the answer is the same for every request of a run)."""

    url: str
    headers: dict[str, str]  # the API key's
    post_headers: dict[str, str]  # a request's: the key's and its JSON content type
    timeout_s: float
    proxy: URL | None = None
    proxy_auth: aiohttp.BasicAuth | None = None

    @classmethod
    def of(cls, target: TargetConfig) -> Endpoint:
        path = "/chat/completions" if target.endpoint == "chat" else "/completions"
        url, headers = target.url + path, target.headers
        post = {"Content-Type": "application/json", **headers}
        try:
            proxy, auth = get_env_proxy_for_url(URL(url))
        except LookupError:  # none named, or NO_PROXY covers the host
            return cls(url, headers, post, target.timeout_s)
        return cls(url, headers, post, target.timeout_s, proxy, auth)


async def get(session: aiohttp.ClientSession, to: Endpoint, url: str, timeout_s: float) -> tuple[int, bytes]:
    """A GET beside the run's requests (the model list, ``/metrics``) on the same host, through the
    same proxy: its status and body, within ``timeout_s``; aiohttp's errors and TimeoutError raise."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.get(url, headers=to.headers, proxy=to.proxy, proxy_auth=to.proxy_auth, timeout=timeout) as resp:
        return resp.status, await resp.read()


def _error_text(status: int, raw: bytes) -> str:
    """One line: the server's message, or the start of its body (an HTML page's lines joined)."""
    try:
        message = str(orjson.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = raw.decode("utf-8", "replace")
    return f"HTTP {status}: {' '.join(message.split())[:200]}"


def _count(usage: dict, key: str, before: int | None) -> int | None:
    """A token count of ``usage``, which must be a whole number >= 0 when present."""
    value = usage.get(key, before)
    if value is not None and (value.__class__ is not int or value < 0):
        raise ValueError(f"usage.{key} is {value!r}, not a token count")
    return value


def _text(choice: dict) -> str | None:
    piece = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
    if piece is not None and not isinstance(piece, str):
        raise TypeError(f"a chunk's text is {piece!r}, not a string")
    return piece


def _take(data: bytes, out: Outcome, t: float) -> bool:
    """Read one event's JSON into ``out``; False when it was an error event (the request ends)."""
    chunk = orjson.loads(data)
    if err := chunk.get("error"):  # a server may send "error": null in every chunk
        out.error = f"error event: {err.get('message', err) if isinstance(err, dict) else err}"
        return False
    if usage := chunk.get("usage"):
        out.prompt_tokens = _count(usage, "prompt_tokens", out.prompt_tokens)
        out.completion_tokens = _count(usage, "completion_tokens", out.completion_tokens)
    if choices := chunk.get("choices"):
        out.chunk_times.append(t)
        choice = choices[0]
        if piece := _text(choice):
            out.text.append(piece)
        reason = choice.get("finish_reason")
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"a chunk's finish_reason is {reason!r}, not a string")
        out.finish_reason = reason or out.finish_reason
    return True


def _read(lines: list[bytes], out: Outcome, now: Callable[[], float]) -> bool:
    """Take the events of whole ``lines`` into ``out``; True once ``[DONE]`` or an error event
    ends the stream (lines other than ``data:`` ones, blank or comments, are skipped)."""
    for line in lines:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]" or not _take(data, out, now()):
            return True
    return False


async def _stream(session: aiohttp.ClientSession, to: Endpoint, body: bytes, out: Outcome,
                  now: Callable[[], float]) -> None:  # fmt: skip
    async with session.post(to.url, data=body, headers=to.post_headers, proxy=to.proxy,
                            proxy_auth=to.proxy_auth) as resp:  # fmt: skip
        if resp.status != 200:
            out.error = _error_text(resp.status, await resp.read())
            return
        done, tail = False, b""
        # read to the body's end, as vLLM's client does: a response left unread past [DONE] (its
        # terminating chunk) closes its connection, and each request would pay a new one
        async for piece in resp.content.iter_any():
            if done:
                continue
            lines = (tail + piece).split(b"\n") if tail else piece.split(b"\n")
            tail = lines.pop()  # a line cut between two reads waits for its end
            done = _read(lines, out, now)
            if out.error is not None:  # an error event: the request ends there
                return
        if tail and not done:  # the body's last line, with no line end after it
            done = _read([tail], out, now)
        if not done and out.error is None and out.finish_reason is None:
            out.error = "the stream ended before [DONE]"


async def send(session: aiohttp.ClientSession, to: Endpoint, body: dict, now: Callable[[], float]) -> Outcome:
    """Send one request and time it; never raises (except when cancelled)."""
    out = Outcome(send_time=now())  # the body is encoded on the clock, as aiohttp encodes vLLM's
    try:
        await asyncio.wait_for(_stream(session, to, orjson.dumps(body), out, now), to.timeout_s)
    except asyncio.TimeoutError:
        out.error = f"timed out after {to.timeout_s:g} s"
    except aiohttp.ClientError as e:
        out.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # a malformed chunk
        out.error = f"malformed response: {type(e).__name__}: {e}"
    out.end_time = now()
    if out.error is None and not out.chunk_times:
        out.error = "no tokens received"
    return out
