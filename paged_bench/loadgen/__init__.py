"""The load generator: a workload aimed at any OpenAI-compatible endpoint (``target=openai``).

- ``config``: the ``target`` config section, checked;
- ``client``: one streaming request -> its timestamps, token counts and outcome;
- ``runner``: the workload's requests at their arrival times under a concurrency cap, warm-up
  excluded, failures counted never fatal -> an ``EngineResult`` for the usual summary and files;
- ``spawn``: our own server as a subprocess on a free loopback port, for self-contained runs.
"""

from paged_bench.loadgen.runner import RemoteRun, run_target

__all__ = ["RemoteRun", "run_target"]
