# make run: set up .venv if needed, then run the default benchmark.
# make test: same set-up, then the whole test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install browser run serve test bench ui ui-screenshot results validate clean

# then the engine core is compiled with mypyc (paged_bench/native/guard.py: about 2x the step loop's
# speed), again whenever its source changed; without a C compiler it stays interpreted
install: $(STAMP) browser
	PAGED_BENCH_INTERPRETED=1 $(PY) -m paged_bench.native.compile

# a headless Chromium for the test that reads the MLflow UI as a person sees it and for make
# ui-screenshot (paged_bench/tracking/browser.py): Debian's, installed where it is missing and
# this is root; elsewhere a note, and that test is skipped
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; }; \
	else echo "note: no chromium (apt-get install chromium as root): the MLflow UI's browser test is skipped"; fi

# torch first, pinned: it then satisfies the package's capped range without pip looking
# for a newer (multi-GB CUDA) build
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e ".[torch,dev,slurm,ray]"
	touch $(STAMP)

run: install
	$(PY) -m paged_bench $(ARGS)

# make serve: the engine behind an OpenAI-compatible server on 127.0.0.1:8000 (docs/serving.md)
serve: install
	$(PY) -m paged_bench.serve $(ARGS)

# the suite runs in two worker processes (pytest-xdist), a test file to a worker so that a
# file's shared set-up (an MLflow server, a sweep, an experiment's runs) is made once. The
# command line runs in-process where the process boundary is not what a test is about
# (tests/tracking_support.py: call_cli); signals, exit statuses, launchers and workers keep
# their processes. Compiled modules are cached (PYTHONDONTWRITEBYTECODE emptied): the workers
# and the ~200 processes the tests start do not each compile what changed since the last run;
# the pytest plugins no test uses are not loaded. TEST_WORKERS=0 runs the suite in one process
# (for -s, --pdb). Three workers on two cores: many tests wait on the servers, browsers and
# processes they start, so a third keeps both cores busy (whole suite on this idle 2-core VM:
# 5:29 with 2 workers, 4:54 with 3, same tree, 2026-12-07)
TEST_WORKERS ?= 3
test: install
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile \
		-p no:schemathesis -p no:hydra_pytest -p no:anyio $(ARGS)

# the micro-benchmarks, then the whole-run figure (issue 11: steps/s of a 20k-request sim run,
# with the compiled core and interpreted)
# and where its time goes, phase by phase and part by part of the step loop
bench: install
	$(PY) -m pytest tests/benchmarks --benchmark-enable --benchmark-only $(ARGS)
	$(PY) benchmarks/sim_speed.py --cases seed,poisson20k --interpreted
	$(PY) benchmarks/sim_breakdown.py

# make ui: the MLflow UI on 127.0.0.1:$(UI_PORT) over the embedded store (runs/mlflow.db); telemetry
# off, no job-execution workers, one web worker: 2 processes, ~0.5 GB (mlflow ui's defaults add
# job-execution workers and a web worker per core)
UI_PORT ?= 5000
ui: install
	$(PY) -c "import pathlib, paged_bench.tracking.store as s; s.prepare_sqlite(pathlib.Path('runs/mlflow.db').resolve())"
	MLFLOW_DISABLE_TELEMETRY=true MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(PY) -m mlflow ui --workers 1 \
		--backend-store-uri sqlite:///$(CURDIR)/runs/mlflow.db --host 127.0.0.1 --port $(UI_PORT)

# make results: rerun the seeds' two experiments on the simulator and write their report into
# the README's results section (and docs/results/: tables and plots)
results: install
	$(PY) -m paged_bench -m +experiment=seed_batching backend=sim
	$(PY) -m paged_bench -m +experiment=seed_paging backend=sim
	$(PY) -m paged_bench.report --experiment seed_batching --experiment seed_paging --out docs/results --into README.md

# make validate: every published real-GPU case of conf/validation/ simulated, the table printed
# (published / simulated / ratio) and written into docs/validation.md (about 30 CPU-seconds)
validate: install
	$(PY) -m paged_bench.validate --write docs/validation.md $(ARGS)

# make ui-screenshot: after make results, the MLflow UI's view of its seed_batching sweep (the URL
# the sweep printed) as docs/results/mlflow_sweep_view.png and its Charts tab as
# mlflow_sweep_charts.png, rendered by headless Chromium
ui-screenshot: install
	$(PY) benchmarks/ui_screenshot.py --experiment seed_batching --out docs/results/mlflow_sweep_view.png \
		--charts docs/results/mlflow_sweep_charts.png

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks .hypothesis build/native
	find paged_bench -name '*.so' -delete
