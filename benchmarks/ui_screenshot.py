"""The MLflow UI's view of an experiment's latest sweep, as a PNG (docs/framework.md's screenshot):
serves the store as ``make ui`` does, on a free loopback port, opens the URL the sweep printed
(its jobs' key figures and swept settings as columns: paged_bench/tracking/ui.py) in headless
Chromium and saves what it renders.

    make results && make ui-screenshot
    .venv/bin/python benchmarks/ui_screenshot.py --experiment seed_batching --out docs/results/mlflow_sweep_view.png
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import paged_bench.tracking  # noqa: F401  (telemetry off before mlflow is imported)
from paged_bench.loadgen.spawn import free_port
from paged_bench.tracking import browser, store, ui
from paged_bench.tracking.runs import KIND_TAG

# the page's own extras, closed as a person would before looking: the assistant's panel, the
# banner that says a saved view is open
_TIDY_JS = """(() => {
  for (const label of ['Hide banner', 'Close']) {
    const b = [...document.querySelectorAll('button')].find(e => e.getAttribute('aria-label') === label);
    if (b) b.click();
  }
  return true;
})()"""


def _serve(db: Path, port: int, log: Path) -> subprocess.Popen:
    """``mlflow ui`` over the store, as ``make ui`` starts it (one web worker, no job workers)."""
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    args = [sys.executable, "-m", "mlflow", "ui", "--workers", "1", "--backend-store-uri", f"sqlite:///{db}",
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    server = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"), start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit(f"error: mlflow ui did not start: {log.read_text()[-1500:]}")


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--experiment", default="seed_batching")
    args.add_argument("--store", type=Path, default=Path(store.RUNS_DIR) / store.DB_FILE)
    args.add_argument("--out", type=Path, default=Path("docs/results/mlflow_sweep_view.png"))
    args.add_argument("--charts", type=Path, help="also the view's Charts tab, as this PNG")
    args.add_argument("--width", type=int, default=2050)
    args.add_argument("--height", type=int, default=760)
    opts = args.parse_args()
    db = opts.store.resolve()
    client = store.client(f"sqlite:///{db}")
    exp = client.get_experiment_by_name(opts.experiment)
    sweeps = client.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = 'sweep'", order_by=["attributes.start_time DESC"],
                                max_results=1) if exp else []  # fmt: skip
    if not sweeps:
        raise SystemExit(f"error: no sweep of experiment {opts.experiment!r} in {db}: run make results first")
    parent = sweeps[0]
    # saved again, as this checkout's tracking/ui.py makes it (and made for a sweep logged before sweeps saved one)
    ui.publish_sweep_view(client, parent.info.run_id, parent.info.run_name)
    port = free_port()
    server = _serve(db, port, opts.out.with_suffix(".log"))
    try:
        url = ui.view_url(f"http://127.0.0.1:{port}", exp.experiment_id, parent.info.run_id)
        with browser.Chromium(opts.width, opts.height) as page:
            for mode, out in (("TABLE", opts.out), ("CHART", opts.charts)):
                if out is None:
                    continue
                page.goto(f"{url}&compareRunsMode={mode}")
                ready = ".ag-center-cols-container [role=row][row-id]" if mode == "TABLE" else ".js-plotly-plot"
                page.wait_for(f"document.querySelectorAll('{ready}').length > 0", timeout=60)
                page.evaluate(_TIDY_JS)
                time.sleep(1.5)  # the layout settles once the panel and banner are gone
                page.screenshot(out)
                print(f"{out}: {url}&compareRunsMode={mode}")
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        opts.out.with_suffix(".log").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
