#!/usr/bin/env bash
# benchmarks/vllm060/make_env.sh DIR [PYTHON]: a virtualenv holding vLLM 0.6.0's OpenAI server code, for
# benchmarks/vllm060_server_intake.py and vllm060_engine_burst.py (no GPU needed: the engine, or its
# executor, is a stand-in). vllm==0.6.0 from PyPI
# (170 MB) without its dependencies (they pin the CUDA build of torch 2.4), the packages its server
# imports pinned in requirements.txt beside this file, and for the rest (torch, numpy's neighbours ...)
# the project's .venv, read after these (a .pth file). Its compiled CUDA kernels are removed: they
# cannot load without a CUDA torch, and the server never calls them (vllm/_core_ext.py then defines
# its ScalarType in Python). PyPI's pyairports 0.0.1 is empty: a stand-in module gives outlines the
# list it imports.
#
# With PYTHON (another CPython than the project's: 3.10, which the vllm/vllm-openai:v0.6.0 image ran),
# an environment for the API server process alone: everything it imports pinned in
# requirements-server.txt, and torch_stub/ for torch (no torch wheel for that interpreter here, and
# the API server computes nothing with it); its engine process then runs from a DIR made without
# PYTHON (vllm060_server_intake.py --server-env).
set -euo pipefail
dir=${1:?usage: benchmarks/vllm060/make_env.sh DIR [PYTHON]}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
"${2:-python3}" -m venv "$dir"
site=$("$dir/bin/python" -c "import site; print(site.getsitepackages()[0])")
if [ -z "${2:-}" ]; then
    # the project's .venv after this one's packages, and the project itself (real_engine.py prices steps with it)
    { "$root/.venv/bin/python" -c "import site; print(site.getsitepackages()[0])"; echo "$root"; } > "$site/zz_paged_bench_venv.pth"
    requirements=requirements.txt
else
    echo "$here/torch_stub" > "$site/zz_torch_stub.pth"
    requirements=requirements-server.txt
fi
"$dir/bin/pip" install -q --disable-pip-version-check --no-deps vllm==0.6.0 -r "$here/$requirements"
rm -f "$site"/vllm/*.so
mkdir -p "$site/pyairports"
: > "$site/pyairports/__init__.py"
echo "AIRPORT_LIST = []  # PyPI's pyairports 0.0.1 has no module; outlines only builds an enum of it" > "$site/pyairports/airports.py"
"$dir/bin/python" -c "import sys, vllm.entrypoints.openai.api_server, vllm; print('vLLM', vllm.__version__, 'server code importable on Python', sys.version.split()[0])" 2>&1 | tail -1
