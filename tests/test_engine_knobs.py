"""The engine's knobs at their edges (a config fuzz of the top level, scheduler, allocator and
sim keys): every value either runs with figures that mean something or is one line naming it."""

from __future__ import annotations

import csv
import json
import math

import pytest

from paged_bench.core.clock import WallClock
from paged_bench.costmodel.roofline import RooflineCost, hardware, load_preset, save_preset
from paged_bench.errors import ConfigError, EngineError
from paged_bench.model.config import PRESETS, resolve_model
from paged_bench.run import memory
from paged_bench.run.bench import build_engine, build_workload
from paged_bench.run.compose import compose_config
from paged_bench.run.config import check_top_level
from paged_bench.run.job import run_job
from paged_bench.workloads.base import WorkloadContext
from tests.test_cli import cli

SMALL = ("workload.num_requests=6", "tracking.enabled=false")


def _refusal(config, *overrides: str) -> str:
    cfg = config(*SMALL, *overrides)
    check_top_level(cfg)
    with pytest.raises(ConfigError) as e:
        engine, _ = build_engine(cfg)
        engine.backend.close()
    return str(e.value)


def test_a_contiguous_pool_that_is_not_whole_slabs_runs_with_the_configured_memory(config, tmp_path):
    # refused as a broken plugin before ("made a pool of num_blocks=32, not the configured 40"),
    # and so was every roofline run with num_blocks=auto
    summary = run_job(config(*SMALL, "allocator=contiguous", "num_blocks=40"), tmp_path / "a").summary
    assert summary["completed"] == 6 and summary["kv_capacity_blocks"] == 40
    summary = run_job(config(*SMALL, "allocator=contiguous", "backend.cost_model=roofline"), tmp_path / "b").summary
    assert summary["completed"] == 6 and summary["kv_capacity_blocks"] > 28_000


def test_a_scheduler_copy_of_a_top_level_knob_may_not_exceed_it(config, tmp_path):
    # scheduler.max_batch=16 beside max_batch=1 ran out of KV blocks mid-run in a pool sized for
    # one sequence (and would pass a backend that serves one request at a time)
    assert _refusal(config, "max_batch=1", "scheduler.max_batch=16").startswith(
        "scheduler.max_batch=16 is not allowed: at most max_batch's value, 1")
    assert _refusal(config, "scheduler.max_num_batched_tokens=100000").startswith(
        "scheduler.max_num_batched_tokens=100000 is not allowed: at most max_num_batched_tokens's value, 8192")
    # a narrower policy stays possible (a plugin's option file may set its own, lower, max_batch)
    summary = run_job(config(*SMALL, "scheduler.max_batch=2"), tmp_path).summary
    steps = list(csv.DictReader((tmp_path / "steps.csv").open()))
    assert summary["completed"] == 6 and max(int(row["batch_size"]) for row in steps) == 2


@pytest.mark.parametrize("value", ["abc", "nan", "[1,2]", "-1", "true"])
def test_swap_blocks_of_the_wrong_type_is_one_line(config, value):
    message = _refusal(config, "scheduler=preemptive", "scheduler.mode=swap", f"allocator.swap_blocks={value}")
    assert message.startswith("allocator.swap_blocks=") and "an integer >= 0" in message


def test_swap_space_too_big_for_memory_names_swap_blocks(config, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 2**30)
    message = _refusal(config, "allocator.swap_blocks=100000000")
    assert message.startswith("allocator.swap_blocks=100000000 is not allowed: swap space that fits in memory")
    # 0 swap blocks is no swap space, not the pool's size again
    cfg = config(*SMALL, "allocator.swap_blocks=0")
    engine, _ = build_engine(cfg)
    assert engine.allocator.layout.num_cpu_blocks == 0


def test_a_model_on_virtual_time_steps_for_what_it_computed(config, tmp_path):
    # every latency was 0.0: the model's steps had no duration on a virtual clock
    run_dir = tmp_path / "run"
    summary = run_job(config("backend=numpy", "backend.model=tiny", "clock=virtual", "workload.num_requests=3",
                             "tracking.enabled=false"), run_dir).summary  # fmt: skip
    assert summary["completed"] == 3
    assert summary["median_ttft_ms"] > 0 and summary["median_itl_ms"] > 0 and summary["median_e2el_ms"] > 0
    durations = [float(line.split(",")[2]) for line in (run_dir / "steps.csv").read_text().splitlines()[1:]]
    assert durations and all(d > 0 for d in durations)


def test_a_pool_set_by_hand_beyond_the_hardware_is_refused(config):
    # 1,000,000 blocks reported 1.95 TiB of KV on one 79 GiB H100
    message = _refusal(config, "backend.cost_model=roofline", "num_blocks=1000000")
    assert message.startswith("num_blocks=1000000 is not allowed: at most 28,172: what the KV memory left on h100")


@pytest.mark.parametrize("overrides, key", [
    (("max_num_batched_tokens=1000000",), "max_num_batched_tokens=1000000"),
    (("max_batch=100000", "max_num_batched_tokens=120000"), "max_batch=100000"),  # the logits, a row per sequence
])  # fmt: skip
def test_activations_that_leave_no_kv_space_name_their_knob(config, overrides, key):
    # they blamed the weights and asked for more tensor-parallel ranks
    message = _refusal(config, "backend.cost_model=roofline", *overrides)
    assert message.startswith(f"{key} is not allowed: a smaller value:") and "of activations per step" in message


