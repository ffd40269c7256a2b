"""Three behaviours of the scheduler pinned by exact values (issue 34): the token budget a
preempted row gives back, the preemption victim's order, and ``recomputed_tokens`` net of the
blocks a re-admitted victim finds still cached.

Each test drives a scheduler step by step through its protocol (``add_request``, ``schedule``,
``update`` with the tokens a backend would sample) and reads public state only: the plans, the
running and waiting lists, the counters. Every expected value is derived by hand in the test's
docstring; blocks are 4 tokens, and "X blocks free" counts what ``num_free_blocks`` says.
"""

from __future__ import annotations

from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import StepOutput, StepPlan
from paged_bench.core.request import Request, RequestStatus
from paged_bench.core.scheduler.base import Scheduler
from paged_bench.core.scheduler.preemptive import PreemptiveScheduler


def step(sched: Scheduler, tokens: dict[str, int] | None = None) -> StepPlan:
    """One step: plan it, then record a sampled token per row (0 unless ``tokens`` names one)."""
    plan = sched.schedule(0.0)
    sampled = [(tokens or {}).get(rid, 0) for rid in plan.req_ids]
    sched.update(plan, StepOutput(sampled), 0.0)
    return plan


def rows(plan: StepPlan) -> list[tuple[str, int, int]]:
    """The plan's rows as (request id, first new token's position, new tokens)."""
    return list(zip(plan.req_ids, plan.num_computed_tokens, plan.num_new_tokens))


def preemptive(num_blocks: int, budget: int, max_batch: int, *, prefix_caching: bool = True, **kw) -> PreemptiveScheduler:
    alloc = PagedAllocator(num_blocks=num_blocks, block_size=4, prefix_caching=prefix_caching)
    return PreemptiveScheduler(alloc, max_model_len=256, max_batch=max_batch, max_num_batched_tokens=budget, **kw)


def test_a_preempted_rows_tokens_go_back_to_the_steps_budget():
    """B (arrived at 5 s) is admitted first, then A (0 s) and C (1 s): running is [B, A, C].
    Budget 8 tokens a step, 6 blocks, no prefix cache, ``victim=latest_arrival``.

    - steps 1-2: B's 14-token prompt in chunks of 8 and 6 (4 blocks); B samples its 15th token.
    - step 3: B decodes (position 14, in its 4th block), A's 4-token prompt (1 block), C's
      20-token prompt chunked to the 3 tokens left (1 block): 6 blocks, none free.
    - step 4: B's decode (position 15) fits its 4th block: scheduled, 7 tokens left. A's
      decode (position 4) needs a 2nd block and none is free: the victim is the latest
      arrival, B, already scheduled in this step. B is taken back out, its 1 token refunded
      (8 left), its 4 blocks freed. A takes one (7 left); C, 3 tokens in, gets a chunk of 7
      (positions 3-9, in 2 of the 3 blocks left free).

    Without the refund C's chunk would be 6."""
    sched = preemptive(num_blocks=6, budget=8, max_batch=3, prefix_caching=False, victim="latest_arrival")
    b = Request("B", 5.0, range(100, 114), 50)
    sched.add_request(b, 0.0)
    assert rows(step(sched)) == [("B", 0, 8)]
    assert rows(step(sched)) == [("B", 8, 6)]
    a, c = Request("A", 0.0, range(200, 204), 50), Request("C", 1.0, range(300, 320), 50)
    sched.add_request(a, 0.0)
    sched.add_request(c, 0.0)
    assert rows(step(sched)) == [("B", 14, 1), ("A", 0, 4), ("C", 0, 3)]
    assert sched.allocator.num_free_blocks == 0

    plan = step(sched)
    assert plan.preempted_req_ids == ("B",)
    assert rows(plan) == [("A", 4, 1), ("C", 3, 7)]  # 1 + 7: the whole budget, B's token included
    assert plan.num_scheduled_tokens == 8 and plan.num_decode_tokens == 1  # A's first generated token
    assert plan.partial_rows == frozenset({1})  # C's chunk stops short of its prompt
    assert b.status is RequestStatus.PREEMPTED and list(sched.waiting) == [b]
    assert sched.allocator.num_free_blocks == 1  # 4 freed by B, 1 taken by A, 2 by C


