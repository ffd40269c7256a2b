"""``python -m paged_bench.plan [overrides]``: the cheapest deployment that serves a workload
under an SLO (``paged_bench.capacity``; the engine's step plan is ``core.plan``, not this).

Thin on purpose, as ``__main__`` is: Hydra composes ``conf/plan.yaml`` (the main command's
config plus a ``plan`` section) and ``capacity.app.run`` does the plan.
"""

from __future__ import annotations

from paged_bench.capacity.app import cli

if __name__ == "__main__":
    cli()
