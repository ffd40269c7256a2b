"""Run progress: a bar only where one can be drawn, and no per-step callback work where not."""

from __future__ import annotations

import io

from paged_bench.cli.progress import JobBar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_is_shown_only_on_a_terminal_or_when_forced():
    assert not JobBar(file=io.StringIO()).shown  # logs, CI, pipes: tqdm would draw nothing
    assert JobBar(file=Terminal()).shown
    assert JobBar(file=io.StringIO(), disable=False).shown
    assert not JobBar(file=Terminal(), disable=True).shown
    assert not JobBar(enabled=False, file=Terminal()).shown  # a sweep's worker process


def test_the_command_gives_the_run_no_callback_when_no_bar_can_show(monkeypatch, config, tmp_path):
    from paged_bench.cli import hydra_job as job_module

    seen = {}

    def fake_run_job(cfg, run_dir, on_progress=None, **options):
        seen["on_progress"] = on_progress
        raise KeyboardInterrupt  # stop here: only the callback matters

    monkeypatch.setattr(job_module, "run_job", fake_run_job)
    monkeypatch.setattr(job_module.Job, "current", classmethod(lambda cls: _job(tmp_path)))
    from omegaconf import OmegaConf

    try:
        job_module.run(OmegaConf.create(config("tracking.enabled=false")))
    except KeyboardInterrupt:
        pass
    assert seen["on_progress"] is None  # pytest's stderr is not a terminal


def _job(tmp_path):
    from paged_bench.cli.hydra_job import Job

    return Job(run_dir=tmp_path, multirun=False, sweep_dir=None, num=None, name="default")
