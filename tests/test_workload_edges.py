"""Workload edge cases: a cap that never binds, trace times, columns and prompts, shared
prefixes and length specs that were silently misread (or crashed) before."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paged_bench.core.arrivals import ClosedLoop
from paged_bench.errors import ConfigError
from paged_bench.run import memory
from paged_bench.run.bench import build_workload
from paged_bench.run.job import run_job
from paged_bench.workloads.lengths import length_dist
from paged_bench.workloads.poisson import PoissonWorkload
from paged_bench.workloads.trace import TraceWorkload
from tests.test_arrivals import most_in_flight, reqs
from tests.test_workloads import CTX, synthetic

LOADED = ("workload=poisson", "workload.rate=5", "workload.num_requests=40", "workload.prompt_len=400",
          "workload.output_len=8", "tracking.enabled=false")  # fmt: skip


def test_a_cap_that_never_binds_changes_nothing(config, tmp_path):
    """Requests arriving during a step are sent when it ends, in an open loop as in a closed one:
    only a request the cap held back has its clock moved."""
    open_loop = run_job(config(*LOADED), tmp_path / "open")
    capped = run_job(config(*LOADED, "workload.max_concurrency=1000"), tmp_path / "capped")
    assert (tmp_path / "capped" / "requests.csv").read_text() == (tmp_path / "open" / "requests.csv").read_text()
    assert capped.summary == open_loop.summary


def test_a_binding_cap_moves_only_the_clocks_it_held(config, tmp_path):
    loop = ClosedLoop(reqs(0.0, 0.3, 0.5, 0.6), max_concurrency=2)
    loop.due(0.0)
    assert [(r.request_id, r.arrival_time) for r in loop.due(0.4)] == [(1, 0.3)]  # a slot was free at 0.3
    loop.finished(loop.requests[:1], 1.0)  # the loop was full from 0.4: request 2 (0.5) waited for this slot
    assert [(r.request_id, r.arrival_time) for r in loop.due(1.2)] == [(2, 1.0)]
    loop.finished(loop.requests[1:2], 1.5)
    assert [(r.request_id, r.arrival_time) for r in loop.due(1.5)] == [(3, 1.5)]
    out = run_job(config(*LOADED, "workload.max_concurrency=2"), tmp_path)
    assert most_in_flight(out.result.requests) == 2


def replay(tmp_path, text: str, name: str = "t.csv", **kw):
    path = tmp_path / name
    path.write_text(text)
    return TraceWorkload(path=str(path), **kw).requests(CTX)


def jsonl(*rows: dict) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


MS_ROWS = jsonl({"timestamp": 1700158546000, "prompt_len": 10, "output_len": 5},
                {"timestamp": 1700158547500, "prompt_len": 10, "output_len": 5})  # fmt: skip


@pytest.mark.parametrize("start", [0.0, "2023-11-16T18:15:47"])
def test_epoch_milliseconds_read_as_seconds_are_refused(tmp_path, start):
    """They replayed 1,000 times slower (or crashed on a datetime start: year 55845)."""
    with pytest.raises(ConfigError, match=r"t.jsonl:2'.*column 'timestamp' \(got 1.7001585475e\+12 s.*unit=ms"):
        replay(tmp_path, MS_ROWS, "t.jsonl", start=start)
    assert [r.arrival_time for r in replay(tmp_path, MS_ROWS, "t.jsonl", time_unit="ms")] == [0.0, 1.5]


def test_times_past_any_datetime_are_refused_not_a_crash(tmp_path):
    rows = jsonl({"timestamp": 1e18, "prompt_len": 10, "output_len": 5})
    with pytest.raises(ConfigError, match="epoch seconds before 2100"):
        replay(tmp_path, rows, "t.jsonl", start="2023-11-16T18:15:47")


@pytest.mark.parametrize(
    "header, field, both, pick, read",
    [  # arrival_time (5) was read, then prompt_tokens (10)
        ("time,arrival_time,prompt_len,output_len", "arrival_time", "time, arrival_time", "time", (0.0, 10)),
        ("arrival_time,input_tokens,prompt_tokens,output_len", "prompt_len", "input_tokens, prompt_tokens",
         "input_tokens", (0.0, 5)),
    ],
)
def test_two_recognised_columns_for_one_field_are_refused(tmp_path, header, field, both, pick, read):
    text = f"{header}\n0,5,10,5\n"
    with pytest.raises(ConfigError) as e:
        replay(tmp_path, text)
    assert f"one column for {field}, not 2 ({both}): pick one with workload.columns.{field}=COLUMN" in str(e.value)
    (r,) = replay(tmp_path, text, columns={field: pick})
    assert (r.arrival_time, r.num_prompt_tokens) == read


def test_a_json_prompt_of_token_ids_is_read_as_them(tmp_path):
    """It was tokenized as the text "[101, 102, 103]": 15 tokens."""
    (r,) = replay(tmp_path, jsonl({"timestamp": 0, "prompt": [101, 102, 103], "output_len": 5}), "t.jsonl")
    assert list(r.token_ids) == [101, 102, 103]


@pytest.mark.parametrize(
    "prompt, words",
    [
        ([{"role": "user", "content": "hi"}], "column 'prompt' holding prompt"),
        ({"text": "hi"}, "column 'prompt' holding prompt"),
        ([1, -2], "column 'prompt' holding prompt"),
        ([1, True], "column 'prompt' holding prompt"),
        ([1, 1000], "token ids below the model's vocabulary size, 1,000 (got 1,000)"),
    ],
)
def test_other_json_prompts_are_refused_naming_the_row(tmp_path, prompt, words):
    with pytest.raises(ConfigError) as e:
        replay(tmp_path, jsonl({"timestamp": 0, "prompt": prompt, "output_len": 5}), "t.jsonl")
    assert str(e.value).startswith(f"workload.path='{tmp_path / 't.jsonl'}:1' is not allowed: ")
    assert words in str(e.value)


@pytest.mark.parametrize(
    "prefix, message",
    [
        ({"length": 32}, "num_prefixes=0 is not allowed: an integer >= 1 when "
                         "workload.shared_prefix.length=32 is set (or both 0: no shared prefix)"),
        ({"num_prefixes": 3, "length": 0}, "length=0 is not allowed: an integer >= 1 when workload.shared_prefix."
                                           "num_prefixes=3 is set (or both 0: no shared prefix)"),
        # each prefix was drawn: a billion of them hung
        ({"num_prefixes": 10**9, "length": 1}, "num_prefixes=1000000000 is not allowed: at most "
                                               "workload.num_requests (40) prefixes: more are drawn and never sent"),
    ],
)
def test_a_shared_prefix_is_both_keys_or_neither_and_no_more_than_the_requests(prefix, message):
    with pytest.raises(ConfigError) as e:
        PoissonWorkload(num_requests=40, rate=5.0, prompt_len=8, output_len=4, shared_prefix=prefix)
    assert str(e.value) == f"workload.shared_prefix.{message}"


def test_a_prefix_too_long_for_memory_is_blamed_on_its_length(monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 2**30)
    with pytest.raises(ConfigError) as e:  # it was blamed on workload.prompt_len=Uniform(low=64, high=160)
        synthetic(num_requests=40, prompt_len={"dist": "uniform", "low": 64, "high": 160},
                  shared_prefix={"num_prefixes": 4, "length": 2**31 - 1}).requests(CTX)  # fmt: skip
    assert str(e.value).startswith("workload.shared_prefix.length=2147483647 is not allowed: prompts that fit")
    with pytest.raises(ConfigError) as e:  # the prompts' own lengths, as configured
        synthetic(num_requests=40, prompt_len={"dist": "uniform", "low": 64, "high": 2**31 - 1},
                  shared_prefix={"num_prefixes": 4, "length": 8}).requests(CTX)  # fmt: skip
    assert str(e.value).startswith("workload.prompt_len={'dist': 'uniform', 'low': 64, 'high': 2147483647} is not")


@pytest.mark.parametrize("sigma", [1e200, 40, 5.5])
def test_a_lognormal_sigma_past_any_use_is_refused(sigma):
    """1e200 overflowed the sampler; 40 made every length 1."""
    with pytest.raises(ConfigError) as e:
        length_dist("o", {"dist": "lognormal", "mean": 64, "sigma": sigma, "max": 256})
    assert str(e.value) == (f"o.sigma={sigma!r} is not allowed: a number from 0 to 5 (wider, nearly every length "
                            "is min or max)")  # fmt: skip
    # clipping to one length (min = max) is a way to fix it, whatever sigma
    fixed = length_dist("o", {"dist": "lognormal", "mean": 16, "sigma": 0.8, "min": 200, "max": 200})
    assert set(fixed.sample(np.random.default_rng(0), 100)) == {200}


def test_a_wide_lognormal_mean_is_before_clipping_to_max():
    """As the docstring says: mean 64, sigma 2.5, max 256 has a median of 3 and a mean of about 25."""
    spec = {"dist": "lognormal", "mean": 64, "sigma": 2.5, "max": 256}
    x = length_dist("o", spec).sample(np.random.default_rng(0), 100_000)
    assert np.median(x) == 3 and x.mean() == pytest.approx(25, rel=0.05) and (x == 1).mean() == pytest.approx(0.40, abs=0.01)


@pytest.mark.parametrize(
    "spec, key",
    [({"dist": "uniform", "low": 1, "high": True}, "p.high"),
     ({"dist": "lognormal", "mean": 10, "max": True}, "p.max")],  # fmt: skip
)
def test_a_boolean_is_no_length_bound(spec, key):
    with pytest.raises(ConfigError, match=f"^{key}=True is not allowed"):
        length_dist("p", spec)


def test_switching_a_length_distribution_says_how_and_that_works(config):
    with pytest.raises(ConfigError) as e:
        build_workload(config("workload=poisson", "+workload.prompt_len={dist:lognormal,mean:100}"))
    how = "'~workload.prompt_len' '+workload.prompt_len={dist:lognormal,...}'"
    assert how in str(e.value)
    switched = build_workload(config("workload=poisson", "~workload.prompt_len",
                                     "+workload.prompt_len={dist:lognormal,mean:100}"))  # fmt: skip
    assert switched.prompt_len.expected == 100


def test_requests_longer_than_max_model_len_are_said_to_be_cut(config, capsys):
    """The engine ends them at max_model_len, as vLLM's does; the run said nothing of it, and its
    throughput described shorter requests than the workload asked for."""
    from paged_bench.run.bench import build

    build(config("workload=poisson", "workload.num_requests=20", "workload.prompt_len=500",
                 "workload.output_len=100"))  # fmt: skip
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("note: 20 of 20 requests ask for more tokens than max_model_len=512 holds")
    build(config("workload=poisson", "workload.num_requests=20", "workload.prompt_len=300", "workload.output_len=100"))
    assert capsys.readouterr().err == ""
