"""What a step does, counted from its plan: the work a cost model prices.

``step_work`` reads a ``StepPlan`` (rows, computed and new tokens, swaps) for a model and
dtype and counts FLOPs, bytes and score matrices;
``scattered_blocks`` counts, from the rows' block tables, the blocks a step reads that do not
follow the one before them in the pool (K/V scattered by a run's frees costs more to gather
than K/V on consecutive blocks: ``benchmarks/numpy_memory.py``); ``RunTables`` keeps a run's
tables from its plans and counts them as they grow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from paged_bench.backends.request_state import RequestStates
from paged_bench.core.plan import ReqId, StepPlan
from paged_bench.model.config import DTYPE_BYTES, ModelConfig
from paged_bench.sizing.tp_shard import TPShard


@dataclass(frozen=True)
class StepWork:
    """What a step does, in the units a roofline needs."""

    num_seqs: int
    matmul_flops: float
    weight_bytes: float
    attn_flops: float
    kv_bytes: float
    swap_bytes: float = 0.0
    num_allreduces: int = 0  # tensor parallel: two per layer
    allreduce_bytes: float = 0.0  # each one's activations
    score_bytes: float = 0.0  # fp32 attention scores an eager attention materialises, per layer and head
    num_tokens: int = 0  # new tokens: the rows of every layer's matmuls
    padding_kv_bytes: float = 0.0  # K/V an eager attention gathers past a request's end (its group's longest)
    # blocks the step reads that do not follow the block before them in the pool: K/V on
    # scattered blocks costs more to gather than on consecutive ones at the same bytes
    scattered_blocks: int = 0


def step_work(
    plan: StepPlan,
    model: ModelConfig,
    dtype: str,
    block_size: int,
    shard: TPShard | None = None,
    scattered: int = 0,
    score_slice: int | None = None,
) -> StepWork:
    """One rank's work (the whole model's when ``shard`` is None or of size 1); ``scattered``:
    the ``scattered_blocks`` of the step's block tables, where they are known; ``score_slice``:
    for an eager attention that runs each prompt chunk alone in slices of query rows holding
    at most that many scores (``sliced_scores``), else the prompt chunks' padded group."""
    shard = shard or TPShard(model)
    kv_token = shard.kv_bytes_per_token(dtype)
    new = pairs = kv_read = 0
    decodes = decode_len = prefills = chunk_len = prefill_len = 0
    for start, n in zip(plan.num_computed_tokens, plan.num_new_tokens):
        new += n
        pairs += n * start + n * (n + 1) // 2  # the query at position p sees keys 0..p
        kv_read += start + n
        if n == 1:
            decodes, decode_len = decodes + 1, max(decode_len, start + 1)
        else:
            prefills, chunk_len, prefill_len = prefills + 1, max(chunk_len, n), max(prefill_len, start + n)
    # an eager attention (our numpy/torch backends) runs decodes as one group padded to the
    # longest context, masked keys included: it gathers K/V beyond what the requests hold (a
    # decode's one score per key is 1/head_dim of the K/V it gathers: the gather prices it).
    # It computes a prompt chunk's queries x keys scores, each chunk alone (``AttnGroup.each``):
    # numpy in slices of query rows (``score_slice``), torch whole; without a ``score_slice``
    # (a preset from before) counted as one group padded to the longest chunk and context
    padding = decodes * decode_len + prefills * prefill_len - kv_read
    if score_slice is None:
        scores = prefills * chunk_len * prefill_len
    else:
        scores = sum(sliced_scores(start, n, shard.num_heads, score_slice)
                     for start, n in zip(plan.num_computed_tokens, plan.num_new_tokens) if n > 1)  # fmt: skip
    sampled = len(plan.req_ids)
    matmul = (
        2.0 * new * model.num_layers * shard.layer_matmul_params + 2.0 * sampled * model.hidden_size * shard.vocab_size
    )
    weights = float(shard.matmul_params * DTYPE_BYTES[dtype]) if plan.req_ids else 0.0
    attn = 4.0 * model.num_layers * shard.num_heads * model.head_dim * pairs
    swap = float((len(plan.swap_in) + len(plan.swap_out)) * block_size * kv_token)
    allreduces = 2 * model.num_layers if shard.size > 1 and new else 0
    return StepWork(
        num_seqs=len(plan.req_ids),
        matmul_flops=matmul,
        weight_bytes=weights,
        attn_flops=attn,
        kv_bytes=float((kv_read + new) * kv_token),
        swap_bytes=swap,
        num_allreduces=allreduces,
        allreduce_bytes=float(new * model.hidden_size * DTYPE_BYTES[dtype]),
        score_bytes=4.0 * model.num_layers * shard.num_heads * scores,  # this rank's heads
        num_tokens=new,
        padding_kv_bytes=float(padding * kv_token),
        scattered_blocks=scattered,
    )


