"""The numpy, torch and hf_generate backends as the engine and the command line see them:
wall-clock runs, the KV byte figures, options and their errors, a checkpoint's tokenizer,
seeded sampling, the generate-loop baseline serving the same weights, the thread-CPU step
timer, and the simulator remaking a numpy run from that run's own step times."""

from __future__ import annotations

import itertools
import time

import pytest

from paged_bench.backends.sim import SimBackend
from paged_bench.core.plan import StepOutput
from paged_bench.core.request import Request
from paged_bench.errors import ConfigError
from paged_bench.model.config import PRESETS
from paged_bench.run.bench import build
from paged_bench.run.job import run_job
from tests.conftest import compose_config
from tests.tracking_support import call_cli

torch = pytest.importorskip("torch")

SMALL_RUN = (
    "backend.model=tiny", "workload=uniform", "workload.num_requests=6", "workload.rate=200",
    "workload.prompt_len=16", "workload.output_len=8", "max_model_len=64", "tracking.enabled=false",
)  # fmt: skip


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_real_backend_run_on_the_wall_clock_with_kv_bytes(tmp_path, backend):
    cfg = compose_config(f"backend={backend}", "backend.threads=1", *SMALL_RUN)
    outcome = run_job(cfg, tmp_path)
    assert outcome.status == "finished"
    s, tiny = outcome.summary, PRESETS["tiny"]
    assert s["completed"] == 6 and s["total_output_tokens"] == 6 * 8
    assert s["kv_bytes_per_token"] == tiny.num_layers * tiny.num_kv_heads * tiny.head_dim * 4 * 2
    assert s["kv_reserved_bytes_peak"] == s["kv_reserved_slots_peak"] * s["kv_bytes_per_token"]
    for r in outcome.result.requests:  # wall clock: tokens stamped as steps finish, after arrival
        assert r.arrival_time <= r.first_scheduled_time <= r.token_times[0]
        assert r.token_times == sorted(r.token_times) and r.token_times[-1] <= outcome.result.duration


def test_wall_clock_is_the_default_for_real_backends():
    assert build(compose_config("backend=numpy", *SMALL_RUN)).engine.clock.kind == "wall"
    assert build(compose_config("backend=sim")).engine.clock.kind == "virtual"


@pytest.mark.parametrize(
    "override,key",
    [
        ("backend.dtype=float16", "backend.dtype"),  # a GPU choice
        ("backend.dtype=int8", "backend.dtype"),
        ("backend.device=tpu", "backend.device"),
        ("backend.threads=0", "backend.threads"),
        ("backend.model=nope", "backend.model"),
        ("backend.model_path=/nonexistent", "backend.model_path"),
    ],
)
def test_torch_backend_option_errors_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        build(compose_config("backend=torch", *SMALL_RUN, override))
    assert e.value.key == key


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_device_auto_is_cpu_without_cuda_and_cuda_is_refused(tmp_path):
    from paged_bench.backends.torch import TorchBackend

    be = TorchBackend(model="tiny")
    assert be.device.type == "cpu" and be.compute_dtype == "float32"
    proc = call_cli(tmp_path, "backend=torch", "backend.device=cuda", "backend.model=tiny", f"hydra.run.dir={tmp_path}",
                    "tracking.enabled=false")  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: backend.device='cuda' is not allowed: auto or cpu: no CUDA device here"
    ]


