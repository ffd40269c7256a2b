"""The core's small contracts the mutation check (``benchmarks/mutation_core.py``) found
untested: a request's prompt forms and defaults (its own ``__init__`` and a dataclass
subclass's), the plan's defaults and ``StepPlan.starting``, the step records past a chunk and
in a window, both clocks at their limits, a closed loop whose cap does not bind, and the
figures an engine result defaults to."""

from __future__ import annotations

import time
import tracemalloc
from array import array
from dataclasses import dataclass

import numpy as np
import pytest

from paged_bench.core.arrivals import ClosedLoop
from paged_bench.core.clock import HORIZON_S, VirtualClock, WallClock, make_clock
from paged_bench.core.engine import EngineResult
from paged_bench.core.kv.base import KVLayout
from paged_bench.core.plan import NewRequestData, SamplingParams, StepPlan
from paged_bench.core.request import FinishReason, Request, check_stop
from paged_bench.core.step_records import CHUNK_ROWS, STEP_COLUMNS, StepRecords
from paged_bench.errors import EngineError

# -- requests -------------------------------------------------------------------------------


def test_a_numpy_prompt_becomes_the_requests_token_array():
    req = Request(0, 0.0, np.array([3, 1, 2], dtype=np.int64), 4)
    assert req.token_ids == array("Q", [3, 1, 2]) and req.num_prompt_tokens == 3 and req.max_num_tokens == 7
    assert Request(1, 0.0, np.zeros(0, dtype=np.int64), 4).token_ids == array("Q")
    with pytest.raises(ValueError, match="token id -1 is not a vocabulary index"):
        Request(2, 0.0, np.array([5, -1]), 4)
    assert Request(3, 0.0, np.array([0, 7]), 4).token_ids == array("Q", [0, 7])  # 0 is a token
    with pytest.raises(ValueError, match="token id -2 is not a vocabulary index"):
        Request(4, 0.0, [5, -2], 4)  # a list's too


def test_a_request_ignores_eos_unless_asked_as_the_benchmarks_do():
    """vLLM's benchmark client sends ignore_eos: a request runs to its length unless it asks to stop at EOS."""
    req = Request(0, 0.0, [1, 2], 4)
    req.token_ids.append(9)  # the end token
    assert check_stop(req, frozenset({9})) is None
    req.ignore_eos = False
    assert check_stop(req, frozenset({9})) is FinishReason.STOP


def test_a_signed_array_prompt_is_held_unsigned():
    assert Request(0, 0.0, array("q", [1, 2]), 4).token_ids.typecode == "Q"


def test_a_new_request_has_computed_and_cached_nothing():
    req = Request(0, 0.0, [1, 2], 4)
    assert (req.num_computed_tokens, req.num_cached_tokens, req.num_preemptions) == (0, 0, 0)
    assert req.error is None and req.finish_reason is None and req.first_token_time is None


@dataclass(eq=False)  # no slots, as the server's LogprobsRequest
class Tagged(Request):
    tag: str = ""


def test_a_dataclass_subclass_starts_as_a_request_does():
    """The server's requests subclass ``Request`` as a dataclass: its generated ``__init__``
    sets the fields from their defaults and takes the prompt through ``__post_init__``."""
    req = Tagged(0, 0.0, [1, 2, 3], 4, tag="x")
    assert req.token_ids == array("Q", [1, 2, 3]) and req.num_prompt_tokens == 3 and req.max_num_tokens == 7
    assert (req.num_computed_tokens, req.num_cached_tokens, req.num_preemptions) == (0, 0, 0)
    assert req.error is None and req.token_times == [] and not req.want_prompt_logprobs


# -- the plan -------------------------------------------------------------------------------


def test_an_empty_plan_computes_nothing_and_sampling_defaults_are_greedy_and_one_token():
    plan = StepPlan()
    assert plan.is_empty and plan.num_reqs == plan.num_scheduled_tokens == plan.num_decode_tokens == 0
    assert plan.num_prefill_tokens == 0 and plan.num_preempted == 0
    assert not StepPlan(swap_in=((0, 1),)).is_empty and not StepPlan(swap_out=((1, 0),)).is_empty
    assert not StepPlan(req_ids=(7,), num_computed_tokens=(0,), num_new_tokens=(1,)).is_empty
    assert StepPlan(preempted_req_ids=(3, 4)).num_preempted == 2
    assert SamplingParams() == (0.0, 1.0, None, 1, True)


def test_a_starting_plan_samples_where_a_chunk_reaches_the_end_and_counts_decodes():
    def new(rid, tokens, prompt, computed):
        return NewRequestData(rid, tuple(range(tokens)), prompt, (0, 1, 2, 3), computed, SamplingParams())

    plan = StepPlan.starting(iter([
        (new("whole", 8, 8, 0), 8),  # a whole prompt: samples
        (new("chunk", 8, 8, 0), 5),  # stops short: no sample
        (new("decode", 9, 8, 8), 1),  # the token after the prompt
        (new("last", 8, 8, 7), 1),  # the prompt's last token: one token, no decode
    ]))  # fmt: skip
    assert plan.req_ids == ("whole", "chunk", "decode", "last") and plan.num_computed_tokens == (0, 0, 8, 7)
    assert plan.partial_rows == frozenset({1}) and plan.num_decode_tokens == 1 and plan.num_prefill_tokens == 14
    assert [row.samples for row in plan.rows()] == [True, False, True, True]


