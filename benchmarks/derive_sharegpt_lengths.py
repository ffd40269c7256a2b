"""Derive paged_bench/data/lengths/sharegpt_v3_llama3.csv: ShareGPT's first two turns, counted in
Llama 3 tokens as vLLM's benchmark counts them.

vLLM's ``benchmarks/benchmark_serving.py`` (``sample_sharegpt_requests``, tag v0.6.0) keeps each
ShareGPT_V3_unfiltered_cleaned_split conversation with at least two turns, takes its first turn
as the prompt and its second as the completion (whoever wrote them: a third of the split's
conversations start with the model's turn) and counts each with ``tokenizer(text).input_ids``:
the Llama 3 BPE plus the ``<|begin_of_text|>`` token Hugging Face's tokenizer adds. This script
does the same for a published random sample of that dataset:

- ``--sample``: the ``sampled_enriched_data`` folder of github.com/Marugannwg/ShareGPT92k_user_linguistic_mining
  (MIT licence; commit 4cae708fb546): 1,000 conversations of ShareGPT_V3_unfiltered_cleaned_split.json
  drawn with random seed 42 (its ``sampling_metadata.json`` lists them), one JSON file each,
  with each turn's text as in the dataset;
- ``--tokenizer``: Llama 3's ``tokenizer.model`` (tiktoken ranks; sha256 82e9d319...5551b55, as in
  Meta-Llama-3-8B; found in github.com/meta-llama/llama3's objects at commit 66cd498f899a).

Needs ``tiktoken`` (not a dependency of paged_bench: ``pip install tiktoken``). Writes one row per
conversation with two turns or more, in the sample's order: its id, who wrote its first turn,
and both lengths; vLLM's length filter is applied when the table is replayed
(``paged_bench.workloads.sharegpt``), not here.

    python benchmarks/derive_sharegpt_lengths.py --sample DIR --tokenizer tokenizer.model \\
        --out paged_bench/data/lengths/sharegpt_v3_llama3.csv
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import json
import sys
from pathlib import Path

LLAMA3_SHA256 = "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55"
# Llama 3's pre-tokenizer split (meta-llama/llama3, llama/tokenizer.py, Tokenizer.pat_str)
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
BOS = 1  # <|begin_of_text|>, which tokenizer(text).input_ids adds to every text


def llama3_counter(path: Path):
    """text -> its length in Llama 3 tokens, as ``tokenizer(text).input_ids`` counts it."""
    try:
        import tiktoken
    except ImportError:
        sys.exit("derive_sharegpt_lengths: needs tiktoken (pip install tiktoken)")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != LLAMA3_SHA256:
        sys.exit(f"derive_sharegpt_lengths: {path} is not Llama 3's tokenizer.model (sha256 {LLAMA3_SHA256})")
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}
    encoding = tiktoken.Encoding(name="llama3", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens={})
    return lambda text: len(encoding.encode(text, disallowed_special=())) + BOS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=Path, required=True, help="the sampled_enriched_data folder")
    parser.add_argument("--tokenizer", type=Path, required=True, help="Llama 3's tokenizer.model")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    count = llama3_counter(args.tokenizer)
    names = json.loads((args.sample / "sampling_metadata.json").read_text())["sampled_files"]
    rows = []
    for name in names:
        conversation = json.loads((args.sample / name).read_text(encoding="utf-8"))
        turns = conversation["conversations"]
        if len(turns) >= 2:  # as vLLM's sampler: fewer turns, no completion
            rows.append((conversation["id"], turns[0]["from"], count(turns[0]["value"]), count(turns[1]["value"])))
    with args.out.open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["id", "prompt_from", "prompt_len", "output_len"])
        out.writerows(rows)
    print(f"{len(rows)} of {len(names)} conversations -> {args.out}")


if __name__ == "__main__":
    main()
