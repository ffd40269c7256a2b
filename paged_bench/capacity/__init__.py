"""Capacity planning: the cheapest deployment that serves a workload under its SLO.

``python -m paged_bench.plan`` (``capacity.app``) enumerates deployments from a search space
(``space``), prunes those that cannot work or cannot win (``prune``), finds each one's
capacity by a search over the arrival-rate scale (``search``) whose simulations (``trial``)
run through Hydra's launcher (``launch``), and reports the ranking, the Pareto frontier and
the winner's command line (``output``). Not ``core.plan``, the engine's step plan.
"""
