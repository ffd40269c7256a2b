"""A plugin package's config options checked before they are registered: a file in a folder
that is no config group, or named like an option paged_bench (or another package) already has,
is left out with one warning naming the package and the file; and ``--plugins`` names the
options that select each plugin by their ``name:``, whatever their file names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugin_support import fake_distribution
from tests.tracking_support import run_cli

LPF_MODULE = """from paged_bench.core.scheduler.continuous import ContinuousScheduler


class LongestPromptFirst(ContinuousScheduler):
    name = "lpf"
"""
LPF_OPTION = "name: lpf\nmax_batch: ${max_batch}\nmax_num_batched_tokens: ${max_num_batched_tokens}\n"
OPTION_FILES = {
    "allocators/mru2.yaml": "name: paged\nnum_blocks: ${num_blocks}\nblock_size: ${block_size}\n",  # misspelt group
    "scheduler/continuous.yaml": LPF_OPTION + "resume_first: true\n",  # paged_bench's own option's name
    "scheduler/longest_prompt.yaml": LPF_OPTION,  # selects lpf under another file name
}


def _conf_package(site: Path, package: str, files: dict[str, str]) -> None:
    conf = site / package
    conf.mkdir()
    (conf / "__init__.py").write_text("")
    for path, text in files.items():
        (conf / path).parent.mkdir(exist_ok=True)
        (conf / path).write_text(text)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """Two packages: my-plugins (the lpf scheduler and OPTION_FILES), and other-plugins, which
    ships an option named like one of my-plugins'."""
    root = tmp_path_factory.mktemp("site")
    fake_distribution(root, "my-plugins", {"paged_bench.schedulers": {"lpf": "my_plugins:LongestPromptFirst"},
                                           "paged_bench.conf": {"mine": "my_plugins_conf"}},
                      {"my_plugins": LPF_MODULE})  # fmt: skip
    _conf_package(root, "my_plugins_conf", OPTION_FILES)
    fake_distribution(root, "other-plugins", {"paged_bench.conf": {"other": "other_plugins_conf"}}, {})
    _conf_package(root, "other_plugins_conf", {"scheduler/longest_prompt.yaml": LPF_OPTION})
    return str(root)


def _warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("warning: plugin package")]


def test_the_default_run_works_with_misplaced_and_clashing_option_files_installed(tmp_path, site):
    proc = run_cli(tmp_path, "tracking.enabled=false", "workload.num_requests=5",
                   f"hydra.run.dir={tmp_path / 'run'}", PYTHONPATH=site)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ConfigStore schema" not in proc.stderr  # Hydra's merge of a plugin's file into the built-in
    assert "name: continuous" in (tmp_path / "run" / "config.yaml").read_text()
    lines = _warnings(proc.stderr)
    assert len(lines) == 3, proc.stderr  # once per file left out
    assert ("warning: plugin package my-plugins ships my_plugins_conf/scheduler/continuous.yaml, which paged_bench's "
            "own option scheduler=continuous already is: not registered; give it its own name") in lines  # fmt: skip
    (misplaced,) = [line for line in lines if "mru2.yaml" in line]
    assert "my-plugins" in misplaced and "but allocators/ is not one of paged_bench's config groups" in misplaced
    assert "allocator, backend, cluster" in misplaced and "not registered" in misplaced
    (clash,) = [line for line in lines if "longest_prompt.yaml" in line]  # whichever package came second
    assert "which option scheduler=longest_prompt of plugin package " in clash and "already is: not registered" in clash


def test_a_file_in_an_unknown_group_is_not_registered(tmp_path, site):
    help_text = run_cli(tmp_path, "--help", PYTHONPATH=site).stdout
    assert "mru2" not in help_text and "\nallocators:" not in help_text
    assert "scheduler: continuous, longest_prompt, preemptive, static" in help_text


def test_the_listing_names_the_options_that_select_each_plugin(tmp_path, site):
    proc = run_cli(tmp_path, "--plugins", PYTHONPATH=site)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    lpf = next(line for line in lines if line.strip().startswith("lpf "))
    assert "scheduler=longest_prompt" in lpf and "no config option" not in lpf and "scheduler=continuous" not in lpf
    continuous = next(line for line in lines if line.strip().startswith("continuous "))
    assert "scheduler=continuous" in continuous and "longest_prompt" not in continuous
    poisson = next(line for line in lines if line.strip().startswith("poisson "))
    assert "workload=poisson, workload=seed" in poisson  # seed.yaml says name: poisson
    trace = next(line for line in lines if line.strip().startswith("trace "))
    assert "workload=azure_conv, workload=trace" in trace  # azure_conv extends trace (defaults: trace@workload, _self_)
    assert len(_warnings(proc.stdout)) == 3


def test_a_plugin_without_an_option_is_still_told_how_to_select_it(tmp_path):
    site = fake_distribution(tmp_path / "site", "bare-plugins",
                             {"paged_bench.schedulers": {"lpf": "bare_plugins:LongestPromptFirst"}},
                             {"bare_plugins": LPF_MODULE})  # fmt: skip
    proc = run_cli(tmp_path, "--plugins", PYTHONPATH=str(site))
    lpf = next(line for line in proc.stdout.splitlines() if line.strip().startswith("lpf "))
    assert lpf.rstrip().endswith("from bare-plugins  (no config option: select with scheduler.name=lpf, or with "
                                 "'~scheduler' +scheduler.name=lpf for its own defaults)")