def four_running(**kw) -> tuple[PreemptiveScheduler, list[Request]]:
    """X, Y, Z, W admitted in that order (running is [X, Y, Z, W]), arriving at 0, 1, 1 and
    0.5 s; 4 blocks. X's 4-token prompt fills a block; the others' 3-token prompts leave a
    slot in theirs. Step 1 admits all four (4 blocks, none free) and each samples a token, so
    in step 2 X's decode (position 4) needs a 2nd block and is the only row that does."""
    sched = preemptive(num_blocks=4, budget=64, max_batch=4, prefix_caching=False, **kw)
    reqs = [Request("X", 0.0, [1, 2, 3, 4], 10), Request("Y", 1.0, [5, 6, 7], 10),
            Request("Z", 1.0, [8, 9, 10], 10), Request("W", 0.5, [11, 12, 13], 10)]  # fmt: skip
    for r in reqs:
        sched.add_request(r, 0.0)
    assert rows(step(sched)) == [("X", 0, 4), ("Y", 0, 3), ("Z", 0, 3), ("W", 0, 3)]
    assert sched.allocator.num_free_blocks == 0
    return sched, reqs


def test_the_default_victim_is_the_running_lists_tail():
    """``victim=last_admitted`` (vLLM v1's): X's decode needs a block, the victim is W, the
    tail of the running list, although Y and Z arrived later. W's block goes to X; Y and Z
    decode in their own blocks."""
    sched, (x, y, z, w) = four_running()
    plan = step(sched)
    assert plan.preempted_req_ids == ("W",)
    assert plan.req_ids == ("X", "Y", "Z")
    assert sched.running == [x, y, z] and list(sched.waiting) == [w]
    assert w.status is RequestStatus.PREEMPTED and sched.num_preemptions == 1 and w.num_preemptions == 1


def test_the_latest_arrival_victim_is_the_later_admitted_of_equal_arrivals():
    """``victim=latest_arrival``: Y and Z both arrived last (1 s); of the two, Z, admitted
    after Y, is the victim (not Y, the first found; not W, the tail). Z's block goes to X, and
    the running list keeps its order: [X, Y, W]."""
    sched, (x, y, z, w) = four_running(victim="latest_arrival")
    plan = step(sched)
    assert plan.preempted_req_ids == ("Z",)
    assert plan.req_ids == ("X", "Y", "W")
    assert sched.running == [x, y, w] and list(sched.waiting) == [z]
    assert z.status is RequestStatus.PREEMPTED and y.num_preemptions == 0


def b_preempted_until_a_is_done(sched: PreemptiveScheduler, *reqs: Request) -> StepPlan:
    """Steps 1 to 3 of the next two tests, in which A (4-token prompt) and B are admitted in
    step 1, B is preempted in step 2 for A's decode (position 4), and A's last token comes in
    step 3; B waits. Returns step 1's plan."""
    a, b = sorted(reqs, key=lambda r: r.request_id)
    for r in reqs:
        sched.add_request(r, 0.0)
    first = step(sched)
    plan = step(sched)
    assert plan.preempted_req_ids == ("B",) and rows(plan) == [("A", 4, 1)]
    assert sched.recomputed_tokens == 0  # counted at re-admission, when the hit is known
    assert rows(step(sched)) == [("A", 5, 1)] and a.is_finished and b.status is RequestStatus.PREEMPTED
    return first


def test_recomputed_tokens_are_what_the_victim_had_computed_less_what_it_finds_cached():
    """A (0 s, 4-token prompt, 3 tokens out) and B (1 s, 6-token prompt); 3 blocks, the
    default victim (the last admitted).

    - step 1: A's prompt (1 full block, cached), B's (a full block, cached, and a 2nd holding
      2 tokens): 3 blocks. Each samples a token: A has 5 tokens, B 7, 6 of them computed.
    - step 2: A's decode (position 4) needs a block, none is free: B is preempted, with 6
      tokens computed. Its unfilled 2nd block goes to the head of the free queue, its full
      one (cached) to the tail; A takes the head.
    - step 3: A's 3rd and last token; B's re-admission would need its cached block and one
      more, with one free: it waits. A finishes, freeing its blocks.
    - step 4: B is re-admitted: its first block is still cached (4 tokens hit); it recomputes
      its 3 other tokens (6 computed before, 1 sampled since). ``recomputed_tokens`` counts
      what it had computed and lost: 6 - 4 = 2, not the 6 its preemption dropped, nor the 3
      it computes (the sampled token was never computed)."""
    sched = preemptive(num_blocks=3, budget=64, max_batch=2)
    a, b = Request("A", 0.0, range(200, 204), 3), Request("B", 1.0, range(100, 106), 20)
    first = b_preempted_until_a_is_done(sched, a, b)
    assert rows(first) == [("A", 0, 4), ("B", 0, 6)]
    assert rows(step(sched)) == [("B", 4, 3)]
    assert sched.recomputed_tokens == 2
    assert b.num_cached_tokens == 0  # the first admission's hit; the re-hit is counted apart
    counters = sched.allocator.counters  # B's 7 tokens looked up again, 4 found
    assert (counters.preempted_prefix_query_tokens, counters.preempted_prefix_hit_tokens) == (7, 4)
    assert (counters.prefix_query_tokens, counters.prefix_hit_tokens) == (4 + 6, 0)


