"""The block pool's free queue: the free blocks in the order they will be reused.

A doubly linked list threaded through one node per block, as vLLM v1's
``FreeKVCacheBlockQueue``: taking the head, adding at either end and taking a block out of the
middle (a cache hit on a free block) are each a few pointer moves, with no allocation. The
nodes are made once, with the pool; a sentinel closes the ring, so no end is a special case.
(An ``OrderedDict`` keyed by block id would do the same, but each operation hashes, and
allocates or frees a dict entry.)
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr


class _Node:
    __slots__ = ("block", "next", "prev")

    def __init__(self, block: int) -> None:
        self.block = block
        self.prev: _Node = self
        self.next: _Node = self


@mypyc_attr(allow_interpreted_subclasses=True)  # the tests tear it midway, as a signal would
class FreeQueue:
    """A queue over blocks ``0 .. num_blocks - 1``: ``queued`` in that order (default: all, in
    order of id)."""

    def __init__(self, num_blocks: int, queued: list[int] | None = None) -> None:
        self._end = _Node(-1)  # the sentinel: its next is the head, its prev the tail
        self._nodes = [_Node(block) for block in range(num_blocks)]
        self.size = 0
        for block in range(num_blocks) if queued is None else queued:
            self.append(block)

    def __len__(self) -> int:
        return self.size

    def popleft(self) -> int:
        """Take the head (the caller checked the queue is not empty)."""
        node = self._end.next
        self._unlink(node)
        return node.block

    def append(self, block: int) -> None:
        """Add a block that is not queued at the tail (reused last)."""
        self._link(self._nodes[block], self._end.prev, self._end)

    def appendleft(self, block: int) -> None:
        """Add a block that is not queued at the head (reused first)."""
        self._link(self._nodes[block], self._end, self._end.next)

    def remove(self, block: int) -> None:
        """Take a queued block out, wherever it is."""
        self._unlink(self._nodes[block])

    def blocks(self) -> list[int]:
        """The queued blocks, head first (no more than there are blocks: a list an interrupt
        tore mid-operation may no longer lead back to its start)."""
        out: list[int] = []
        node = self._end.next
        while node is not self._end and len(out) < len(self._nodes):
            out.append(node.block)
            node = node.next
        return out

    def _link(self, node: _Node, before: _Node, after: _Node) -> None:
        before.next = node
        node.prev = before
        node.next = after
        after.prev = node
        self.size += 1

    def _unlink(self, node: _Node) -> None:
        before, after = node.prev, node.next
        before.next = after
        after.prev = before
        node.prev = node.next = node
        self.size -= 1
