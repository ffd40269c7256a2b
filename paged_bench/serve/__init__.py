"""The engine behind an OpenAI-compatible HTTP server: ``python -m paged_bench.serve``.

- ``engine_loop``: one background thread steps the engine; requests join and leave between steps;
- ``protocol``: OpenAI request parsing/validation and response shapes;
- ``text``: incremental detokenization, stop strings, the chat template;
- ``api``: the FastAPI app (routes, SSE streaming, errors, back-pressure);
- ``prom``: the Prometheus ``/metrics``;
- ``server``: building it from a config, running it (blocking, or in a thread for notebooks/tests).
"""

from paged_bench.serve.server import ServerHandle, build_app, serve_in_thread, start_in_thread

__all__ = ["ServerHandle", "build_app", "serve_in_thread", "start_in_thread"]
