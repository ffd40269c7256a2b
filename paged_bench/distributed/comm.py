"""What the ranks exchange: each step's message from rank 0 (a length, then its pickled
bytes), the all-reduces of the row-parallel layers' partial sums, and the LM head's vocabulary
slices gathered onto rank 0.

Rank 0 waits on its gloo collectives in short slices and looks at the worker processes
between them (``check_peers``): gloo usually fails a collective at once when a peer dies, but
not always (a send to a rank killed between steps has waited out the whole collective
timeout, a minute, on a loaded machine), and a dead worker must fail the run in seconds.
NCCL collectives are left to NCCL: waiting on one with a timeout would block the CPU on
every layer's all-reduce; the step messages travel on gloo even beside NCCL.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

POLL = timedelta(seconds=0.5)  # how often rank 0 looks at the workers while a collective waits

CheckPeers = Callable[[], None]  # raises if a peer process is gone


def finish(work: Any, check_peers: CheckPeers) -> None:
    """Wait for an async collective; every ``POLL`` while it is pending, ``check_peers()``."""
    while True:
        try:
            work.wait(timeout=POLL)
            return
        except RuntimeError:
            if work.is_completed():  # it failed (or ended just now): wait again for its own outcome
                work.wait()
                return
            check_peers()


def send_message(msg: Any, group: Any, check_peers: CheckPeers) -> None:
    """Rank 0: broadcast ``msg`` to every rank of ``group`` (see ``receive_message``)."""
    data = bytearray(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
    size = torch.tensor([len(data)], dtype=torch.int64)
    finish(dist.broadcast(size, src=0, group=group, async_op=True), check_peers)
    finish(dist.broadcast(torch.frombuffer(data, dtype=torch.uint8), src=0, group=group, async_op=True), check_peers)


def receive_message(group: Any) -> Any:
    """A worker: the next message rank 0 sends (it waits for as long as rank 0 lives)."""
    size = torch.empty(1, dtype=torch.int64)
    dist.broadcast(size, src=0, group=group)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(data, src=0, group=group)
    return pickle.loads(data.numpy().tobytes())  # noqa: S301 (rank 0 of this run, on localhost)


class TPComm:
    def __init__(self, rank: int, world_size: int, vocab_size: int, check_peers: CheckPeers | None = None) -> None:
        self.rank, self.world_size, self.vocab_size = rank, world_size, vocab_size
        self.check_peers = check_peers  # rank 0 on gloo: wait watching the workers

    def _run(self, op: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if self.check_peers is None:
            op(*args, **kwargs)
        else:
            finish(op(*args, **kwargs, async_op=True), self.check_peers)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()  # the CPU linear returns a transposed view
        self._run(dist.all_reduce, x)
        return x

    def gather_logits(self, x: torch.Tensor) -> torch.Tensor | None:
        """Rank 0: ``[B, vocab]`` (the slices side by side, padding dropped); others: None."""
        x = x.contiguous()
        if self.rank != 0:
            dist.gather(x, dst=0)
            return None
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self._run(dist.gather, x, parts, dst=0)
        return torch.cat(parts, dim=-1)[:, : self.vocab_size]
