"""vLLM's ShareGPT requests' lengths, replayed from a table of the dataset shipped with paged_bench.

vLLM's ``benchmarks/benchmark_serving.py`` (``sample_sharegpt_requests``, tag v0.6.0) shuffles
ShareGPT_V3_unfiltered_cleaned_split's conversations with its seed, walks them in that order and
keeps the first N whose lengths pass its filter: a prompt or a completion under 4 tokens is
dropped, and so is a prompt over 1,024 tokens or a prompt + completion over 2,048; each request
kept asks for max_tokens = its completion's length (with ``--ignore-eos``, as vLLM's nightly
benchmark runs it, that is its output). ``sharegpt_sample`` does the same over
``paged_bench/data/lengths/sharegpt_v3_llama3.csv``: 992 of the dataset's conversations, counted
in Llama 3 tokens as vLLM counts them (that folder's README says where they come from). The
conversations are not vLLM's own draw (its shuffle runs over the whole dataset), but drawn from
the same population.
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import numpy as np

TABLE = Path(__file__).resolve().parent.parent / "data" / "lengths" / "sharegpt_v3_llama3.csv"
MIN_TOKENS = 4  # vLLM's sampler drops a prompt or a completion shorter than this
MAX_PROMPT = 1024  # ... a prompt longer than this
MAX_TOTAL = 2048  # ... and a prompt + completion longer than this


@functools.lru_cache(maxsize=1)
def sharegpt_table() -> np.ndarray:
    """Every conversation of the table as a (prompt_len, output_len) row, in the file's order,
    before vLLM's filter (read-only: one copy is shared)."""
    with TABLE.open(newline="") as f:
        rows = [(int(row["prompt_len"]), int(row["output_len"])) for row in csv.DictReader(f)]
    table = np.array(rows, dtype=np.int64)
    table.flags.writeable = False
    return table


def vllm_keeps(lengths: np.ndarray) -> np.ndarray:
    """Which (prompt_len, output_len) rows vLLM's ShareGPT sampler keeps."""
    prompts, outputs = lengths[:, 0], lengths[:, 1]
    return (
        (prompts >= MIN_TOKENS) & (outputs >= MIN_TOKENS) & (prompts <= MAX_PROMPT) & (prompts + outputs <= MAX_TOTAL)
    )


def sharegpt_sample(n: int, seed: int | np.random.Generator) -> np.ndarray:
    """``n`` (prompt_len, output_len) rows as vLLM's sampler picks them: the table shuffled with
    ``seed`` (or drawn from a generator), walked in order, the first ``n`` that its filter keeps.
    Past the rows it keeps (899), the walk goes on over the table shuffled again: vLLM's sampler
    never sends a conversation twice, but it draws from ~90,000 and this table holds 992."""
    rng = np.random.default_rng(seed)
    table = sharegpt_table()
    passes = []
    while sum(map(len, passes)) < n:
        shuffled = table[rng.permutation(len(table))]
        passes.append(shuffled[vllm_keeps(shuffled)])
    return np.concatenate(passes)[:n] if passes else table[:0]


def sharegpt_means() -> tuple[float, float]:
    """The mean prompt and output length of the rows vLLM's filter keeps."""
    table = sharegpt_table()
    kept = table[vllm_keeps(table)]
    return float(kept[:, 0].mean()), float(kept[:, 1].mean())
