"""One engine step as arrays: the packed new tokens and where their K/V go and come from.

Every scheduled request contributes its new tokens (positions ``[computed, computed + n)``)
to one packed batch of ``T`` rows. Token position ``p`` of a request lives in pool slot
``table[p // block_size] * block_size + p % block_size``. Attention runs per group of
requests padded to a common shape: decodes (one query each) in one group, prefill chunks in
another, so a step mixing a long prompt with many decodes pads the decodes to length 1, not
to the prompt's length; the backends then take the prefill group apart (``AttnGroup.each``)
and attend each chunk alone. Keys are gathered through each request's block table for
positions ``[0, end)``; a query at position ``p`` sees keys ``<= p`` (which also hides the
padding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from paged_bench.backends.request_state import RequestState
from paged_bench.core.plan import StepPlan


@dataclass
class AttnGroup:
    rows: np.ndarray  # [G, N] packed row of each query; padding repeats the group's first row
    valid: np.ndarray  # [G, N] which queries are real
    q_pos: np.ndarray  # [G, N] query positions (0 for padding: it then sees key 0 only)
    ctx_slots: np.ndarray  # [G, L] pool slot of key position j (slot 0 past the end: masked)

    @property
    def all_valid(self) -> bool:
        return bool(self.valid.all())

    def allowed(self) -> np.ndarray:
        """[G, N, L]: may query n see key j (causal; hides keys past the request's end)."""
        return np.arange(self.ctx_slots.shape[1])[None, None, :] <= self.q_pos[:, :, None]

    def each(self) -> list[AttnGroup]:
        """The group's requests as groups of one, unpadded: each its own queries and the keys up
        to its own end, so a short prompt beside a long one is not padded to the long one's
        shape (16 prompts padded to one 2,000-token chunk at 4,000 tokens of context is 16x the
        attention work and, where scores are materialised, 16x their memory)."""
        ones = []
        for i, n in enumerate(self.valid.sum(axis=1).tolist()):
            end = int(self.q_pos[i, n - 1]) + 1
            ones.append(AttnGroup(self.rows[i : i + 1, :n], self.valid[i : i + 1, :n], self.q_pos[i : i + 1, :n],
                                  self.ctx_slots[i : i + 1, :end]))  # fmt: skip
        return ones


@dataclass
class StepBatch:
    input_ids: np.ndarray  # [T]
    positions: np.ndarray  # [T]
    slots: np.ndarray  # [T] where each new token's K/V is written
    groups: list[AttnGroup]
    sample_rows: np.ndarray  # [B] the packed row of each request's last new token


@dataclass
class _GroupSpec:
    """The requests of one attention group, gathered while the batch is packed."""

    starts: list[int] = field(default_factory=list)  # first new position
    ns: list[int] = field(default_factory=list)  # new tokens
    tables: list[list[int]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # first packed row

    def build(self, bs: int) -> AttnGroup:
        starts, ns, offsets = np.asarray(self.starts), np.asarray(self.ns), np.asarray(self.offsets)
        ends = starts + ns
        l_max = int(ends.max())
        width = -(-l_max // bs)
        table = np.zeros((len(ns), width), np.int64)
        for i, t in enumerate(self.tables):
            table[i, : min(len(t), width)] = t[:width]
        j = np.arange(l_max)
        ctx = table[:, j // bs] * bs + j % bs
        ctx[j[None, :] >= ends[:, None]] = 0
        k = np.arange(int(ns.max()))
        valid = k[None, :] < ns[:, None]
        rows = np.where(valid, offsets[:, None] + k[None, :], offsets[:, None])
        q_pos = np.where(valid, starts[:, None] + k[None, :], 0)
        return AttnGroup(rows, valid, q_pos, ctx)


def build_batch(plan: StepPlan, states: list[RequestState], block_size: int) -> StepBatch:
    """The batch of ``plan``, whose rows' tokens and tables are ``states`` (in row order)."""
    bs = block_size
    ids, positions, slots, sample_rows = [], [], [], []
    decodes, prefills = _GroupSpec(), _GroupSpec()
    offset = 0
    for state, start, n in zip(states, plan.num_computed_tokens, plan.num_new_tokens):
        table = state.block_ids
        pos = np.arange(start, start + n)
        ids.append(state.token_ids[start : start + n])
        positions.append(pos)
        slots.append(np.asarray(table, np.int64)[pos // bs] * bs + pos % bs)
        group = decodes if n == 1 else prefills
        group.starts.append(start)
        group.ns.append(n)
        group.tables.append(table)
        group.offsets.append(offset)
        offset += n
        sample_rows.append(offset - 1)
    return StepBatch(
        np.fromiter((t for chunk in ids for t in chunk), np.int64, offset),
        np.concatenate(positions),
        np.concatenate(slots),
        [g.build(bs) for g in (decodes, prefills) if g.ns],
        np.asarray(sample_rows, np.int64),
    )


def warmup_batch(num_tokens: int) -> StepBatch:
    """One sequence of ``num_tokens`` prefilled into slots ``[0, num_tokens)``: a forward on it
    at start-up pays the libraries' first-call costs before the first timed step. Those slots
    are free then, and every slot is written before any query reads it."""
    pos = np.arange(num_tokens)
    group = AttnGroup(pos[None, :], np.ones((1, num_tokens), bool), pos[None, :], pos[None, :])
    return StepBatch(np.zeros(num_tokens, np.int64), pos, pos.copy(), [group], np.array([num_tokens - 1]))
