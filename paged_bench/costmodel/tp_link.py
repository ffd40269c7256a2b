"""The links between tensor-parallel ranks, and what an all-reduce over them costs.

A ring all-reduce of ``n`` bytes over ``N`` ranks runs a reduce-scatter then an all-gather:
``2(N-1)`` steps, each moving ``n / N`` bytes through every rank's link, so

    seconds = 2(N-1) x latency + 2(N-1)/N x n / bandwidth

``bandwidth`` is what NCCL-style collectives reach per direction (its "bus bandwidth"), below
the datasheet's bidirectional figure; ``latency`` is one ring step (a hop plus the kernel's
share), so a small all-reduce over 2 NVLink ranks costs a few microseconds and over 8 ranks
some tens, as NCCL's tests show for latency-bound messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from paged_bench.errors import check_choice


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float  # bytes/s per direction reachable by a collective
    latency: float  # seconds per ring step

    def allreduce_seconds(self, nbytes: float, ranks: int) -> float:
        if ranks <= 1:
            return 0.0
        steps = 2 * (ranks - 1)
        return steps * self.latency + steps / ranks * nbytes / self.bandwidth


# Datasheet per-direction peaks: NVLink 3 (A100) 300 GB/s, NVLink 4 (H100/H200) 450 GB/s,
# NVLink 5 (B200) 900 GB/s,
# PCIe 4.0 x16 32 GB/s, PCIe 5.0 x16 64 GB/s; a collective reaches ~80% of NVLink and of PCIe.
# ``shm``: ranks that are processes of one host (gloo over shared memory and loopback).
LINKS: dict[str, Link] = {
    "nvlink3": Link("nvlink3", 240e9, 1.5e-6),
    "nvlink4": Link("nvlink4", 360e9, 1.5e-6),
    "nvlink5": Link("nvlink5", 720e9, 1.5e-6),
    "pcie4": Link("pcie4", 25e9, 5e-6),
    "pcie5": Link("pcie5", 50e9, 5e-6),
    "shm": Link("shm", 5e9, 20e-6),
}


def link_preset(name: str, key: str = "backend.interconnect") -> Link:
    return LINKS[check_choice(key, name, LINKS)]