def sliced_scores(start: int, n: int, heads: int, score_slice: int) -> int:
    """Query x key scores, per head, of a prompt chunk of ``n`` tokens after ``start`` as an
    eager attention slices it (``model.ops_numpy``): slices of as many query rows as hold
    ``score_slice`` scores over every head at the chunk's last position, each against the
    keys up to its own last row. A chunk in one slice computes the whole rectangle, masked
    half included (a 256-token prompt in 1 Mi scores over 8 heads: 256 x 256); a chunk in
    many, nearly the causal triangle (2,048 tokens after 16: 52% of 2,048 x 2,064). Counted
    as the rectangle, a calibration (with 4 Mi slices) priced the seeds' and the Azure
    window's prompt chunks of up to 512 tokens 10-15% cheap, and 2,048-token ones 7-12% dear."""
    rows = max(1, score_slice // (heads * (start + n)))
    return sum(min(rows, n - a) * (start + a + min(rows, n - a)) for a in range(0, n, rows))


class RunTables:
    """A run's block tables kept from its plans (``RequestStates``, as a real backend keeps
    them) and each row's ``scattered_blocks`` so far, counted as its table grows: a step
    costs the blocks it adds, not a pass over every table."""

    def __init__(self) -> None:
        self.states = RequestStates()
        self.counted: dict[ReqId, list[int]] = {}  # [blocks looked at, scattered among them]

    def scattered_blocks(self, plan: StepPlan, block_size: int) -> int:
        """Bring the tables up to ``plan``; its rows' ``scattered_blocks``."""
        counted = self.counted
        for req_id in (*plan.finished_req_ids, *plan.preempted_req_ids):
            counted.pop(req_id, None)
        for new in plan.new_reqs:  # (again) from its first block: a table sent whole
            counted.pop(new.req_id, None)
        total = 0
        rows = self.states.apply(plan)
        for req_id, row, start, n in zip(plan.req_ids, rows, plan.num_computed_tokens, plan.num_new_tokens):
            mark = counted.get(req_id)
            if mark is None:
                mark = counted[req_id] = [1, 0]
            read = (start + n + block_size - 1) // block_size
            if read > mark[0]:  # a row's reads only grow until it is sent whole again
                table = row.block_ids
                read = min(read, len(table))
                mark[1] += out_of_order(table, mark[0], read)
                mark[0] = read
            total += mark[1]
        return total


def scattered_blocks(plan: StepPlan, tables: Sequence[Sequence[int]], block_size: int) -> int:
    """Over the rows of ``plan`` (``tables``: their block tables, in row order), the blocks
    each row reads (those its context and new tokens fill) that are not the block before
    them plus one."""
    count = 0
    for table, start, n in zip(tables, plan.num_computed_tokens, plan.num_new_tokens):
        count += out_of_order(table, 1, min(-(-(start + n) // block_size), len(table)))
    return count


def out_of_order(table: Sequence[int], start: int, stop: int) -> int:
    """How many of ``table[start:stop]`` (``start`` >= 1) are not the block before them plus one."""
    return sum(table[i] != table[i - 1] + 1 for i in range(start, stop))