def test_a_victim_that_finds_all_it_had_computed_cached_recomputes_nothing():
    """B (5 s, 4-token prompt) admitted before A (0 s, 4-token prompt, 3 tokens out); 3
    blocks, ``victim=latest_arrival``.

    - step 1: both prompts, a full (cached) block each; each samples a token.
    - step 2: B's decode (position 4) takes the last free block; A's needs one too: the
      victim is B (the latest arrival), with 4 tokens computed. Its new block, empty, goes to
      the head of the free queue and to A; its full block stays cached.
    - step 3: A's last token; B waits (it needs its cached block and one more, one free).
    - step 4: B is re-admitted and hits its 4 computed tokens: it recomputes nothing,
      ``recomputed_tokens`` stays 0 though B was preempted."""
    sched = preemptive(num_blocks=3, budget=64, max_batch=2, victim="latest_arrival")
    b, a = Request("B", 5.0, range(100, 104), 20), Request("A", 0.0, range(200, 204), 3)
    first = b_preempted_until_a_is_done(sched, b, a)
    assert rows(first) == [("B", 0, 4), ("A", 0, 4)]
    plan = step(sched)
    assert rows(plan) == [("B", 4, 1)] and plan.num_decode_tokens == 1  # B's first generated token, again
    assert sched.num_preemptions == 1 and sched.recomputed_tokens == 0
    counters = sched.allocator.counters
    assert (counters.preempted_prefix_query_tokens, counters.preempted_prefix_hit_tokens) == (5, 4)


def test_a_victim_that_finds_more_cached_than_it_had_computed_counts_no_recomputation():
    """A victim preempted mid-prefill may come back to find more of its prompt cached than it
    had computed (another request computed it meanwhile): it recomputes nothing, and the count
    never goes down. S (8-token prompt), R (3 tokens, 2 out), V (16 tokens, its first 8 S's
    prompt); budget 12, 4 blocks, the default victim. S samples tokens that continue V's prompt.

    - step 1: S's prompt (2 full blocks, cached), R's (1 block); V hits S's 2 blocks (8
      tokens) and gets the 1 token of budget left (a 3rd block): 4 blocks, none free.
    - step 2: S's decode (position 8) needs a block: V, the last admitted, is preempted with 9
      tokens computed; its 3rd block goes to S. R finishes, freeing its block.
    - steps 3-4: S decodes positions 9 and 10; V would need 2 more blocks besides S's 2, one
      is free: it waits.
    - step 5: S's decode fills its 3rd block (positions 8-11, V's prompt too): V hits 12
      tokens, needs 1 block, 1 is free, and is re-admitted with its last 4 tokens to compute.
      It had computed 9 and finds 12: ``recomputed_tokens`` adds max(0, 9 - 12) = 0."""
    prompt = list(range(100, 116))
    sched = preemptive(num_blocks=4, budget=12, max_batch=3)
    s, r, v = Request("S", 0.0, prompt[:8], 10), Request("R", 0.5, [7, 7, 7], 2), Request("V", 1.0, prompt, 2)
    for req in (s, r, v):
        sched.add_request(req, 0.0)
    assert rows(step(sched, {"S": prompt[8]})) == [("S", 0, 8), ("R", 0, 3), ("V", 8, 1)]
    plan = step(sched, {"S": prompt[9]})
    assert plan.preempted_req_ids == ("V",) and r.is_finished
    assert rows(step(sched, {"S": prompt[10]})) == [("S", 9, 1)]
    assert rows(step(sched, {"S": prompt[11]})) == [("S", 10, 1)]
    assert rows(step(sched)) == [("S", 11, 1), ("V", 12, 4)]
    assert sched.recomputed_tokens == 0
    counters = sched.allocator.counters
    assert (counters.preempted_prefix_query_tokens, counters.preempted_prefix_hit_tokens) == (16, 12)
