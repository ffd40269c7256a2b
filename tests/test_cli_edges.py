"""Command lines at the edges: settings that were silently ignored, paths that are not what they
must be, and values Hydra or the OS choke on. Each is refused in one line, before the work
(or without losing it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from paged_bench.__main__ import _multirun_after_overrides
from paged_bench.calibration import calibrate as cal
from paged_bench.cluster import cluster_bench as cluster_build
from paged_bench.cluster.spec import cluster_spec
from paged_bench.errors import ConfigError
from paged_bench.report import document as report_build
from paged_bench.report.__main__ import main as report_main
from paged_bench.run import memory
from paged_bench.run.bench import build_engine
from paged_bench.serve.server import ServerConfig
from paged_bench.sizing.kv_bytes import as_flags
from paged_bench.sizing.kv_bytes import main as kv_bytes_main
from paged_bench.tracking.sync import main as sync_main
from tests.test_report import make_sweep
from tests.tracking_support import IN_PROCESS, Ran, call_cli, run_cli


def command(tmp_path: Path, module: str, *args: str) -> Ran:
    """``python -m MODULE ARGS`` in ``tmp_path``: in-process (``call_cli``) for the commands it
    runs as a fresh process would, else in a process of its own."""
    if module in IN_PROCESS:
        return call_cli(tmp_path, *args, module=module)
    return run_cli(tmp_path, *args, module=module)


def one_error_line(proc: Ran | subprocess.CompletedProcess, code: int = 2) -> str:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


# 1. a router with one replica: ran unchecked, as if it were round robin


@pytest.mark.parametrize("overrides", [
    ("router=prefix_affinity", "router.max_imbalance=-1"),
    ("router=power_of_two", "router.seed=abc"),
    ("router=least_kv",),
])  # fmt: skip
def test_a_router_with_one_replica_is_refused(config, overrides):
    with pytest.raises(ConfigError) as e:
        cluster_spec(config(*overrides))
    assert e.value.key == "router" and e.value.value == overrides[0].split("=")[1]
    assert "round_robin (the default) with one replica: a router needs two or more replicas" in str(e.value)


def test_the_default_router_with_one_replica_still_runs_and_its_settings_are_checked(config):
    assert cluster_spec(config()) is None and cluster_spec(config("router=round_robin")) is None
    with pytest.raises(ConfigError) as e:
        cluster_spec(config("+router.bogus=1"))
    assert e.value.key == "router.bogus"
    assert cluster_spec(config("router=prefix_affinity", "cluster.replicas=2")).num_replicas == 2


def test_a_renamed_plugin_and_a_cluster_run_are_labelled_by_what_ran(tmp_path):
    # router.name=least_kv ran least_kv under the option round_robin: the header named the option,
    # and a cluster's run_info.json named its workload's plugin (poisson), not its option (seed)
    proc = command(tmp_path, "paged_bench", "tracking.enabled=false", "workload.num_requests=20", "cluster.replicas=2",
                   "router.name=least_kv", f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "workload=seed, scheduler=continuous, allocator=paged, backend=sim, router=least_kv ->" in proc.stdout
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert info["choices"]["router"] == "least_kv" and info["choices"]["workload"] == "seed"


def test_a_job_that_fails_to_build_is_labelled_with_its_options(tmp_path):
    # its row in the sweep's table named the plugin (poisson) where the finished job's said seed
    proc = command(tmp_path, "paged_bench", "-m", "tracking.enabled=false", "workload.num_requests=10",
                   "max_batch=4,0", f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    assert proc.returncode == 1 and "max_batch=0 is not allowed" in proc.stderr
    infos = [json.loads((tmp_path / "sweep" / job / "run_info.json").read_text()) for job in ("0", "1")]
    assert [i.get("status", "finished") for i in infos] == ["finished", "failed"]
    assert [i["choices"]["workload"] for i in infos] == ["seed", "seed"]


def test_a_sweep_over_routers_on_one_replica_is_refused_before_its_first_job(tmp_path):
    # every job but round robin's failed at its start, after the first had run
    proc = command(tmp_path, "paged_bench", "-m", "tracking.enabled=false", "workload.num_requests=10",
                   "router=round_robin,least_kv", f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    assert proc.returncode == 2 and not (tmp_path / "sweep").exists()
    assert one_error_line(proc) == (
        "error: router='least_kv' is not allowed: round_robin (the default) with one replica: "
        "a router needs two or more replicas (set cluster.replicas=N, N >= 2, to compare routers)")
    proc = command(tmp_path, "paged_bench", "-m", "tracking.enabled=false", "workload.num_requests=10",
                   "router=round_robin,least_kv", "cluster.replicas=2", f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_a_capacity_sweep_from_one_replica_up_keeps_its_router(tmp_path):
    # -m cluster.replicas=1,2 router=least_kv was refused for its one-replica job: a capacity
    # question (how many replicas?) could not start from one
    proc = command(tmp_path, "paged_bench", "-m", "tracking.enabled=false", "workload.num_requests=10",
                   "router=least_kv", "cluster.replicas=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "note: router=least_kv has one replica to route to (cluster.replicas=1): the engine runs alone" in proc.stderr
    one, two = (json.loads((tmp_path / "sweep" / job / "summary.json").read_text()) for job in ("0", "1"))
    assert "num_replicas" not in one and two["num_replicas"] == 2


def test_a_router_with_one_replica_is_one_line_from_the_command(tmp_path):
    proc = command(tmp_path, "paged_bench", "tracking.enabled=false", "workload.num_requests=20",
                   "router=prefix_affinity", f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert "a router needs two or more replicas" in one_error_line(proc)
    assert not (tmp_path / "run" / "summary.json").exists()


# 2. calibrate --out that cannot be written: found after the whole calibration had run


def test_calibrate_refuses_an_out_under_a_file_before_calibrating(tmp_path, monkeypatch, capsys):

    monkeypatch.setattr(cal, "calibrate", lambda *a: pytest.fail("calibrated before --out was checked"))
    (tmp_path / "afile").write_text("")
    code = cal.main(["--hardware", "cpu", "--repeats", "1", "--out", str(tmp_path / "afile" / "x.json"),
                     "backend=numpy", "backend.model=tiny", "max_model_len=32"])  # fmt: skip
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and line.startswith(f"error: --out='{tmp_path / 'afile' / 'x.json'}' is not allowed: a file in")


def test_calibrate_keeps_its_preset_when_writing_out_fails_late(tmp_path, monkeypatch, capsys):

    calls = []

    def save(path, cost, info):  # the first write (to --out) fails, as a full disk would
        calls.append(path)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        path.write_text("preset")

    monkeypatch.setattr(cal, "save_preset", save)
    monkeypatch.setattr(cal, "calibrate", lambda *a: (None, {}))
    code = cal.main(["--hardware", "cpu", "--out", str(tmp_path / "x.json"), "backend=numpy", "backend.model=tiny",
                     "max_model_len=32"])  # fmt: skip
    (line,) = capsys.readouterr().err.strip().splitlines()
    spare = Path(line.rsplit(" ", 1)[-1])
    try:
        assert code == 1 and line.startswith(f"error: could not write --out {tmp_path / 'x.json'} (")
        assert "No space left on device" in line and spare.read_text() == "preset"
    finally:
        spare.unlink(missing_ok=True)


# 3. a config group given a list: a 40-57 line TypeError traceback from Hydra


@pytest.mark.parametrize("module", ["paged_bench", "paged_bench.serve", "paged_bench.calibration.calibrate"])
def test_a_group_override_given_a_list_is_one_line_in_every_entry_point(tmp_path, module):
    proc = command(tmp_path, module, "router=[1,2]", f"hydra.run.dir={tmp_path / 'run'}")
    assert one_error_line(proc) == ("error: router=[1, 2] is not allowed: an option name, one of least_kv, "
                                    "least_outstanding, power_of_two, prefix_affinity, round_robin")  # fmt: skip


@pytest.mark.parametrize("module", ["paged_bench", "paged_bench.serve"])
def test_a_group_override_given_null_names_the_group_and_its_options(tmp_path, module):
    # was Hydra's "Config group override must be a string or a list. Got NoneType": no group named
    proc = command(tmp_path, module, "cluster=null", f"hydra.run.dir={tmp_path / 'run'}")
    assert one_error_line(proc) == "error: cluster=null is not allowed: an option name, one of colocated, disaggregated"


def test_an_unknown_option_in_a_list_lists_the_real_options(tmp_path):
    proc = command(tmp_path, "paged_bench", "tracking.enabled=false", "cluster=[a,b]", f"hydra.run.dir={tmp_path}/r")
    assert one_error_line(proc) == "error: cluster=b is not allowed: one of colocated, disaggregated"


# 4. cluster.link given a list or a mapping: "unhashable type" traceback


@pytest.mark.parametrize("link", [[1, 2], {"a": 1}])
def test_a_link_that_is_not_a_name_is_refused(config, link):
    cfg = config("cluster.replicas=2")
    cfg["cluster"]["link"] = link
    with pytest.raises(ConfigError) as e:
        cluster_spec(cfg)
    assert e.value.key == "cluster.link" and e.value.value == link


# 5. report destinations that are not what they must be: tracebacks, some after the report was written


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):

    return make_sweep(tmp_path_factory.mktemp("runs") / "sw", [["workload.num_requests=8"]]) / "0"


def _write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("flag, where, says", [
    ("--out", lambda t: _write(t / "afile"), "a folder (this is a file)"),
    ("--out", lambda t: _write(t / "afile") / "sub", "a path in a folder ("),
    ("--md", lambda t: (t / "emptydir").mkdir() or t / "emptydir", "a file (this is a folder)"),
    ("--into", lambda t: (t / "emptydir").mkdir() or t / "emptydir", "a file (this is a folder)"),
    ("--md", lambda t: _write(t / "afile") / "x.md", "a path in a folder ("),
])  # fmt: skip
def test_a_report_destination_that_cannot_be_written_is_refused_first(one_run, tmp_path, monkeypatch, capsys,
                                                                      flag, where, says):  # fmt: skip

    monkeypatch.setattr(report_build, "build_report", lambda *a, **k: pytest.fail("built before its destination was checked"))
    path = where(tmp_path)
    code = report_main([str(one_run), "--no-plots", flag, str(path)])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and line.startswith(f"error: {flag}='{path}' is not allowed: {says}")


def test_a_report_file_that_fails_late_is_one_line_and_the_markdown_still_printed(one_run, tmp_path, monkeypatch,
                                                                                 capsys):  # fmt: skip

    md, write_text = tmp_path / "r.md", Path.write_text

    def full_disk(path, *args, **kwargs):  # the check passed; the write fails, as on a full disk
        if path == md:
            raise OSError(28, "No space left on device", str(md))
        return write_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    code = report_main([str(one_run), "--no-plots", "--out", str(tmp_path / "rep"), "--md", str(md)])
    out = capsys.readouterr()
    assert code == 1 and out.err.strip().splitlines()[-1] == f"error: could not write {md}: No space left on device"
    assert "### " in out.out and (tmp_path / "rep" / "report.md").is_file()


# 6, 7. server settings that passed the startup check and failed later, or meant something else


@pytest.mark.parametrize("key, value, allowed", [
    ("graceful_shutdown_s", 1e18, "a number from 0 to 3600"),  # OverflowError in the timer thread at Ctrl-C
    ("port", True, "a port 0-65535"),  # bound port 1
    ("port", False, "a port 0-65535"),  # bound any free port
    ("long_prefill_token_threshold", -1, "an integer >= 0"),  # 0 is no cap
    ("max_prefills_per_request", 0, "an integer >= 1"),  # 0 would never admit a request's prompts
])  # fmt: skip
def test_server_settings_are_checked_at_startup(key, value, allowed):

    with pytest.raises(ConfigError) as e:
        ServerConfig.from_mapping({key: value})
    assert str(e.value).startswith(f"server.{key}={value!r} is not allowed: {allowed}")


def test_a_long_grace_within_the_bound_and_port_zero_are_still_allowed():

    cfg = ServerConfig.from_mapping({"graceful_shutdown_s": 3600, "port": 0})
    assert (cfg.graceful_shutdown_s, cfg.port) == (3600, 0)


# 8. replica counts that are not integers were read as 0


@pytest.mark.parametrize("key, value", [
    ("prefill_replicas", ""), ("prefill_replicas", False), ("prefill_replicas", []), ("prefill_replicas", {}),
    ("decode_replicas", False), ("decode_replicas", ""),
])  # fmt: skip
def test_a_replica_count_that_is_no_integer_is_refused(config, key, value):
    cfg = config("cluster.replicas=2")
    cfg["cluster"][key] = value
    with pytest.raises(ConfigError) as e:
        cluster_spec(cfg)
    assert e.value.key == f"cluster.{key}" and e.value.value == value


def test_unset_replica_counts_still_mean_colocated(config):
    cfg = config("cluster.replicas=2")
    cfg["cluster"].update(prefill_replicas=None, decode_replicas=None)
    assert cluster_spec(cfg).num_decode == 2 and not cluster_spec(cfg).disaggregated
    cfg["cluster"].update(prefill_replicas=0, decode_replicas=0)
    assert cluster_spec(cfg).num_decode == 2


# 9. a cluster's memory check: N copies against the memory the replicas already built had left


def _pool_bytes(cfg, monkeypatch) -> int:
    """The least memory one replica's KV pool is allowed in (bisected: the formula is memory.py's)."""

    low, high = 0, 2**40
    while high - low > 1:
        mid = (low + high) // 2
        monkeypatch.setattr(memory, "available_memory", lambda mid=mid: mid)
        try:
            build_engine(cfg)
            high = mid
        except ConfigError:
            low = mid
    return high


def test_a_cluster_that_fits_is_not_refused_and_one_that_does_not_is_refused_first(config, monkeypatch):

    cfg = config("cluster.replicas=4", "workload.num_requests=8")
    one = _pool_bytes(cfg, monkeypatch)
    built, real = [], cluster_build.build_engine

    def counting(cfg, copies=1):
        engine = real(cfg, copies=copies)
        built.append(copies)
        return engine

    monkeypatch.setattr(cluster_build, "build_engine", counting)
    total = [4 * one]  # exactly four pools; each replica built takes its own (the workload's, once built: any)
    monkeypatch.setattr(memory, "available_memory", lambda: total[0] - len(built) * one if len(built) < 4 else 2**40)
    cluster_build.build_cluster(cfg, cluster_spec(cfg))  # refused at the second replica: 4 pools in 3 left
    assert built == [4, 1, 1, 1]

    built.clear()
    total[0] = 4 * one - 1
    with pytest.raises(ConfigError) as e:
        cluster_build.build_cluster(cfg, cluster_spec(cfg))
    assert e.value.key == "cluster.replicas" and e.value.value == 4 and built == []  # before the first replica was made
    assert "or fewer num_blocks" in str(e.value)


# 10. kv_bytes: errors named config keys, not its flags; flags for --hardware ignored without it


@pytest.mark.parametrize("args, line", [
    (["--model-path", "nosuchdir"], "--model-path='nosuchdir' is not allowed: a local folder"),
    (["--hardware", "h100", "--tp", "1000000"], "--tp=1000000 is not allowed: a divisor"),
    (["--hardware", "h100", "--gpu-memory-utilization", "0.0001"], "--gpu-memory-utilization=0.0001 is not allowed"),
    (["--tp", "-5"], "--tp=-5 is not allowed: an integer >= 1"),
    (["--tp", "3"], "--tp=3 is not allowed: a divisor"),  # without --hardware too: a run refuses it
    (["--gpu-memory-utilization", "-3"], "--gpu-memory-utilization=-3.0 is not allowed: a fraction in (0, 1]"),
    (["--max-num-seqs", "-1"], "--max-num-seqs=-1 is not allowed: an integer >= 1"),
    (["--seq-len", str(10**23)], f"--seq-len={10**23} is not allowed: an integer from 1 to 2,147,483,647"),
])  # fmt: skip
def test_kv_bytes_names_its_flags_and_checks_them_all(capsys, args, line):

    code = kv_bytes_main(args)
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err.startswith(f"error: {line}")


def test_kv_bytes_past_one_kv_head_per_rank_gives_the_runs_figure(capsys):
    # llama-3-8b has 8 KV heads: at --tp 16 each is held twice, and a run reports 262,144 bytes a token
    assert kv_bytes_main(["--model", "llama-3-8b", "--tp", "16"]) == 0
    assert "held by 2 ranks: 262,144 bytes/token (256.0 KiB) over all ranks" in capsys.readouterr().out


def test_kv_bytes_suggests_a_flag_not_a_config_key():

    e = as_flags(ConfigError("backend.tensor_parallel_size", 3, "too few heads; try backend.tensor_parallel_size=4"))
    assert str(e) == "--tp=3 is not allowed: too few heads; try --tp 4"


# 11. sync: a file, or a store it cannot open, reported as "0 run(s) uploaded", exit 0


def test_sync_refuses_a_file_in_one_line(tmp_path, capsys):

    (tmp_path / "afile").write_text("")
    code = sync_main([str(tmp_path / "afile")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and line.startswith(f"error: not a folder: {tmp_path / 'afile'} (")


def test_sync_of_a_folder_without_runs_opens_the_store_it_is_given(tmp_path, monkeypatch, capsys):

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "empty").mkdir()
    assert sync_main([str(tmp_path / "empty"), "--tracking-uri", "bogus://x"]) == 2  # no such kind of store
    assert capsys.readouterr().err.startswith("error: --tracking-uri='bogus://x' is not allowed: a tracking URI")
    (tmp_path / "folder.db").mkdir()
    code = sync_main([str(tmp_path / "empty"), "--tracking-uri", f"sqlite:///{tmp_path / 'folder.db'}"])
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()
    assert code == 1 and line.startswith("error: sync failed: ") and "folder.db" in line and out.out == ""
    # with no store named, a folder with no runs is nothing to do
    monkeypatch.chdir(tmp_path)
    assert sync_main([str(tmp_path / "empty")]) == 0
    assert "0 run(s) uploaded" in capsys.readouterr().out and not (tmp_path / "runs").exists()


# 12. -m after an override: Hydra's eight lines of usage ending in "unrecognized arguments"


def test_multirun_after_an_override_is_one_line(tmp_path):
    proc = command(tmp_path, "paged_bench", "tracking.enabled=false", "-m", "+experiment=routing")
    assert one_error_line(proc) == ("error: -m must come before the overrides: python -m paged_bench -m "
                                    "KEY=VALUE ...")  # fmt: skip


def test_multirun_before_the_overrides_is_left_to_hydra():

    assert _multirun_after_overrides(["-m", "max_batch=1,2"]) is None
    assert _multirun_after_overrides(["--cfg", "job", "-m", "max_batch=1,2"]) is None
    assert _multirun_after_overrides(["max_batch=1", "--multirun"]) == "--multirun"