# -- step records ---------------------------------------------------------------------------


def row(i: int) -> tuple:
    return (i, 0.5 * i, 0.5, *(i + j for j in range(len(STEP_COLUMNS) - 3)))


@pytest.mark.parametrize("n", [0, 1, CHUNK_ROWS - 1, CHUNK_ROWS, CHUNK_ROWS + 1, 2 * CHUNK_ROWS + 3])
def test_step_records_read_back_what_was_appended_across_chunks(n):
    records = StepRecords()
    for i in range(n):
        records.append(row(i))
    assert len(records) == n and bool(records) == (n > 0)
    assert records.column("step").tolist() == list(range(n)) and records.column("time").dtype == np.float64
    assert records.last() == (tuple(row(n - 1)) if n else None)
    assert records.columns == STEP_COLUMNS and records != "rows"
    copy = StepRecords()
    for values in records.rows():
        copy.append(values)
    assert copy == records


@pytest.mark.parametrize(("kept", "n"), [(1, 5), (10, 25), (CHUNK_ROWS, CHUNK_ROWS + 10), (CHUNK_ROWS + 5, 3 * CHUNK_ROWS)])
def test_step_records_kept_in_a_window_are_the_latest(kept, n):
    records = StepRecords(kept)
    for i in range(n):
        records.append(row(i))
    assert len(records) == kept and records.column("step").tolist() == list(range(n - kept, n))
    assert records.last() == tuple(row(n - 1))


def test_step_records_kept_in_a_window_hold_flat_memory():
    """A server's records keep the latest rows only: appending 3 chunks' worth to a window of
    10 rows holds a few kilobytes (the rows themselves take 3 MB)."""
    tracemalloc.start()
    try:
        records = StepRecords(10)
        for i in range(3 * CHUNK_ROWS):
            records.append(row(i))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 200_000 and len(records) == 10


# -- clocks ---------------------------------------------------------------------------------


def test_each_clock_kind_is_made_by_its_name():
    assert isinstance(make_clock("virtual"), VirtualClock) and make_clock("virtual").kind == "virtual"
    assert isinstance(make_clock("wall"), WallClock) and make_clock("wall").kind == "wall"


def test_the_virtual_clock_restarts_at_zero_and_stops_short_of_its_horizon():
    clock = VirtualClock()
    clock.wait_until(5.0)
    clock.start()
    assert clock.now() == 0.0
    for t in (HORIZON_S, float("inf")):
        with pytest.raises(EngineError, match="would pass"):
            clock.wait_until(t)
    with pytest.raises(EngineError, match="would pass"):
        clock.advance(HORIZON_S - 1.0, 1.0)  # a step ending on the horizon
    assert clock.now() == 0.0 and clock.advance(0.0, 2.5) == 2.5


def test_the_wall_clock_counts_from_its_start_and_never_sleeps_for_the_past():
    clock = WallClock()
    assert 0.0 <= clock.now() < 1.0
    time.sleep(0.2)
    clock.start()
    assert clock.now() < 0.2
    time.sleep(0.2)
    began = time.perf_counter()
    clock.wait_until(0.1)  # 0.1 s ago: no wait, and no sleep for a negative time
    assert clock.advance(clock.now(), 0.0) >= 0.2
    assert time.perf_counter() - began < 0.15
    with pytest.raises(EngineError, match="the wall clock would wait"):
        clock.wait_until(1e12)


# -- arrivals -------------------------------------------------------------------------------


def test_a_closed_loop_whose_cap_does_not_bind_keeps_every_arrival_time():
    reqs = [Request(i, t, [1, 2, 3], 2) for i, t in enumerate([0.0, 0.5, 2.0])]
    loop = ClosedLoop(reqs, max_concurrency=3)
    assert loop.due(0.0) == reqs[:1]
    loop.finished(reqs[:1], 1.0)  # a slot opens in a loop that was not full
    assert loop.due(1.0) == reqs[1:2] and reqs[1].arrival_time == 0.5


# -- results --------------------------------------------------------------------------------


def test_an_engine_result_made_elsewhere_defaults_to_no_preemption_hits_error_or_leak():
    """A load generator's or a cluster's result names only what it measured."""
    result = EngineResult([], StepRecords(), 1.0, KVLayout(4, 16, 0), None, 0, 0, 0, 0, 0)
    assert (result.preempted_prefix_query_tokens, result.preempted_prefix_hit_tokens) == (0, 0)
    assert result.error is None and result.interrupted is False and result.leaks == []
