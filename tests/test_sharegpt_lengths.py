"""The ShareGPT lengths shipped with paged_bench (paged_bench/data/lengths/) and vLLM's sampler
replayed over them (``paged_bench.workloads.sharegpt``, issue 35): the table is the dataset's
first two turns with its source and licence beside it, a draw keeps only what vLLM v0.6.0's
filter keeps, the same seed draws the same requests, a longer draw walks the table again, a
synthetic workload (``{dist: sharegpt}``, ``workload=sharegpt``) draws whole pairs, and the
validation cases' ShareGPT traces are such draws."""

from __future__ import annotations

import csv
from collections import Counter

import numpy as np
import pytest

from paged_bench.errors import ConfigError
from paged_bench.run.compose import compose_config
from paged_bench.validate.cases import Workload
from paged_bench.validate.workloads import write_trace
from paged_bench.workloads.base import WorkloadContext
from paged_bench.workloads.poisson import PoissonWorkload
from paged_bench.workloads.sharegpt import (
    MEANS_WITHIN,
    TABLE,
    sharegpt_kept,
    sharegpt_sample,
    sharegpt_table,
    sharegpt_with_means,
    vllm_keeps,
)

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
    credits = ("anon8231489123/ShareGPT_Vicuna_unfiltered", "Apache License 2.0", "MIT licence",
               "Marugannwg/ShareGPT92k_user_linguistic_mining", "derive_sharegpt_lengths.py")
    for credit in credits:
        assert credit in readme


def test_a_draw_is_what_vllms_filter_keeps_and_the_seed_fixes_it():
    table = sharegpt_table()
    drawn = sharegpt_sample(500, seed=0)
    assert drawn.shape == (500, 2) and vllm_keeps(drawn).all()
    assert not Counter(map(tuple, drawn.tolist())) - Counter(
        map(tuple, table.tolist())
    )  # rows of the table, none twice
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
    # the figures docs/workloads.md and the table's README quote
    outputs = kept[:, 1]
    assert (len(kept), round(kept[:, 0].mean()), round(outputs.mean())) == (899, 210, 206)
    assert (np.median(outputs), np.percentile(outputs, 99), outputs.max()) == (143, 769, 1530)


def test_past_the_rows_the_filter_keeps_a_draw_walks_a_new_shuffle():
    table = sharegpt_table()
    kept = table[vllm_keeps(table)]
    drawn = sharegpt_sample(len(kept) + 50, seed=3)
    first, more = drawn[: len(kept)], drawn[len(kept) :]
    assert sorted(map(tuple, first.tolist())) == sorted(map(tuple, kept.tolist()))  # every kept row once
    assert vllm_keeps(more).all() and not np.array_equal(more, first[:50])
    assert sharegpt_sample(0, seed=3).shape == (0, 2)


def test_a_synthetic_workload_draws_sharegpt_pairs_and_refuses_half_a_pair():
    pairs = set(map(tuple, sharegpt_table().tolist()))
    spec = {"dist": "sharegpt"}
    ctx = WorkloadContext(vocab_size=1000, encode=lambda text: [])
    requests = PoissonWorkload(num_requests=300, rate=10.0, prompt_len=spec, output_len=spec, seed=5).requests(ctx)
    drawn = [(r.num_prompt_tokens, r.max_tokens) for r in requests]
    assert len(drawn) == 300 and set(drawn) <= pairs  # each request one conversation's prompt and completion
    again = PoissonWorkload(num_requests=300, rate=10.0, prompt_len=spec, output_len=spec, seed=5).requests(ctx)
    assert [(r.num_prompt_tokens, r.max_tokens) for r in again] == drawn
    with pytest.raises(
        ConfigError,
        match=r"^workload.output_len=64 is not allowed: \{dist: sharegpt\}, as "
        r"workload.prompt_len is: ShareGPT's prompt and output lengths are drawn",
    ):
        PoissonWorkload(num_requests=3, rate=1.0, prompt_len=spec, output_len=64)
    with pytest.raises(ConfigError, match="no key of dist=sharegpt, which takes no keys"):
        PoissonWorkload(num_requests=3, rate=1.0, prompt_len={"dist": "sharegpt", "mean": 3}, output_len=spec)


def test_the_sharegpt_option_holds_a_whole_pair():
    cfg = compose_config("workload=sharegpt")
    workload = cfg["workload"]
    assert workload["name"] == "poisson" and workload["prompt_len"] == workload["output_len"] == {"dist": "sharegpt"}
    assert cfg["max_model_len"] == 2048 >= int(sharegpt_table().sum(axis=1)[vllm_keeps(sharegpt_table())].max())


def test_a_validation_cases_sharegpt_trace_has_the_published_means(tmp_path):
    """A published ShareGPT run is drawn with its own mean lengths: independent draws of the rows
    vLLM's filter keeps, the same for a seed, and means nobody can match are one clear error."""
    workload = Workload("sharegpt", num_requests=500, rate=float("inf"), prompt_len=202, output_len=179)
    path = write_trace(workload, tmp_path / "requests.csv", seed=7)
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    drawn = np.array([(int(r["prompt_len"]), int(r["output_len"])) for r in rows])
    assert np.array_equal(drawn, sharegpt_with_means(500, (202, 179), 7))
    assert np.all(np.abs(drawn.mean(axis=0) - (202, 179)) <= MEANS_WITHIN * np.array([202, 179]))
    kept = {tuple(r) for r in sharegpt_kept().tolist()}
    assert {tuple(r) for r in drawn.tolist()} <= kept
    assert len({tuple(r) for r in drawn.tolist()}) < 500  # drawn with replacement: the table is a sample
    assert abs(sharegpt_kept()[:, 1].mean() - 179) > 20  # so the match is the draw's
    assert not np.array_equal(drawn, sharegpt_with_means(500, (202, 179), 8))
    assert {float(r["arrival_time"]) for r in rows} == {0.0}  # QPS inf: every request at once
    with pytest.raises(ConfigError, match=r"ShareGPT means='202 in / 900 out' is not allowed: no draw of 50 "):
        sharegpt_with_means(50, (202, 900), 0)
