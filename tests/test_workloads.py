"""Workloads: arrival processes, length distributions, shared prefixes, trace replay."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paged_bench.core.request import Request
from paged_bench.errors import ConfigError
from paged_bench.model.tokenizers import ByteTokenizer
from paged_bench.workloads.base import WorkloadContext
from paged_bench.workloads.bursty import BurstyWorkload
from paged_bench.workloads.lengths import length_dist
from paged_bench.workloads.poisson import PoissonWorkload
from paged_bench.workloads.trace import TraceWorkload
from paged_bench.workloads.uniform import UniformWorkload

CTX = WorkloadContext(vocab_size=1000, encode=ByteTokenizer().encode)


def synthetic(cls=PoissonWorkload, **kw):
    base = dict(num_requests=2000, rate=50.0, prompt_len=8, output_len=4, seed=1)
    return cls(**{**base, **kw})


def gaps(requests) -> np.ndarray:
    return np.diff([r.arrival_time for r in requests])


def test_same_seed_same_requests_other_seed_other_requests():
    a, b = synthetic().requests(CTX), synthetic().requests(CTX)
    assert [(r.arrival_time, r.token_ids, r.max_tokens) for r in a] == [(r.arrival_time, r.token_ids, r.max_tokens) for r in b]
    c = synthetic(seed=2).requests(CTX)
    assert [r.arrival_time for r in a] != [r.arrival_time for r in c]


def test_changing_one_knob_does_not_reshuffle_the_others():
    a = synthetic().requests(CTX)
    b = synthetic(output_len={"dist": "uniform", "low": 1, "high": 50}).requests(CTX)
    assert [r.arrival_time for r in a] == [r.arrival_time for r in b]
    assert [r.token_ids for r in a] == [r.token_ids for r in b]


def test_poisson_gaps_have_mean_one_over_rate_and_cv_one():
    g = gaps(synthetic().requests(CTX))
    assert g.mean() == pytest.approx(1 / 50, rel=0.08)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.1)


def test_bursty_gaps_keep_the_rate_and_cluster_arrivals():
    g = gaps(synthetic(BurstyWorkload, burstiness=0.25).requests(CTX))
    assert g.mean() == pytest.approx(1 / 50, rel=0.12)
    assert g.std() / g.mean() == pytest.approx(2.0, rel=0.15)  # gamma: CV = 1/sqrt(shape)


def test_uniform_arrivals_are_evenly_spaced_from_zero():
    rs = synthetic(UniformWorkload, num_requests=5, rate=4.0).requests(CTX)
    assert [r.arrival_time for r in rs] == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])


def test_infinite_rate_sends_everything_at_once():
    rs = synthetic(num_requests=10, rate=float("inf")).requests(CTX)
    assert {r.arrival_time for r in rs} == {0.0}


def test_heavy_tail_is_the_seeds_mix():
    lengths = length_dist("o", {"dist": "heavy_tail"}).sample(np.random.default_rng(0), 20000)
    long = lengths > 80
    assert long.mean() == pytest.approx(0.2, abs=0.02)
    assert np.median(lengths[~long]) == pytest.approx(24, abs=1)
    assert np.median(lengths[long]) == pytest.approx(150, abs=3)


def test_lognormal_has_the_requested_mean_within_its_bounds():
    d = length_dist("o", {"dist": "lognormal", "mean": 64, "sigma": 0.5, "min": 1, "max": 10_000})
    x = d.sample(np.random.default_rng(0), 50000)
    assert x.mean() == pytest.approx(64, rel=0.03) and x.min() >= 1


def test_a_wide_lognormal_stays_within_the_token_bound():
    """Draws past int64 wrapped to negative lengths before they were clipped."""
    x = length_dist("o", {"dist": "lognormal", "mean": 1e9, "sigma": 5.0}).sample(np.random.default_rng(0), 100_000)
    assert x.min() >= 1 and x.max() == 2**31 - 1


def test_uniform_and_fixed_lengths():
    rng = np.random.default_rng(0)
    x = length_dist("p", {"dist": "uniform", "low": 3, "high": 5}).sample(rng, 1000)
    assert set(x) == {3, 4, 5}
    assert set(length_dist("p", 7).sample(rng, 10)) == {7}


@pytest.mark.parametrize(
    "spec, key",
    [
        ({"dist": "zipf"}, "p.dist"),
        ({"dist": "uniform", "low": 5, "high": 2}, "p.high"),
        ({"dist": "fixed", "value": 0}, "p.value"),
        ({"dist": "heavy_tail", "long_fraction": 2}, "p.long_fraction"),
        ({"dist": "lognormal", "mean": 10, "spread": 1}, "p.spread"),
        ("long", "p"),
        # past 2**31 - 1 tokens: an OverflowError in numpy's int64 columns after the run, before
        ({"dist": "fixed", "value": 10**20}, "p.value"),
        ({"dist": "uniform", "low": 1, "high": 10**20}, "p.high"),
        ({"dist": "lognormal", "mean": 1e30}, "p.mean"),
        ({"dist": "heavy_tail", "long": 10**20}, "p.long"),
    ],
)
def test_bad_length_specs_name_the_key(spec, key):
    with pytest.raises(ConfigError) as e:
        length_dist("p", spec)
    assert str(e.value).startswith(f"{key}=")


def test_shared_prefixes_give_requests_identical_first_tokens():
    rs = synthetic(num_requests=40, shared_prefix={"num_prefixes": 3, "length": 20}).requests(CTX)
    groups = {}
    for r in rs:
        assert r.num_prompt_tokens == 28
        groups.setdefault(r.prefix_group, set()).add(tuple(r.token_ids[:20]))
    assert len(groups) == 3 and all(len(prefixes) == 1 for prefixes in groups.values())
    # the ids are one draw per prefix, then the groups, then one draw per request's own tokens
    token_rng = np.random.default_rng(np.random.SeedSequence(1).spawn(4)[3])
    prefixes = [token_rng.integers(0, CTX.vocab_size, 20).tolist() for _ in range(3)]
    drawn = token_rng.integers(0, 3, 40).tolist()
    assert [r.prefix_group for r in rs] == drawn
    assert [r.token_ids.tolist() for r in rs] == [prefixes[g] + token_rng.integers(0, CTX.vocab_size, 8).tolist()
                                                  for g in drawn]  # fmt: skip


def test_tokens_stay_inside_the_vocabulary():
    rs = synthetic(num_requests=50, prompt_len=100).requests(WorkloadContext(17, CTX.encode))
    assert max(max(r.token_ids) for r in rs) < 17


def test_trace_replays_csv_and_jsonl(tmp_path):
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("arrival_time,prompt_len,prompt,output_len\n0.5,4,,3\n0.1,,hé,2\n")
    rs = TraceWorkload(path=str(csv_path), time_scale=2.0).requests(CTX)
    assert [r.arrival_time for r in rs] == [0.2, 1.0]  # sorted, scaled
    assert rs[0].token_ids.tolist() == list("hé".encode()) and rs[0].max_tokens == 2
    assert rs[1].num_prompt_tokens == 4 and rs[1].max_tokens == 3

    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("\n".join(json.dumps({"arrival_time": i, "prompt_len": 5, "output_len": 1}) for i in range(4)))
    assert len(TraceWorkload(path=str(jsonl), limit=2).requests(CTX)) == 2


def test_bad_traces_say_where(tmp_path):
    with pytest.raises(ConfigError, match="workload.path"):
        TraceWorkload(path=str(tmp_path / "missing.csv"))
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_time,output_len\n0,3\n")
    with pytest.raises(ConfigError, match="bad.csv.*prompt_len or prompt"):
        TraceWorkload(path=str(bad)).requests(CTX)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"arrival_time": 0}\n{oops\n')
    with pytest.raises(ConfigError, match="broken.jsonl:2"):
        TraceWorkload(path=str(broken)).requests(CTX)


def test_seed_preset_is_the_seeds_workload(config):
    from paged_bench.run.bench import build

    rs = build(config("workload=seed")).requests
    assert len(rs) == 48
    span = rs[-1].arrival_time
    assert 47 / span == pytest.approx(25, rel=0.35)  # 25 req/s, one draw
    long = sum(r.max_tokens > 80 for r in rs)
    assert 4 <= long <= 16  # ~20% of 48


@pytest.mark.parametrize("draw_tokens", [1 << 18, 50, 1])  # one draw; batches of a few prompts; one at a time
def test_prompts_are_the_per_request_draws_as_unsigned_64_bit_arrays(monkeypatch, draw_tokens):
    monkeypatch.setattr("paged_bench.workloads.base._DRAW_TOKENS", draw_tokens)
    rs = synthetic(num_requests=30, prompt_len={"dist": "uniform", "low": 1, "high": 40}).requests(CTX)
    token_rng = np.random.default_rng(np.random.SeedSequence(1).spawn(4)[3])
    for r in rs:
        expected = token_rng.integers(0, CTX.vocab_size, r.num_prompt_tokens).tolist()
        assert r.token_ids.tolist() == expected and r.token_ids.typecode == "Q" and type(r.token_ids[0]) is int
        assert r.num_tokens == r.num_prompt_tokens


@pytest.mark.parametrize("tokens", [[5, -1, 7], np.array([5, -1, 7]), np.array([5, -1, 7], np.int32)])
def test_a_negative_token_id_is_refused_with_one_clear_line(tokens):
    # held unsigned: a negative id would be an OverflowError from a list, and from a signed
    # numpy array silently an id near 2**64
    with pytest.raises(ValueError, match=r"^token id -1 is not a vocabulary index: token ids are integers from 0$"):
        Request(0, 0.0, tokens, 4)
    assert Request(0, 0.0, np.array([5, 0, 7], np.int32), 4).token_ids.tolist() == [5, 0, 7]
