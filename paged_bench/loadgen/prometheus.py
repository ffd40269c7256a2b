"""The server's own TTFT, read from its Prometheus ``/metrics`` (ours and vLLM's name it
``*time_to_first_token_seconds``): the sum and count of that histogram, over all its labels."""

from __future__ import annotations

import asyncio

import aiohttp

from paged_bench.loadgen.client import Endpoint, get
from paged_bench.loadgen.config import TargetConfig

_SUFFIX = "time_to_first_token_seconds"


def metrics_url(target: TargetConfig) -> str:
    """``/metrics`` sits at the server's root, beside ``/v1``."""
    url = target.url
    return (url.removesuffix("/v1")) + "/metrics"


def parse_ttft_totals(text: str) -> tuple[float, float] | None:
    """(sum in seconds, count) of the TTFT histogram in Prometheus text, or None if absent."""
    total, count, seen = 0.0, 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith((_SUFFIX + "_sum", _SUFFIX + "_count")):
            rest = line.rsplit("}", 1)[1] if "}" in line else line.split(" ", 1)[-1]
            try:
                value = float(rest.split()[0])  # a sample may be followed by a timestamp
            except (IndexError, ValueError):
                continue
            seen = True
            if name.endswith("_sum"):
                total += value
            else:
                count += value
    return (total, count) if seen else None


async def ttft_totals(session: aiohttp.ClientSession, to: Endpoint, target: TargetConfig) -> tuple[float, float] | None:
    try:
        status, body = await get(session, to, metrics_url(target), 5.0)
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None
    return parse_ttft_totals(body.decode("utf-8", "replace")) if status == 200 else None
