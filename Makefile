# make run: set up .venv if needed, then run the default benchmark.
# make test: same set-up, then the whole test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test bench clean

install: $(STAMP)

# torch first, pinned: it then satisfies the package's capped range without pip looking
# for a newer (multi-GB CUDA) build
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e ".[torch,dev]"
	touch $(STAMP)

run: install
	$(PY) -m paged_bench $(ARGS)

test: install
	$(PY) -m pytest $(ARGS)

bench: install
	$(PY) -m pytest tests/benchmarks --benchmark-enable --benchmark-only $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks .hypothesis
