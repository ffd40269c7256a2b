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
the same population. ``sharegpt_with_means`` draws a published run's requests instead: with the
mean lengths its source gives (``python -m paged_bench.validate``).
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import numpy as np

from paged_bench.errors import ConfigError

TABLE = Path(__file__).resolve().parent.parent / "data" / "lengths" / "sharegpt_v3_llama3.csv"
MIN_TOKENS = 4  # vLLM's sampler drops a prompt or a completion shorter than this
MAX_PROMPT = 1024  # ... a prompt longer than this
MAX_TOTAL = 2048  # ... and a prompt + completion longer than this
MEANS_WITHIN = 0.025  # how close a draw's mean lengths come to the published ones (sharegpt_with_means)
_CANDIDATES = 64  # draws tried at once (one numpy call)
_TRIES = 64_000  # draws tried in all before the means are refused: ~1 s


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


def sharegpt_kept() -> np.ndarray:
    """The table's rows that vLLM's filter keeps, in the file's order (a new array each call)."""
    table = sharegpt_table()
    return table[vllm_keeps(table)]


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
    kept = sharegpt_kept()
    return float(kept[:, 0].mean()), float(kept[:, 1].mean())


def sharegpt_with_means(n: int, means: tuple[float, float], seed: int, within: float = MEANS_WITHIN) -> np.ndarray:
    """``n`` (prompt_len, output_len) rows drawn independently from the rows vLLM's filter keeps,
    redrawn until the draw's mean prompt and mean output are each within ``within`` (relative) of
    ``means``: a published run's requests when the source gives its totals but not which
    conversations it sent.

    Why independent draws: vLLM's sampler walks ~90,000 shuffled conversations and keeps the first
    N that pass, in effect N independent draws of the population; this table is a 992-conversation
    sample of it, so drawing its rows with replacement (the bootstrap) stands for that. Drawing 500
    of its 899 kept rows without replacement (``sharegpt_sample``) would put most of the table in
    every draw, its longest completions in over half of them. Candidates are drawn
    ``_CANDIDATES`` at a time from ``seed`` and the first that matches is returned, so the same
    seed gives the same rows."""
    if n <= 0:
        return sharegpt_table()[:0]
    kept = sharegpt_kept()
    target = np.asarray(means, dtype=float)
    rng = np.random.default_rng(seed)
    for _ in range(_TRIES // _CANDIDATES):
        picks = kept[rng.integers(0, len(kept), (_CANDIDATES, n))]  # (candidate, request, field)
        close = np.all(np.abs(picks.mean(axis=1) - target) <= within * target, axis=1)
        if close.any():
            return picks[int(np.argmax(close))]
    have = kept.mean(axis=0)
    raise ConfigError(
        "ShareGPT means", f"{means[0]:g} in / {means[1]:g} out",
        f"no draw of {n} requests came within {within:.1%} of them in {_TRIES:,} tries; the table's kept rows "
        f"average {have[0]:.0f} / {have[1]:.0f} (fewer requests, or means nearer those, can match)",
    )  # fmt: skip
