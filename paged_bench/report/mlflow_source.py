"""Runs of an MLflow experiment, fetched for a report: the latest sweep (a parent run and its
children), or every top-level run when the experiment has no sweep. Each run's files
(``config.yaml``, ``summary.json``, ``run_info.json``, ``requests.csv``, ``steps.csv``) are
downloaded into a folder per run, so a report reads them exactly as it reads runs on disk."""

from __future__ import annotations

from pathlib import Path

from paged_bench.errors import PagedBenchError
from paged_bench.report.load import Run, load_run
from paged_bench.tracking import store
from paged_bench.tracking.runs import KIND_TAG, PARENT_TAG

FILES = ("config.yaml", "summary.json", "run_info.json", "requests.csv", "steps.csv")


def fetch_experiment(name: str, dest: Path, tracking_uri: str | None = None) -> list[Run]:
    uri = store.resolve_uri(tracking_uri)
    store.check_store_to_read(uri)
    client = store.client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise PagedBenchError(f"no MLflow experiment {name!r} in {uri}; experiments: {', '.join(names) or '(none)'}")
    ids = [exp.experiment_id]
    parents = client.search_runs(
        ids, f"tags.`{KIND_TAG}` = 'sweep'", order_by=["attributes.start_time DESC"], max_results=1
    )
    if parents:
        runs = client.search_runs(ids, f"tags.`{PARENT_TAG}` = '{parents[0].info.run_id}'", max_results=10000)
    else:
        runs = [r for r in client.search_runs(ids, max_results=10000) if PARENT_TAG not in r.data.tags]
    if not runs:
        raise PagedBenchError(f"MLflow experiment {name!r} has no runs")
    out = []
    for i, run in enumerate(sorted(runs, key=lambda r: (int(r.data.tags.get("job_num") or 0), r.info.start_time))):
        folder = dest / str(int(run.data.tags.get("job_num") or i))
        folder.mkdir(parents=True, exist_ok=True)
        present = {a.path for a in client.list_artifacts(run.info.run_id)}
        for file in FILES:
            if file in present:
                client.download_artifacts(run.info.run_id, file, str(folder))
        run_record = load_run(folder)
        run_record.source = f"runs:/{run.info.run_id}"
        out.append(run_record)
    return out