@pytest.fixture(scope="module")
def checkpoint_with_tokenizer(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<s>", "</s>", "hello", "world", "paged", "attention", "is", "fast"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    cfg = transformers.LlamaConfig(
        vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("with-tokenizer")
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    hf_tok.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_checkpoint_tokenizer_is_the_backends(checkpoint_with_tokenizer, backend):
    bench = build(compose_config(f"backend={backend}", f"backend.model_path={checkpoint_with_tokenizer}"))
    be = bench.backend
    assert type(be.tokenizer).__name__ == "HFTokenizer"
    ids = be.tokenizer.encode("paged attention is fast")
    assert ids == [5, 6, 7, 8]
    assert be.tokenizer.decode(ids + [2]) == "paged attention is fast"  # special tokens skipped
    assert be.eos_token_id == 2 and be.vocab_size == 9


def test_seeded_sampling_does_not_depend_on_batch_company():
    def outputs(max_batch: int) -> list[list[int]]:
        bench = build(compose_config("backend=numpy", "backend.model=tiny", "clock=virtual", f"max_batch={max_batch}"))
        reqs = [Request(i, 0.0, [10 + i] * (5 + i), 12, temperature=0.8, top_p=0.9, sampling_seed=i) for i in range(4)]
        bench.engine.run(reqs)
        return [r.output_token_ids for r in reqs]

    one_at_a_time, together = outputs(1), outputs(4)
    assert one_at_a_time == together
    assert len({tuple(o) for o in together}) == 4  # and they are samples, not one greedy answer


def test_hf_generate_serves_the_same_weights_one_request_at_a_time(tmp_path):
    pytest.importorskip("transformers")
    run = ("backend.model=tiny", "workload=uniform", "workload.num_requests=3", "workload.rate=1000",
           "workload.prompt_len=12", "workload.output_len=10", "max_model_len=64", "tracking.enabled=false")  # fmt: skip
    ours = run_job(compose_config("backend=numpy", *run), tmp_path / "ours")
    # backend=hf_generate sets max_batch 1 (the default 16 was refused: a new user's first try)
    hf = run_job(compose_config("backend=hf_generate", "scheduler=static", *run), tmp_path / "hf")
    assert hf.status == "finished"
    assert [r.output_token_ids for r in hf.result.requests] == [r.output_token_ids for r in ours.result.requests]
    # one at a time: each request starts only after the one before it has finished
    done = sorted(hf.result.requests, key=lambda r: r.first_scheduled_time)
    assert all(a.finish_time <= b.first_scheduled_time for a, b in itertools.pairwise(done))
    # 4-step windows: a request's last window runs out after it ended (idle steps, nothing to generate)
    windows = run_job(compose_config("backend=hf_generate", "scheduler=static", "scheduler.num_scheduler_steps=4", *run),
                      tmp_path / "windows")  # fmt: skip
    assert [r.output_token_ids for r in windows.result.requests] == [r.output_token_ids for r in ours.result.requests]
    with pytest.raises(ConfigError, match=r"max_batch=4 is not allowed: at most 1 with backend=hf_generate"):
        run_job(compose_config("backend=hf_generate", "max_batch=4", *run), tmp_path / "wrong")  # before it loads


def test_token_ids_outside_the_vocabulary_stop_the_run_with_a_clear_error():
    bench = build(compose_config("backend=numpy", "backend.model=tiny", "clock=virtual"))
    reqs = [Request(0, 0.0, [1, 2, 3], 4), Request(1, 0.0, [5, 9999], 4)]
    result = bench.engine.run(reqs)
    assert "request 1 has token ids outside the model's vocabulary (0 to 257)" in result.error
    assert result.leaks == [] and all(r.finish_reason.value == "error" for r in reqs)


def _sleepy_step_durations(timer: str) -> list[float]:
    """Step durations of a tiny numpy run on virtual time whose every step also sleeps 30 ms (a
    stand-in for another process holding the core: the step's thread is off the CPU)."""
    bench = build(compose_config("backend=numpy", "clock=virtual", f"backend.step_timer={timer}", *SMALL_RUN))
    execute = bench.backend.execute

    def sleepy(plan):
        time.sleep(0.03)
        return execute(plan)

    bench.backend.execute = sleepy
    result = bench.engine.run(bench.requests[:2])
    bench.backend.close()
    return [row.duration for row in result.steps.rows()]


def test_a_thread_cpu_step_timer_leaves_out_time_the_step_was_off_the_cpu():
    wall, cpu = _sleepy_step_durations("wall"), _sleepy_step_durations("thread_cpu")
    assert len(wall) > 2 and len(cpu) > 2 and min(wall) >= 0.03
    assert 0 < max(cpu) < 0.03  # the tiny model's step is well under a millisecond of CPU


@pytest.mark.parametrize(("override", "allowed"), [
    ("clock=wall", "wall on the wall clock .clock=wall.; thread_cpu times steps on virtual time"),
    ("backend.threads=2", "wall with backend.threads=2; .* backend.threads=1"),
])  # fmt: skip
def test_a_thread_cpu_step_timer_is_refused_where_it_would_not_count_the_step(override, allowed):
    with pytest.raises(ConfigError, match=rf"backend.step_timer='thread_cpu' is not allowed: {allowed}"):
        build(compose_config("backend=numpy", "clock=virtual", "backend.step_timer=thread_cpu", override, *SMALL_RUN))


def test_the_simulator_given_a_numpy_runs_own_step_times_makes_that_very_run(tmp_path, monkeypatch):
    """benchmarks/sim_vs_numpy.py compares cost models, and that holds only while both backends run one engine:
    given a numpy run's step durations, in order, the simulator makes the same run, step for step and request
    for request, its preemptions included. Whatever differs between the two in that script is then the cost."""
    case = ("backend.model=tiny", "workload=seed", "workload.rate=2000", "max_model_len=512",
            "scheduler=preemptive", "num_blocks=32", "tracking.enabled=false")  # fmt: skip
    numpy_options = ("backend=numpy", "clock=virtual", "backend.step_timer=thread_cpu")
    real = run_job(compose_config(*numpy_options, *case), tmp_path / "numpy")
    real_steps = list(real.result.steps.rows())
    durations = iter([row.duration for row in real_steps])
    monkeypatch.setattr(SimBackend, "execute", lambda self, plan: StepOutput([0] * len(plan.req_ids), next(durations)))
    sim = run_job(compose_config("backend=sim", *case), tmp_path / "sim")
    assert real.summary["num_preemptions"] > 0  # the pool ran dry: recomputed prompts are part of the run
    assert list(sim.result.steps.rows()) == real_steps
    for column in ("arrival_time", "first_scheduled_time", "finish_time", "chunk_times", "output_tokens"):
        assert getattr(sim.records, column).tolist() == getattr(real.records, column).tolist(), column
    assert sim.records.num_preemptions == real.records.num_preemptions
    figures = ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "output_throughput", "num_preemptions")
    assert {k: sim.summary[k] for k in figures} == {k: real.summary[k] for k in figures}
