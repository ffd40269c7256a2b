"""Real tensor parallelism (issue 12 item 3): backend=torch split over 2 CPU ranks (worker
processes over gloo) gives exactly TP=1's and transformers' greedy tokens on the same
checkpoint, under paged and contiguous KV, prefix hits, chunked prefill and preemption (recompute
and swap), each rank fed the frozen step plan alone;
the workers stop with the run, also when a rank dies or the run is interrupted, and no test
can hang (collective timeouts, an alarm)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from paged_bench.errors import ConfigError
from paged_bench.run.bench import build
from paged_bench.run.compose import compose_config
from tests.test_model_reference import _run, checkpoint  # noqa: F401  (the shared tiny checkpoint fixture)
from tests.tracking_support import call_cli, cli_env, run_cli

TP2 = ("backend.tensor_parallel_size=2",)


@pytest.fixture(autouse=True)
def no_hang():
    """Fail a test that runs past 120 s instead of hanging the suite."""

    def expire(*_):
        raise TimeoutError("tensor-parallel test ran past 120 s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def children(pid: int | None = None) -> list[int]:
    """Live child processes of ``pid`` (this process), from /proc, but multiprocessing's
    resource tracker (one per parent process, it lives as long as its parent)."""
    pid = pid or os.getpid()
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and b"resource_tracker" not in cmdline:
            out.append(int(stat.parent.name))
    return out


@pytest.fixture
def spawned():
    """The test's own child processes, as a call: those alive then that were not when the test
    began (a test file run before this one in the same pytest worker may still be ending one of
    its own); each with its command line, so that a leftover says what it is."""
    before = set(children())

    def own() -> list[str]:
        return [f"{p}: {_cmdline(p)}" for p in _wait_gone([p for p in children() if p not in before])]

    return own


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(gone)"


def _wait_gone(pids: list[int], seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


CASES = {
    "paged-prefix-hits": ["block_size=16"],
    "contiguous": ["allocator=contiguous"],
    "chunked-prefill": ["block_size=4", "max_num_batched_tokens=8"],
    "preempt-recompute": ["scheduler=preemptive", "block_size=4", "num_blocks=30"],
    "preempt-swap": ["scheduler=preemptive", "scheduler.mode=swap", "block_size=4", "num_blocks=30"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_tp2_greedy_tokens_equal_tp1_and_transformers(checkpoint, case, spawned):  # noqa: F811
    path, prompts, refs, _ = checkpoint
    one, one_reqs, _ = _run("torch", path, prompts, *CASES[case])
    two, two_reqs, seen = _run("torch", path, prompts, *CASES[case], *TP2)
    for r1, r2, ref in zip(one_reqs, two_reqs, refs):
        assert r2.output_token_ids == r1.output_token_ids == ref, f"request {r2.request_id} diverged under TP=2"
    assert len(prompts) >= 6 and two.num_preemptions == one.num_preemptions
    if case == "paged-prefix-hits":
        assert two.prefix_hit_tokens >= 32
    if case.startswith("preempt"):
        assert two.num_preemptions > 0  # every rank dropped the victim's state and took it back
    if case == "preempt-swap":
        assert seen["swapped_in"] > 0  # blocks went to every rank's swap space and came back
    assert spawned() == []


def test_tp4_replicates_kv_heads_and_still_matches(checkpoint):  # noqa: F811
    path, prompts, refs, _ = checkpoint  # 4 heads, 2 KV heads: each KV head on 2 of the 4 ranks
    _, reqs, _ = _run("torch", path, prompts[:3], "block_size=16", "backend.tensor_parallel_size=4")
    assert [r.output_token_ids for r in reqs] == refs[:3]


def test_the_ranks_hold_slices_and_stop_with_close(checkpoint):  # noqa: F811
    path, _, _, _ = checkpoint
    bench = build(compose_config("backend=torch", f"backend.model_path={path}", "workload.num_requests=2", *TP2))
    group = bench.backend.group
    try:
        workers = [w.pid for w in group.workers]
        assert len(workers) == 1 and set(workers) <= set(children())
        w = group.model.weights.layers[0]
        assert tuple(w.qkv.shape) == ((2 + 2 * 1) * 16, 64)  # 2 of 4 heads, 1 of 2 KV heads, head_dim 16
        assert tuple(w.gate_up.shape) == (2 * 64, 64) and tuple(w.down.shape) == (64, 64)
        assert tuple(bench.backend.group.model.pool.shape)[3] == 1  # the rank's KV heads per slot
        assert bench.backend.num_devices == 2
    finally:
        bench.backend.close()
    assert _wait_gone(workers, 2.0) == []
    bench.backend.close()  # twice is harmless


def test_a_dead_rank_fails_the_run_in_seconds_and_leaves_nothing(checkpoint, spawned):  # noqa: F811
    path, _, _, _ = checkpoint
    bench = build(compose_config("backend=torch", f"backend.model_path={path}", "workload.num_requests=6", *TP2))
    (worker,) = bench.backend.group.workers
    real, steps = bench.backend.execute, []

    def kill_then_step(plan):
        steps.append(plan)
        if len(steps) == 3:
            os.kill(worker.pid, signal.SIGKILL)
            worker.join(5)
        return real(plan)

    bench.backend.execute = kill_then_step
    started = time.monotonic()
    try:
        result = bench.engine.run(bench.requests)
    finally:
        bench.backend.close()
    assert result.error is not None and "tensor-parallel" in result.error
    # rank 0 looks at the workers every half second while a collective waits (gloo alone once
    # waited out its whole minute on a send to the dead rank)
    assert time.monotonic() - started < 15
    assert spawned() == []


def test_an_interrupted_run_stops_its_workers(checkpoint):  # noqa: F811
    path, _, _, _ = checkpoint
    bench = build(compose_config("backend=torch", f"backend.model_path={path}", "workload.num_requests=6", *TP2))
    workers = [w.pid for w in bench.backend.group.workers]
    real, steps = bench.backend.execute, []

    def interrupt(plan):
        steps.append(plan)
        if len(steps) == 3:
            raise KeyboardInterrupt
        return real(plan)

    bench.backend.execute = interrupt
    try:
        result = bench.engine.run(bench.requests)
    finally:
        bench.backend.close()
    assert result.interrupted
    assert _wait_gone(workers) == []


def test_bad_tp_sizes_are_one_line_errors(checkpoint, spawned):  # noqa: F811
    path, _, _, _ = checkpoint
    with pytest.raises(ConfigError, match="backend.tensor_parallel_size=3 .* attention heads"):
        build(compose_config("backend=torch", f"backend.model_path={path}", "backend.tensor_parallel_size=3"))
    with pytest.raises(ConfigError, match="backend.tensor_parallel_size=0"):
        build(compose_config("backend=torch", "backend.tensor_parallel_size=0"))
    assert spawned() == []  # a refused config starts no worker
    # refused once the workers are up (the model's positions, the pool): they are stopped again
    for refused in ("max_model_len=1024", "num_blocks=2"):
        with pytest.raises(ConfigError, match=refused):
            build(compose_config("backend=torch", f"backend.model_path={path}", *TP2, refused))
        assert spawned() == []


@pytest.mark.slow
def test_the_command_line_runs_tp2(tmp_path):
    proc = call_cli(tmp_path, "backend=torch", "workload.num_requests=8", "tracking.enabled=false", *TP2)
    assert proc.returncode == 0, proc.stderr
    assert "ranks x" not in proc.stderr  # a rank a thread, on this job's cores: nothing to say
    (summary,) = tmp_path.glob("runs/*/*/summary.json")
    assert json.loads(summary.read_text())["completed"] == 8


@pytest.mark.slow
def test_tp2_runs_inside_a_joblib_sweep_job(tmp_path):
    """A joblib job's process-wide start method is loky's, which the spawned worker was told to
    set and could not find: every TP job of a joblib sweep failed ("cannot find context for
    'loky'")."""
    # one job is enough: with n_jobs=2 joblib still hands it to a worker process of its own
    proc = run_cli(tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "backend=torch",
                   "workload.num_requests=4", "tracking.enabled=false", "seed=0", *TP2, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (summary,) = tmp_path.glob("**/summary.json")
    assert json.loads(summary.read_text())["completed"] == 4
    assert "Joblib.Parallel" in proc.stdout + proc.stderr  # it really was the joblib launcher


def _ctrl_c_after_a_worker_starts(tmp_path: Path, delay: float, *overrides: str) -> tuple[int, str, list[int]]:
    """Run the command with TP=2 in a session of its own, and ``delay`` seconds after its first
    worker appears send SIGINT to the whole group, as a terminal's Ctrl-C does: (exit status,
    stderr, the workers' pids)."""
    args = [sys.executable, "-m", "paged_bench", "backend=torch", "tracking.enabled=false", *TP2, *overrides]
    proc = subprocess.Popen(args, cwd=tmp_path, env=cli_env(), start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline, workers = time.monotonic() + 90, []
        while not workers and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            workers = children(proc.pid)
        assert workers, "no worker started"
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, err, workers


@pytest.mark.slow
def test_ctrl_c_on_the_command_line_leaves_no_worker(tmp_path):
    """Rank 0 stops the run and its workers (which ignore the signal themselves)."""
    # the tiny model, many requests: a run of a minute and more, whose weights take no time to make
    status, _, workers = _ctrl_c_after_a_worker_starts(tmp_path, 3.0, "workload.num_requests=2000")
    assert status != 0
    assert _wait_gone(workers) == []


@pytest.mark.slow
def test_ctrl_c_while_a_worker_starts_is_one_line(tmp_path):
    """A worker still importing torch when Ctrl-C came printed a KeyboardInterrupt traceback
    (it ignores the signal only once its own code runs): now it is born ignoring it."""
    status, err, workers = _ctrl_c_after_a_worker_starts(tmp_path, 0.3, "workload.num_requests=4")
    assert status == 130 and "Traceback" not in err, err[-1500:]
    assert _wait_gone(workers) == []


def test_more_rank_threads_than_cores_is_noted(capsys, monkeypatch):
    """TP=8 on 2 cores ran 8 ranks in turns, silently: ITL 100x TP=1's."""
    monkeypatch.setattr("paged_bench.backends.torch.cpu_share", lambda: 1)
    bench = build(compose_config("backend=torch", "backend.model=tiny", "workload.num_requests=2", *TP2))
    bench.backend.close()
    assert "note: backend.tensor_parallel_size=2 ranks x 1 thread on this job's one core" in capsys.readouterr().err