@pytest.mark.parametrize("override, expected", [
    ("backend.hardware=[1,2]", "backend.hardware=[1, 2] is not allowed: cpu, a100"),
    ("backend.interconnect=[1,2]", "backend.interconnect=[1, 2] is not allowed: nvlink3"),
    ("backend.dtype={a:1}", "backend.dtype={'a': 1} is not allowed: float32"),
    ("allocator.prefix_hash=[1,2]", "allocator.prefix_hash=[1, 2] is not allowed: builtin or sha256"),
])  # fmt: skip
@pytest.mark.parametrize("cost_model", ["roofline", "linear"])  # linear reads none of them, but a typo is refused
def test_names_that_are_not_strings_are_one_line(config, override, expected, cost_model):
    assert _refusal(config, f"backend.cost_model={cost_model}", override).startswith(expected)


def test_an_empty_model_name_is_refused_not_read_as_the_small_model(config):
    message = _refusal(config, "backend.cost_model=roofline", "backend.model=''")
    assert message.startswith("backend.model='' is not allowed: one of tiny")


def test_llama_presets_know_their_context():
    assert PRESETS["llama-3-8b"].max_position_embeddings == 8192  # Meta-Llama-3-8B's config.json
    assert PRESETS["llama-3-70b"].max_position_embeddings == 8192
    assert PRESETS["llama-3.2-1b"].max_position_embeddings == 131072


@pytest.mark.parametrize("field, value", [("mem_bandwidth", -1), ("peak_flops", 0), ("memory_bytes", "abc"),
                                          ("overhead", math.nan), ("eager_attention", "yes")])  # fmt: skip
def test_a_preset_with_figures_no_hardware_has_is_refused(tmp_path, field, value):
    path = tmp_path / "p.json"
    save_preset(path, RooflineCost(resolve_model("small"), hardware("cpu"), "float32"), {})
    data = json.loads(path.read_text())
    data["hardware"][field] = value
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=f"hardware.{field}"):
        load_preset(path)


def test_the_wall_clock_refuses_a_wait_sleep_cannot_hold():
    with pytest.raises(EngineError, match="the wall clock would wait 1e\\+10 s"):
        WallClock().wait_until(1e10)


def test_the_command_line_says_it_in_one_line(tmp_path):
    proc, _ = cli(tmp_path, "workload.num_requests=4", "allocator.swap_blocks=abc")
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: allocator.swap_blocks='abc' is not allowed: an integer >= 0")


def test_a_roofline_run_is_held_to_its_models_context(config):
    # 100,000 positions of Llama-3-8B ran, and reported figures of a model vLLM would not serve
    assert _refusal(config, "backend.cost_model=roofline", "max_model_len=100000").startswith(
        "max_model_len=100000 is not allowed: at most 8192, the model's max_position_embeddings")
    cfg = config("backend.cost_model=roofline", "workload=azure_conv", "workload.limit=20")  # the preset fits it
    check_top_level(cfg)
    engine, _ = build_engine(cfg)
    assert engine.backend.model_config.max_position_embeddings == cfg["max_model_len"] == 8192


def test_the_azure_presets_context_refuses_one_request_of_the_trace(config):
    # docs/workloads.md: 8,192 tokens refuse one request of 19,366, request 5,442 (14,050 prompt tokens)
    cfg = config("workload=azure_conv")
    requests = build_workload(cfg).requests(WorkloadContext(32000, lambda text: [0]))
    too_long = [i for i, r in enumerate(requests) if r.num_prompt_tokens >= cfg["max_model_len"]]
    assert len(requests) == 19_366 and cfg["max_model_len"] == 8192
    assert too_long == [5442] and requests[5442].num_prompt_tokens == 14_050


def test_a_rooflines_vocabulary_is_its_models_and_another_is_refused_not_ignored(config):
    # backend.vocab_size=258 with a roofline was dropped for the model's 128,256: a client's
    # prompts then held ids its server refused, every request a 400
    def vocab(*overrides: str) -> int:
        return build_engine(config(*SMALL, *overrides))[0].backend.vocab_size

    assert vocab() == 32000 and vocab("backend.vocab_size=258") == 258
    assert vocab("backend.cost_model=roofline") == PRESETS["llama-3-8b"].vocab_size
    assert vocab("backend.cost_model=roofline", "backend.model={preset:llama-3-8b,vocab_size:258}") == 258
    assert _refusal(config, "backend.cost_model=roofline", "backend.vocab_size=258") == (
        "backend.vocab_size=258 is not allowed: null with a roofline: its model's, 128256 (another: "
        "backend.model={preset:NAME,vocab_size:N})")  # fmt: skip


@pytest.mark.parametrize(("overrides", "expected"), [
    (("backend=sim",), 2048),  # no model to take it from
    (("backend=sim", "backend.cost_model=roofline"), 8192),  # llama-3-8b's max_position_embeddings
    (("backend=numpy",), 4096),  # the random-weight model's
])  # fmt: skip
def test_max_model_len_auto_is_the_models_context(overrides, expected):
    engine, _ = build_engine(compose_config(*overrides, "max_model_len=auto", "tracking.enabled=false"))
    assert engine.scheduler.max_model_len == expected
    engine.backend.close()
    with pytest.raises(ConfigError, match=r"^max_model_len='x' is not allowed: an integer >= 2, or auto \(the model's"):
        check_top_level(compose_config("max_model_len=x"))
