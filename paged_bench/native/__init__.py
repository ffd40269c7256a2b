"""Compiling the engine core (``paged_bench/core/``) with mypyc: which modules (``guard``), the
check that runs their source whenever the compiled copy is stale (``guard``), and the build
``make install`` runs (``python -m paged_bench.native.compile``)."""
