"""The link a disaggregated cluster moves K/V over, and what a transfer costs on it.

A transfer of ``b`` bytes takes ``latency + b / bandwidth``. Each prefill replica sends over
its own link one transfer at a time (first come, first served), so a burst of prefills
queues for the wire; the latency overlaps with the next transfer's bytes. The link is one
GPU's: a replica on ``t`` tensor-parallel ranks sends over ``t`` links at once, each rank its
own KV heads (as vLLM's P/D connectors move K/V rank to rank), so its bytes go ``t`` times
as fast. The presets are
the tensor-parallel ones (``paged_bench.costmodel.tp_link``: NVLink 3/4/5, PCIe 4/5, what a
transfer reaches of the datasheet's per-direction figure) and two between machines:
InfiniBand NDR (400 Gb/s, Splitwise's setting) and 100 Gb Ethernet.
"""

from __future__ import annotations

from paged_bench.core.clock import HORIZON_S
from paged_bench.costmodel.tp_link import LINKS as DEVICE_LINKS
from paged_bench.costmodel.tp_link import Link
from paged_bench.errors import check, check_choice, check_number

NETWORK_LINKS = {
    "infiniband": Link("infiniband", 50e9, 5e-6),
    "ethernet": Link("ethernet", 12.5e9, 20e-6),
}
LINKS = {**DEVICE_LINKS, **NETWORK_LINKS}


def make_link(name: str, bandwidth_gbs: float | None = None, latency_us: float | None = None) -> Link:
    """A preset, with its bandwidth (GB/s) or latency (microseconds) optionally overridden."""
    check_choice("cluster.link", name, LINKS)
    link = LINKS[name]
    if bandwidth_gbs is not None:
        link = Link(name, check_number("cluster.link_bandwidth_gbs", bandwidth_gbs, 0, strict=True) * 1e9, link.latency)
    if latency_us is not None:
        latency = check_number("cluster.link_latency_us", latency_us) * 1e-6
        # past the clock's horizon, the first transfer stopped the run mid-way
        check(latency < HORIZON_S, "cluster.link_latency_us", latency_us, f"less than {HORIZON_S * 1e6:g} (the "
              f"simulated clock's {HORIZON_S:g} s)")  # fmt: skip
        link = Link(name, link.bandwidth, latency)
    return link


class LinkQueue:
    """One sender's links (one per rank, ``lanes`` of them, carrying a transfer's bytes in equal
    shares): transfers go out one after the other."""

    def __init__(self, link: Link, lanes: int = 1) -> None:
        self.link = link
        self.bandwidth = link.bandwidth * lanes
        self.free_at = 0.0

    def send(self, ready: float, num_bytes: float) -> float:
        """Queue a transfer that is ready at ``ready``; returns when it has fully arrived."""
        start = max(ready, self.free_at)
        self.free_at = start + num_bytes / self.bandwidth
        return self.free_at + self.link.latency
