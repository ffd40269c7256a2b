"""Tables and plots from finished runs: ``python -m paged_bench.report PATH | --experiment NAME``.

``load`` reads run and sweep directories (or runs fetched from MLflow by ``mlflow_source``) into
records, ``tables`` builds the comparison tables (markdown + CSV), ``plots`` the PNGs, and
``build`` puts them together; the sweep callback and per-run tracking reuse the same code.
pandas and matplotlib are imported only here, never on the engine's path.
"""
