"""The traffic's knobs at their edges (a config fuzz of workload.* and target.*): every value
either sends traffic that means something or is one line naming it, before anything runs."""

from __future__ import annotations

import pytest

from paged_bench.errors import ConfigError
from paged_bench.loadgen.config import TargetConfig
from paged_bench.run.bench import build_workload
from paged_bench.run.config import check_top_level
from paged_bench.workloads.base import WorkloadContext


def _workload_refusal(config, *overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        build_workload(config(*overrides)).requests(WorkloadContext(32000, lambda text: [0]))
    return str(e.value)


@pytest.mark.parametrize("overrides, expected", [
    # a rate whose requests arrive past the clock's horizon: a ZeroDivisionError traceback (bursty)
    # or a failure at the first idle wait naming no key
    (("workload=bursty", "workload.rate=5e-324"), "workload.rate=5e-324 is not allowed: a rate at which 200 requests"),
    (("workload=poisson", "workload.rate=1e-308"), "workload.rate=1e-308 is not allowed"),
    # a trace rescaled past it: nan arrival times
    (("workload=azure_conv", "workload.limit=20", "workload.rate=5e-324"),
     "workload.rate=5e-324 is not allowed: a value that puts the last arrival within the clock's 1e+12 s"),
    (("workload=azure_conv", "workload.limit=20", "workload.time_scale=1e18"),
     "workload.time_scale=1e+18 is not allowed: a value that puts the last arrival"),
    # reported as a plugin that failed to build: TypeError
    (("workload=poisson", "workload.shared_prefix=1"), "workload.shared_prefix=1 is not allowed: a mapping"),
    (("workload=azure_conv", "workload.time_unit=[1,2]"), "workload.time_unit=[1, 2] is not allowed: auto, "),
    (("workload=poisson", "workload.seed=-1"), "workload.seed=-1 is not allowed"),
])  # fmt: skip
def test_workload_values_that_cannot_run_name_their_key(config, overrides, expected):
    assert _workload_refusal(config, *overrides).startswith(expected)


@pytest.mark.parametrize("base_url", ["http://127.0.0.1:99999/v1", "http://127.0.0.1:abc/v1", "http://[::1/v1",
                                      "http://:8000/v1"])  # fmt: skip
def test_a_base_url_no_socket_takes_is_refused_before_sending(base_url):
    # 99999 was a 123-line ExceptionGroup traceback, abc an httpx.InvalidURL one
    with pytest.raises(ConfigError, match="target.base_url=.* is not allowed: an http"):
        TargetConfig.from_mapping({"base_url": base_url})


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions/", "/v1/models"])
def test_an_endpoints_url_as_base_url_is_refused_naming_the_apis_root(path):
    # the client adds the endpoint: every request went to .../completions/completions, a 404
    with pytest.raises(ConfigError, match=r"^target.base_url=.* the API's root, not one endpoint's URL: "
                                          r"http://127.0.0.1:8000/v1 \(target.endpoint picks"):  # fmt: skip
        TargetConfig.from_mapping({"base_url": "http://127.0.0.1:8000" + path})
    TargetConfig.from_mapping({"base_url": "http://127.0.0.1:8000/v1/"})


@pytest.mark.parametrize("section, key", [
    ({"warmup": 2**63}, "target.warmup"),  # sent one after another: it never ended
    ({"model": ""}, "target.model"),  # was the server's first model, silently
    ({"name": "served", "spawn": False}, "target.spawn"),  # spawned one anyway
])  # fmt: skip
def test_target_values_that_mean_nothing_are_refused(section, key):
    with pytest.raises(ConfigError, match=f"^{key}="):
        TargetConfig.from_mapping(section)


def test_an_api_key_a_header_cannot_hold_names_its_variable_not_the_key(monkeypatch):
    monkeypatch.setenv("PB_TEST_KEY", "ключ-секрет")
    with pytest.raises(ConfigError) as e:
        TargetConfig.from_mapping({"api_key_env": "PB_TEST_KEY"})
    assert str(e.value).startswith("target.api_key_env='PB_TEST_KEY' is not allowed: a variable whose key is")
    assert "ключ" not in str(e.value)


def test_target_options_beside_the_in_process_engine_are_refused(config):
    # ran the engine, measured no server, exit 0
    with pytest.raises(ConfigError, match=r"^target.base_url='http://x:8000/v1' is not allowed: no option with"):
        check_top_level(config("+target.base_url=http://x:8000/v1"))
    check_top_level(config("target=engine"))  # the default stays fine
