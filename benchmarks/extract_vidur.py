"""Regenerate the measured cost model's shipped extract from Vidur's kernel profiles.

Reads ``/work/shared/validation/vidur-profiles`` (microsoft/vidur ``data/profiling/`` at commit
7d47513; the CPU overheads from its commit 6d98aa8; MIT licence) and writes, under
``paged_bench/costmodel/measured/data/``, only what the cost model reads:

- ``kernels.csv.gz``: per GPU, model, TP degree and token count, the median milliseconds of each
  non-attention operation of one layer (duplicate rows of a shape averaged);
- ``models.csv``: each profiled model's shape;
- ``all_reduce.csv.gz``: the all-reduce's median milliseconds by bytes and ranks, every rank on
  one node (the DGX topologies: NVSwitch boards, what the h100/a100 presets are);
- ``engine_cpu.csv``: vLLM v0's per-step CPU milliseconds by model, batch size and TP.

    .venv/bin/python benchmarks/extract_vidur.py [--src DIR]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import math
from collections import defaultdict
from pathlib import Path
from statistics import mean

OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
       "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")  # fmt: skip
SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")
CPU = ("schedule_median", "prepare_inputs_e2e_median", "sampler_e2e_median", "process_model_outputs_median")
OUT = Path(__file__).resolve().parents[1] / "paged_bench" / "costmodel" / "measured" / "data"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _write(path: Path, header: list[str], rows: list[list[object]]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    data = buf.getvalue().encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data, mtime=0))  # mtime 0: the same bytes every run
    else:
        path.write_bytes(data)


def _ms(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.5g}"  # NaN: not measured


def kernels(src: Path) -> None:
    acc: dict[tuple[str, str, int, int], list[list[float]]] = defaultdict(list)
    shapes: dict[str, list[str]] = {}
    for f in sorted(src.glob("compute/*/*/*/mlp.csv")):
        gpu, model = f.parts[-4], f.parts[-2]
        for r in _rows(f):
            shapes[model] = [r[k] for k in SHAPE]
            key = (gpu, model, int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]))
            # an operation a model has not (phi-2: no second norm) stays empty
            acc[key].append([float(r.get(f"time_stats.{op}.median") or "nan") for op in OPS])
    rows = [[*k, *(_ms(mean(v[i] for v in vs)) for i in range(len(OPS)))] for k, vs in sorted(acc.items())]
    _write(OUT / "kernels.csv.gz", ["gpu", "model", "tp", "num_tokens", *OPS], rows)
    _write(OUT / "models.csv", ["model", *SHAPE], [[m, *s] for m, s in sorted(shapes.items())])


def all_reduce(src: Path) -> None:
    rows = []
    for topo, gpu in (("h100_dgx", "h100"), ("a100_dgx", "a100")):
        by: dict[tuple[int, int], list[float]] = defaultdict(list)
        for r in _rows(src / "network" / topo / "all_reduce.csv"):
            if r["devices_per_node"] != r["num_workers"]:
                continue  # ranks spread over several nodes: not a tensor-parallel group on one board
            by[(int(r["num_workers"]), int(r["size"]))].append(float(r["time_stats.all_reduce.median"]))
        rows += [[gpu, n, size, f"{mean(v):.5g}"] for (n, size), v in sorted(by.items())]
    _write(OUT / "all_reduce.csv.gz", ["gpu", "ranks", "bytes", "ms"], rows)


def engine_cpu(src: Path) -> None:
    rows = [[r["model_name"], r["batch_size"], r["tensor_parallel_degree"], *(f"{float(r[k]):.5g}" for k in CPU)]
            for r in _rows(src / "cpu_overheads" / "a100_vllm_v0.csv")]  # fmt: skip
    _write(OUT / "engine_cpu.csv", ["model", "batch_size", "tp", *(k.removesuffix("_median") for k in CPU)], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path("/work/shared/validation/vidur-profiles"))
    src = ap.parse_args().src
    OUT.mkdir(parents=True, exist_ok=True)
    kernels(src)
    all_reduce(src)
    engine_cpu(src)
    (OUT / "LICENSE-vidur").write_bytes((src / "LICENSE").read_bytes())


if __name__ == "__main__":
    main()
