"""MLflow tracking of runs and sweeps. The engine never imports this package.

``runs.log_job`` logs one finished job (params = the flattened config, metrics = exactly the
``summary.json`` keys, step-wise series, tags, artifacts) as its own run or as a child of a
sweep's parent run (``runs.start_sweep`` / ``runs.finish_sweep``, linked across processes by
run id). ``store`` resolves where: ``tracking.uri``, else ``$MLFLOW_TRACKING_URI``, else an
embedded SQLite store at ``./runs/mlflow.db`` (absolute). A store that fails warns once and
turns tracking off for the process: the run's files are never lost to tracking.
``ui`` saves a sweep's view in the MLflow UI as the sweep closes (its jobs' key figures and
swept settings as columns; the link the sweep prints); ``browser`` drives a headless Chromium
to see that page as a person does (the UI test, docs' screenshot).

Importing this package is cheap; ``mlflow`` (1-2 s) is imported only when something is logged.
"""

import os

# MLflow's client would otherwise report usage to an outside host: nothing of ours talks to
# anything but the store it is given. Set before mlflow is ever imported.
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
