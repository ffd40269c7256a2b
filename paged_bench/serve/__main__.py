"""``python -m paged_bench.serve [overrides]``: the engine behind an OpenAI-compatible server.

A Hydra app like the benchmark command, with the same groups and knobs (config ``serve``:
the main config plus a ``server`` section), e.g.::

    python -m paged_bench.serve backend=numpy max_batch=32 server.port=8001

A bad value is one line on stderr and a non-zero exit; Ctrl-C shuts the server down cleanly.
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from paged_bench.cli.hydra_errors import hydra_error
from paged_bench.errors import PagedBenchError


@hydra.main(version_base="1.3", config_path="pkg://paged_bench.conf", config_name="serve")
def main(cfg: DictConfig) -> None:
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
        from paged_bench.serve.server import (  # fastapi's import: after Hydra (--help)
            ServerConfig,
            build_app,
            listen_socket,
            listen_url,
            serve,
        )

        sock = listen_socket(ServerConfig.from_mapping(config.get("server")))  # before the engine, as vLLM
        app, server_cfg = build_app(config)
    except PagedBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except OmegaConfBaseException as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    ctx = app.state.server.ctx
    print(f"serving {ctx.model_name!r} on {listen_url(sock)}/v1 "
          f"(scheduler={config['scheduler']['name']}, allocator={config['allocator']['name']}, "
          f"backend={config['backend']['name']}, max_model_len={ctx.max_model_len}); Ctrl-C stops it", flush=True)
    serve(app, server_cfg, sock)
    print("server stopped", flush=True)


def cli() -> None:
    """Hydra's composition errors become one line too, as in ``python -m paged_bench``."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return main()
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except (HydraException, ValueError, TypeError) as e:  # Hydra refuses some command lines with the latter two
        line = hydra_error(e)
        if line is None:  # not Hydra's: a bug, with its traceback
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
