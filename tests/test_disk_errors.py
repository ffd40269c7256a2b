"""A run folder that cannot be written (under a regular file, a full disk) is one line on
stderr naming the path and the OS's reason, exit 1, no traceback; a write that fails leaves
no temporary file and no file cut short that would pass for a complete one. And an error whose
first line is only SQLAlchemy's wrapper is shown by the line that says what failed."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from paged_bench.errors import ERROR_CHARS, one_line
from tests.tracking_support import call_cli


def _cli(cwd: Path, *args: str):
    return call_cli(cwd, *args, "workload.num_requests=20", "tracking.enabled=false")


def _one_line_naming(proc, path: str, reason: str) -> None:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: cannot write {path}") and line.endswith(f": {reason}"), line


@pytest.mark.parametrize("where", ["hydra.run.dir", "hydra.sweep.dir"])
def test_a_run_folder_under_a_regular_file_is_one_line(tmp_path, where):
    (tmp_path / "afile").write_text("")
    folder = tmp_path / "afile" / "sub"
    proc = _cli(tmp_path, *(["-m", "max_batch=1,2"] if where == "hydra.sweep.dir" else []), f"{where}={folder}")
    _one_line_naming(proc, str(folder), "Not a directory")


@pytest.mark.parametrize("sweep", [False, True])
def test_runs_being_a_regular_file_is_one_line(tmp_path, sweep):
    (tmp_path / "runs").write_text("not a folder\n")
    proc = _cli(tmp_path, *(["-m", "max_batch=1,2"] if sweep else []))
    _one_line_naming(proc, "runs/multirun/" if sweep else "runs/", "Not a directory")
    assert (tmp_path / "runs").read_text() == "not a folder\n"


# a file size limit stands in for a full disk (which needs a mount): the write fails part way
FULL_DISK_WRITER = """
import resource, signal, sys
from pathlib import Path
from paged_bench.results.whole_files import write_whole
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of a kill
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    write_whole(Path(sys.argv[1]), "x" * 1_000_000)
except OSError as e:
    print(e.errno, e.filename)
"""


def test_write_whole_leaves_no_temporary_file_when_the_write_fails(tmp_path):
    path = tmp_path / "run_info.json"
    path.write_text('{"old": true}\n')
    proc = subprocess.run([sys.executable, "-c", FULL_DISK_WRITER, str(path)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(errno.EFBIG), str(path)]  # the target named, not the temporary file
    assert [p.name for p in tmp_path.iterdir()] == ["run_info.json"]
    assert path.read_text() == '{"old": true}\n'


def test_write_whole_names_the_target_and_removes_its_temporary_file(tmp_path, monkeypatch):
    from paged_bench.results import whole_files as files

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full)
    with pytest.raises(OSError, match="No space left on device") as raised:
        files.write_whole(tmp_path / "config.yaml", "a: 1\n")
    assert raised.value.filename == str(tmp_path / "config.yaml")
    assert list(tmp_path.iterdir()) == []


def _full_disk_after_some_rows(monkeypatch):
    """``requests.csv``'s rows: the first ones, then the disk is full."""
    from paged_bench.results import run_files as outputs

    rows = outputs.request_rows

    def filling(*args):
        for n, row in enumerate(rows(*args)):
            if n == 5:
                raise OSError(errno.ENOSPC, "No space left on device")
            yield row

    monkeypatch.setattr(outputs, "request_rows", filling)


def _job(run_dir: Path):
    from paged_bench.cli import hydra_job as job_module

    return job_module.Job(run_dir=run_dir, multirun=False, sweep_dir=None, num=None, name="default")


def test_a_failed_csv_write_leaves_no_partial_file_and_is_one_line(tmp_path, monkeypatch, config, capsys):
    from omegaconf import OmegaConf

    from paged_bench.cli import hydra_job as job_module

    _full_disk_after_some_rows(monkeypatch)
    monkeypatch.setattr(job_module.Job, "current", classmethod(lambda cls: _job(tmp_path)))
    with pytest.raises(SystemExit) as exited:
        job_module.run(OmegaConf.create(config("workload.num_requests=20", "tracking.enabled=false")))
    assert exited.value.code == 1
    line = f"error: cannot write {tmp_path / 'requests.csv'}: No space left on device"
    assert capsys.readouterr().err.splitlines() == [line]
    assert not (tmp_path / "requests.csv").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left
    info = json.loads((tmp_path / "run_info.json").read_text())  # what could be recorded, was
    assert info["status"] == "failed" and info["error"] == line.removeprefix("error: ")


def test_an_os_error_elsewhere_stays_a_bug_with_its_traceback(tmp_path, monkeypatch, config):
    """Only the run's own folder is a write error: an OSError about another path is a bug's."""
    from omegaconf import OmegaConf

    from paged_bench.cli import hydra_job as job_module

    def reading(*args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp_path.parent / "elsewhere"))

    monkeypatch.setattr(job_module, "run_job", reading)
    monkeypatch.setattr(job_module.Job, "current", classmethod(lambda cls: _job(tmp_path / "run")))
    with pytest.raises(FileNotFoundError):
        job_module.run(OmegaConf.create(config("tracking.enabled=false")))
    assert json.loads((tmp_path / "run" / "run_info.json").read_text())["status"] == "failed"


SQLALCHEMY_SAYS = ("(raised as a result of Query-invoked autoflush; consider using a session.no_autoflush block if "
                   "this flush is occurring prematurely)\n(sqlite3.OperationalError) database or disk is full\n"
                   "[SQL: INSERT INTO metrics (key, value) VALUES (?, ?)]\n"
                   "(Background on this error at: https://sqlalche.me/e/20/e3q8)")  # fmt: skip


def test_one_line_skips_sqlalchemys_wrapper_for_the_cause():
    line = one_line(RuntimeError(SQLALCHEMY_SAYS))
    assert line == "RuntimeError: (sqlite3.OperationalError) database or disk is full"
    long = one_line(RuntimeError(SQLALCHEMY_SAYS.replace("is full", "is full " + "word " * 100)))
    assert len(long) <= ERROR_CHARS and "database or disk is full" in long and " ... " in long


def test_one_line_of_an_empty_or_wrapper_only_message_is_its_cause():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise RuntimeError("(raised as a result of Query-invoked autoflush)") from e
    except RuntimeError as e:
        assert one_line(e) == "RuntimeError: [Errno 28] No space left on device"
    assert one_line(RuntimeError("first\nsecond")) == "RuntimeError: first"  # a plain message as before
