"""The block pool's free queue: the free blocks in the order they will be reused.

A doubly linked list threaded through one node per block, as vLLM v1's
``FreeKVCacheBlockQueue``: taking the head, adding at either end and taking a block out of the
middle (a cache hit on a free block) are each a few pointer moves, with no allocation; a
sentinel closes the ring, so no end is a special case. (An ``OrderedDict`` keyed by block id
would do the same, but each operation hashes, and allocates or frees a dict entry.)

A block gets its node when it first leaves the queue: until then the blocks never taken out,
still in order of id, are one stand-in node in the ring (``_fresh``). A pool sized from a large
GPU's memory holds hundreds of thousands of blocks, and making a node for each up front took a
quarter of a second a pool (a third of ``tp_tradeoff``'s whole run, and every replica of a
capacity plan's clusters), most of them for blocks a run never reaches.
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
        self._nodes: list[_Node | None] = [None] * num_blocks  # a block's node, made when it first leaves
        self._fresh = _Node(-2)  # stands in the ring for blocks first_fresh .. num_blocks - 1, never taken out
        self._first_fresh = num_blocks
        self.size = 0
        if queued is None:  # every block, in order of id: all fresh
            self._first_fresh = 0
            if num_blocks:
                self._link(self._fresh, self._end, self._end)
            self.size = num_blocks
        else:
            for block in queued:
                self.append(block)

    def __len__(self) -> int:
        return self.size

    def popleft(self) -> int:
        """Take the head (the caller checked the queue is not empty)."""
        node = self._end.next
        if node is self._fresh:  # the lowest fresh block
            block = self._first_fresh
            self._first_fresh += 1
            if self._first_fresh == len(self._nodes):
                self._unlink(node)
        else:
            block = node.block
            self._unlink(node)
        self.size -= 1
        return block

    def append(self, block: int) -> None:
        """Add a block that is not queued at the tail (reused last)."""
        self._link(self._node(block), self._end.prev, self._end)
        self.size += 1

    def appendleft(self, block: int) -> None:
        """Add a block that is not queued at the head (reused first)."""
        self._link(self._node(block), self._end, self._end.next)
        self.size += 1

    def remove(self, block: int) -> None:
        """Take a queued block out, wherever it is."""
        if block >= self._first_fresh:  # (the pool takes out only blocks it has used: not a fresh one)
            self._make_fresh_nodes()
        self._unlink(self._node(block))
        self.size -= 1

    def blocks(self) -> list[int]:
        """The queued blocks, head first (no more than there are blocks: a list an interrupt
        tore mid-operation may no longer lead back to its start)."""
        out: list[int] = []
        node = self._end.next
        while node is not self._end and len(out) < len(self._nodes):
            if node is self._fresh:
                out.extend(range(self._first_fresh, len(self._nodes)))
            else:
                out.append(node.block)
            node = node.next
        return out

    def _node(self, block: int) -> _Node:
        node = self._nodes[block]
        if node is None:
            node = self._nodes[block] = _Node(block)
        return node

    def _make_fresh_nodes(self) -> None:
        """Put the fresh blocks' own nodes in the stand-in's place, in order."""
        before, after = self._fresh.prev, self._fresh.next
        self._unlink(self._fresh)
        for block in range(self._first_fresh, len(self._nodes)):
            node = self._node(block)
            self._link(node, before, after)
            before = node
        self._first_fresh = len(self._nodes)

    def _link(self, node: _Node, before: _Node, after: _Node) -> None:
        before.next = node
        node.prev = before
        node.next = after
        after.prev = node

    def _unlink(self, node: _Node) -> None:
        before, after = node.prev, node.next
        before.next = after
        after.prev = before
        node.prev = node.next = node
