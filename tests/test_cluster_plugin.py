"""A router plugin is as easy to write as a scheduler plugin: the example router of
docs/cluster.md, installed as a package with its entry point and config option, is listed
and routes a cluster run through the command line."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from tests.plugin_support import fake_distribution
from tests.tracking_support import run_cli

DOC = Path(__file__).resolve().parents[1] / "docs" / "cluster.md"


def _block(language: str, containing: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)
    (block,) = [b for b in blocks if containing in b]
    return block


def test_the_docs_example_router_installs_and_routes_a_cluster(tmp_path):
    site = fake_distribution(
        tmp_path / "site",
        "my-routers",
        {"paged_bench.routers": {"join_idle": "my_routers_join_idle:JoinIdleRouter"},
         "paged_bench.conf": {"my_routers": "my_routers_conf"}},  # fmt: skip
        {"my_routers_join_idle": _block("python", "class JoinIdleRouter")},
    )
    conf = site / "my_routers_conf" / "router"
    conf.mkdir(parents=True)
    (conf.parent / "__init__.py").write_text("")
    (conf / "join_idle.yaml").write_text(_block("yaml", "name: join_idle"))

    listing = run_cli(tmp_path, "--plugins", PYTHONPATH=str(site))
    line = next(l for l in listing.stdout.splitlines() if l.strip().startswith("join_idle "))
    assert "my_routers_join_idle:JoinIdleRouter" in line and line.rstrip().endswith("from my-routers")

    proc = run_cli(tmp_path, "cluster.replicas=3", "router=join_idle", "workload.rate=5", "tracking.enabled=false",
                   PYTHONPATH=str(site))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "router=join_idle" in proc.stdout
    (run_dir,) = [p.parent for p in tmp_path.glob("runs/20*/*/requests.csv")]
    with (run_dir / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    # at 5 req/s most requests find an idle replica: the lowest-numbered one
    replicas = [r["replica"] for r in rows]
    assert replicas.count("0") > replicas.count("1") > 0 and len(rows) == 48
