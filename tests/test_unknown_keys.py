"""A setting the config does not have: a typo (``max_bach=4``) got Hydra's "not in struct"
with the advice to add it with ``+``, and ``+max_bach=4`` then ran with ``max_batch`` left
unchanged. Both are now one line naming the nearest key and the keys there are."""

from __future__ import annotations

from importlib import resources

import pytest

from paged_bench.errors import ConfigError
from paged_bench.report.axes import check_declared
from paged_bench.run.compose import check_settings, compose_config, settings
from paged_bench.run.config import check_top_level
from tests.test_cli_edges import command, one_error_line

MAX_BACH = "max_bach=4 is not allowed: not a key of paged_bench's config (did you mean max_batch?); its keys are "


@pytest.mark.parametrize("override", ["max_bach=4", "+max_bach=4"])
def test_a_misspelled_setting_is_one_line_naming_the_one_meant(tmp_path, override):
    proc = command(tmp_path, "paged_bench", override, "tracking.enabled=false")
    line = one_error_line(proc)
    assert line.startswith(f"error: {MAX_BACH}allocator, backend, block_size, clock,"), line
    assert not list(tmp_path.glob("runs/*/*/summary.json"))


def test_a_misspelled_option_of_a_plugin_names_the_nearest_and_how_to_add_one(tmp_path):
    line = one_error_line(command(tmp_path, "paged_bench", "workload.rte=10", "tracking.enabled=false"))
    assert line == ("error: workload.rte=10 is not allowed: not a key of the workload section (did you mean "
                    "workload.rate?); its keys are max_concurrency, name, num_requests, output_len, prompt_len, rate, "
                    "schedule, seed, shared_prefix; a plugin option its file leaves out is added with +workload.rte=10")  # fmt: skip


def test_an_option_of_another_choice_of_the_group_names_that_choice(tmp_path):
    """backend=numpy backend.tensor_parallel_size=2 was told to add the key with +, which then
    failed: the option is torch's (and the simulator's), not a plugin's."""
    line = one_error_line(command(tmp_path, "paged_bench", "backend=numpy", "backend.tensor_parallel_size=2",
                                  "tracking.enabled=false"))  # fmt: skip
    assert line.endswith("; tensor_parallel_size is an option of backend=sim, backend=torch"), line


def test_the_server_refuses_a_misspelled_setting_too(tmp_path):
    line = one_error_line(command(tmp_path, "paged_bench.serve", "max_bach=4"))
    assert line.startswith(f"error: {MAX_BACH}"), line


EXPERIMENTS = sorted(p.name[: -len(".yaml")] for p in resources.files("paged_bench.conf.experiment").iterdir()
                     if p.name.endswith(".yaml"))  # fmt: skip


@pytest.mark.parametrize("overrides", [*([f"+experiment={e}"] for e in EXPERIMENTS), ["workload=azure_conv"]])
def test_every_shipped_config_has_only_known_settings(overrides):
    check_top_level(compose_config(*overrides))


def test_the_servers_config_has_only_known_settings():
    check_settings(compose_config(config_name="serve"), "serve")
    with pytest.raises(ConfigError, match=r"did you mean server\?"):
        check_settings({**compose_config(config_name="serve"), "sever": {}}, "serve")


def test_a_plain_run_refuses_the_servers_section(tmp_path):
    # settings were the union of both configs: +server.port=1 on a plain run ran, and did nothing
    line = one_error_line(command(tmp_path, "paged_bench", "+server.port=1", "tracking.enabled=false"))
    assert line == ("error: server={'port': 1} is not allowed: the server's section (python -m paged_bench.serve, "
                    "or target=served, which starts one); a run aims at a server with target=openai "
                    "target.base_url=URL"), line
    assert "server" not in settings()
    assert settings() | {"server"} == settings("serve")
    check_top_level(compose_config("target=served", "+server.tokenizer=byte"))  # the server it starts takes it


@pytest.mark.parametrize("override, expected", [
    # the top level lacks the section: "not a key of the server section; its keys are" the top level's
    ("server.port=1", "server.port=1 is not allowed: the server's section (python -m paged_bench.serve"),
    # the nearest was sought for the last segment (rate) among the top level's keys
    ("workloda.rate=3", ("workloda.rate=3 is not allowed: not a key of paged_bench's config (did you mean "
                         "workload.rate?); its keys are allocator,")),
    ("workload.rte.x=3", ("workload.rte.x=3 is not allowed: not a key of the workload section (did you mean "
                          "workload.rate.x?)")),
])  # fmt: skip
def test_a_section_the_config_lacks_is_named_not_its_last_key(tmp_path, override, expected):
    line = one_error_line(command(tmp_path, "paged_bench", override, "tracking.enabled=false"))
    assert line.startswith(f"error: {expected}"), line


