"""The ShareGPT lengths shipped with paged_bench (paged_bench/data/lengths/) and vLLM's sampler
replayed over them (``paged_bench.workloads.sharegpt``, issue 35): the table is the dataset's
first two turns with its source and licence beside it, a draw keeps only what vLLM v0.6.0's
filter keeps, the same seed draws the same requests, more than the filter keeps is refused in
one line, and the validation cases' ShareGPT traces are such draws."""

from __future__ import annotations

import csv
from collections import Counter

import numpy as np
import pytest

from paged_bench.errors import ConfigError
from paged_bench.validate.cases import Workload
from paged_bench.validate.workloads import write_trace
from paged_bench.workloads.sharegpt import TABLE, sharegpt_sample, sharegpt_table, vllm_keeps

# the vLLM 0.6.0 post's 500 ShareGPT prompts: "Average input tokens: 202, average output tokens: 179"
PUBLISHED_MEANS = (202, 179)


def test_the_table_is_the_datasets_first_two_turns_with_its_source_and_licence():
    with TABLE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(sharegpt_table()) == 992
    assert len({r["id"] for r in rows}) == len(rows)  # one row a conversation
    # a third of the split's conversations open with the model's turn: their "completion" is the
    # user's reply, the short outputs a ShareGPT run's TPOT with every request at once rests on
    who = Counter(r["prompt_from"] for r in rows)
    assert 0.25 < who["gpt"] / len(rows) < 0.4 and who["human"] > who["gpt"]
    short = [int(r["output_len"]) for r in rows if r["prompt_from"] == "gpt"]
    assert np.median(short) < 40
    readme = " ".join((TABLE.parent / "README.md").read_text().split())
    for credit in ("anon8231489123/ShareGPT_Vicuna_unfiltered", "Apache License 2.0",
                   "Marugannwg/ShareGPT92k_user_linguistic_mining", "MIT licence", "derive_sharegpt_lengths.py"):  # fmt: skip
        assert credit in readme


def test_a_draw_is_what_vllms_filter_keeps_and_the_seed_fixes_it():
    table = sharegpt_table()
    drawn = sharegpt_sample(500, seed=0)
    assert drawn.shape == (500, 2) and vllm_keeps(drawn).all()
    assert not Counter(map(tuple, drawn.tolist())) - Counter(map(tuple, table.tolist()))  # rows of the table, none twice
    assert np.array_equal(drawn, sharegpt_sample(500, seed=0))
    assert not np.array_equal(drawn, sharegpt_sample(500, seed=1))
    edges = np.array([[3, 10], [10, 3], [4, 4], [1024, 1024], [1025, 4], [1000, 1049]])
    assert vllm_keeps(edges).tolist() == [False, False, True, True, False, False]


def test_the_kept_rows_are_the_population_the_post_sampled():
    """Against the post's own length figures (not the figures the validation judges): the kept
    rows' means are within 3 standard errors of a 500-request draw of them."""
    table = sharegpt_table()
    kept = table[vllm_keeps(table)]
    for column, published in enumerate(PUBLISHED_MEANS):
        values = kept[:, column]
        assert abs(values.mean() - published) < 3 * values.std() * (1 / 500 + 1 / len(values)) ** 0.5


def test_more_requests_than_the_filter_keeps_is_refused_in_one_line():
    kept = int(vllm_keeps(sharegpt_table()).sum())
    assert len(sharegpt_sample(kept, seed=3)) == kept
    with pytest.raises(ConfigError) as refused:
        sharegpt_sample(kept + 1, seed=3)
    message = str(refused.value)
    assert "workload.num_requests" in message and f"at most {kept}" in message and "\n" not in message


def test_a_validation_cases_sharegpt_trace_is_vllms_draw(tmp_path):
    workload = Workload("sharegpt", num_requests=40, rate=float("inf"), prompt_len=202, output_len=179)
    path = write_trace(workload, tmp_path / "requests.csv", seed=7)
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["prompt_len"]), int(r["output_len"])) for r in rows] == list(map(tuple, sharegpt_sample(40, 7).tolist()))
    assert {float(r["arrival_time"]) for r in rows} == {0.0}  # QPS inf: every request at once
