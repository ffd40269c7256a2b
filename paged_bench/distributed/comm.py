"""What the ranks of a tensor-parallel forward exchange: all-reduces of the row-parallel
layers' partial sums, and the LM head's vocabulary slices gathered onto rank 0."""

from __future__ import annotations

import torch
import torch.distributed as dist


class TPComm:
    def __init__(self, rank: int, world_size: int, vocab_size: int) -> None:
        self.rank, self.world_size, self.vocab_size = rank, world_size, vocab_size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()  # the CPU linear returns a transposed view
        dist.all_reduce(x)
        return x

    def gather_logits(self, x: torch.Tensor) -> torch.Tensor | None:
        """Rank 0: ``[B, vocab]`` (the slices side by side, padding dropped); others: None."""
        x = x.contiguous()
        if self.rank != 0:
            dist.gather(x, dst=0)
            return None
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.gather(x, parts, dst=0)
        return torch.cat(parts, dim=-1)[:, : self.vocab_size]
