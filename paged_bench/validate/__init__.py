"""``python -m paged_bench.validate``: the simulator checked against published real-GPU runs.

A registry of published cases (``conf/validation/*.yaml``: each file one source, its cases the
runs it reports) is read by ``cases``, each case's workload is written as a trace file by
``workloads``, simulated in-process through the same job code as ``python -m paged_bench``
(``simulate``), and printed and written as a table of published / simulated / ratio
(``document``, ``docs/validation.md``).
"""
