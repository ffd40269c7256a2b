"""Command lines at the edges: settings that were silently ignored, paths that are not what they
must be, and values Hydra or the OS choke on. Each is refused in one line, before the work
(or without losing it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from paged_bench.__main__ import _multirun_after_overrides
from paged_bench.calibration import calibrate as cal
from paged_bench.errors import ConfigError
from paged_bench.report import document as report_build
from paged_bench.report.__main__ import main as report_main
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
    ("max_prefills_per_request", 0, "an integer >= 1"),  # 0 would never admit a request's prompts
])  # fmt: skip
def test_server_settings_are_checked_at_startup(key, value, allowed):

    with pytest.raises(ConfigError) as e:
        ServerConfig.from_mapping({key: value})
    assert str(e.value).startswith(f"server.{key}={value!r} is not allowed: {allowed}")


def test_a_long_grace_within_the_bound_and_port_zero_are_still_allowed():

    cfg = ServerConfig.from_mapping({"graceful_shutdown_s": 3600, "port": 0})
    assert (cfg.graceful_shutdown_s, cfg.port) == (3600, 0)


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