@pytest.mark.parametrize("override", ["max_bach=2,4", "+max_bach=2,4", "workload.rte=1,2"])
def test_a_sweep_with_a_misspelled_key_is_refused_before_its_folder_and_parent_run(tmp_path, override):
    # each job failed with it, after the sweep's folder and a FAILED MLflow parent run were made
    store = tmp_path / "store"
    proc = command(tmp_path, "paged_bench", "-m", "scheduler=static,continuous", override,
                   f"tracking.uri=sqlite:///{store}/mlflow.db", f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    assert "(did you mean " in one_error_line(proc)
    assert not (tmp_path / "sweep").exists() and not store.exists()


def test_a_sweep_that_changes_into_each_jobs_folder_is_refused_before_its_first_job(tmp_path):
    # each job made an MLflow store of its own in its folder, and was logged there and in the sweep's
    store = tmp_path / "store"
    proc = command(tmp_path, "paged_bench", "-m", "max_batch=2,4", "hydra.job.chdir=true",
                   f"tracking.uri=sqlite:///{store}/mlflow.db", f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    assert one_error_line(proc).startswith("error: hydra.job.chdir=True is not allowed: false (paged_bench writes")
    assert proc.returncode == 2 and not (tmp_path / "sweep").exists() and not store.exists()


@pytest.mark.parametrize("override", ["experiment_name=a,b", "tracking.step_metrics=0,100"])
def test_a_sweep_over_where_it_is_recorded_is_refused_before_its_first_job(tmp_path, override):
    # its table had identical rows told apart by nothing; experiment_name=a,b went to one experiment
    proc = command(tmp_path, "paged_bench", "-m", override, "tracking.enabled=false",
                   f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    key, _, value = override.partition("=")
    assert one_error_line(proc) == (f"error: {key}='{value}' is not allowed: one value per sweep (it says where and "
                                    "how the sweep is recorded, not what its jobs run): run one sweep per value")
    assert proc.returncode == 2 and not (tmp_path / "sweep").exists()
    # one value is no sweep of it (a plain value's characters were taken for its sweep's values)
    proc = command(tmp_path, "paged_bench", "-m", f"{key}={value.split(',')[-1]}", "max_batch=2,4",
                   "workload.num_requests=2", "tracking.enabled=false", f"hydra.sweep.dir={tmp_path / 'one'}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_a_value_every_job_refuses_is_refused_before_the_first_job(tmp_path):
    # each job failed with the same line, under a FAILED parent run; one that some jobs refuse is theirs
    proc = command(tmp_path, "paged_bench", "-m", "max_batch=2,4", "workload.rate=-1", "tracking.enabled=false",
                   f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    assert one_error_line(proc) == "error: workload.rate=-1 is not allowed: a number > 0"
    assert proc.returncode == 2 and not (tmp_path / "sweep").exists()
    proc = command(tmp_path, "paged_bench", "-m", "workload.rate=-1,20", "workload.num_requests=2",
                   "tracking.enabled=false", f"hydra.sweep.dir={tmp_path / 'some'}")  # fmt: skip
    assert proc.returncode == 1 and "1 of 2 sweep jobs did not finish" in proc.stderr


def test_a_mistyped_report_axis_is_refused_before_a_sweep_runs(tmp_path):
    """report.x=max_bach was a note under the report, after every job had run."""
    proc = command(tmp_path, "paged_bench", "-m", "+experiment=seed_batching", "max_batch=4", "workload.num_requests=4",
                   "report.x=max_bach", "tracking.enabled=false")  # fmt: skip
    line = one_error_line(proc)
    assert line.startswith("error: report.x='max_bach' is not allowed: a setting of the run's config by its dotted "
                           "name (did you mean max_batch?); its top-level settings are allocator, backend,"), line  # fmt: skip
    assert not list(tmp_path.glob("runs/**/summary.json"))


def test_report_axes_name_settings_or_groups_in_the_shapes_allowed():
    config = {"max_batch": 4, "scheduler": {"name": "continuous", "max_batch": 4}, "workload": {"rate": 1.0}}
    check_declared({"x": "max_batch", "series": ["scheduler", "workload.rate"], "compare": "scheduler"}, config)
    for section, says in (({"facets": "workload.rte"}, "report.facets='workload.rte' is not allowed: a setting of "
                           "the run's config by its dotted name (did you mean workload.rate?); the workload section "
                           "has workload.rate"),
                          ({"compare": ["max_batch", "scheduler"]}, "one setting's dotted name"),
                          ({"series": 3}, "report.series=3 is not allowed: a setting's dotted name, or a list")):  # fmt: skip
        with pytest.raises(ConfigError) as e:
            check_declared(section, config)
        assert says in str(e.value)
