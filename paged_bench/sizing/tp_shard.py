"""How a model splits over tensor-parallel ranks, Megatron-style, as vLLM splits it.

Column-parallel (each rank holds a slice of the output features): the Q, K and V projections
(whole heads per rank), gate and up, and the LM head (a slice of the vocabulary).
Row-parallel (a slice of the input features, partial sums all-reduced): the attention output
projection and down. So a layer costs two all-reduces of ``tokens x hidden`` activations.
KV heads split with the query heads; when there are more ranks than KV heads, each KV head is
replicated on ``size / num_kv_heads`` ranks (vLLM does the same), so every rank holds one.
Norm weights are replicated. The simulator prices a rank with these figures and the real
torch backend cuts its weights with them (``rank_config``, ``shard_state``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paged_bench.errors import check, check_int
from paged_bench.model.config import DTYPE_BYTES, ModelConfig
from paged_bench.model.weights import layer_names

KEY = "backend.tensor_parallel_size"


@dataclass(frozen=True)
class TPShard:
    """One rank's share of ``model`` split over ``size`` ranks."""

    model: ModelConfig
    size: int = 1

    @property
    def num_heads(self) -> int:
        return self.model.num_heads // self.size

    @property
    def num_kv_heads(self) -> int:
        return max(1, self.model.num_kv_heads // self.size)

    @property
    def intermediate_size(self) -> int:
        return self.model.intermediate_size // self.size

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head per rank (the last rank's slice is padded to this length)."""
        return -(-self.model.vocab_size // self.size)

    def kv_head_start(self, rank: int) -> int:
        """The first KV head rank ``rank`` holds: the one its first query head reads (with
        grouped-query attention a rank's query heads all read its own KV heads)."""
        return rank * self.model.num_kv_heads // self.size

    @property
    def layer_matmul_params(self) -> int:
        m, d = self.model, self.model.head_dim
        qkv = m.hidden_size * (self.num_heads + 2 * self.num_kv_heads) * d
        return qkv + self.num_heads * d * m.hidden_size + 3 * m.hidden_size * self.intermediate_size

    @property
    def matmul_params(self) -> int:
        """What a step streams on one rank: its slice of every layer's matmuls and of the LM head."""
        return self.model.num_layers * self.layer_matmul_params + self.vocab_size * self.model.hidden_size

    @property
    def num_params(self) -> int:
        """Weights one rank holds: its matmul slices, its slice of the embedding (vocab-parallel,
        tied to the LM head or not) and the replicated norms."""
        m = self.model
        embed = self.vocab_size * m.hidden_size
        head = 0 if m.tie_word_embeddings else embed
        norms = (2 * m.num_layers + 1) * m.hidden_size
        return m.num_layers * self.layer_matmul_params + embed + head + norms

    def weight_bytes(self, dtype: str) -> int:
        return self.num_params * DTYPE_BYTES[dtype]

    def kv_bytes_per_token(self, dtype: str) -> int:
        """layers x this rank's KV heads x head_dim x bytes x 2 (K and V)."""
        m = self.model
        return m.num_layers * self.num_kv_heads * m.head_dim * DTYPE_BYTES[dtype] * 2

    def kv_bytes_per_token_all_ranks(self, dtype: str) -> int:
        """Every rank's K/V for a token: past one KV head per rank, heads copied onto several
        ranks count once per copy (what a run reports as ``kv_bytes_per_token``)."""
        return self.kv_bytes_per_token(dtype) * self.size


def split_problem(model: ModelConfig, size: int) -> str | None:
    """Why ``model`` does not split over ``size`` ranks (what would be allowed), or None."""
    kv = model.num_kv_heads
    if model.num_heads % size:
        return f"a divisor of the model's {model.num_heads} attention heads"
    if kv % size and size % kv:
        return f"a divisor or a multiple of the model's {kv} KV heads"
    if model.intermediate_size % size:
        return f"a divisor of the model's intermediate size {model.intermediate_size}"
    return None


def tp_shard(model: ModelConfig, size: int) -> TPShard:
    """``model`` over ``size`` ranks; a one-line error when its heads or MLP do not split evenly."""
    check_int(KEY, size)
    problem = split_problem(model, size)
    check(problem is None, KEY, size, problem or "")
    return TPShard(model, size)


def rank_config(shard: TPShard) -> ModelConfig:
    """The shape one rank's forward runs: its heads, KV heads, MLP width and LM-head rows (the
    embedding table stays whole on every rank: a lookup, not a matmul)."""
    return replace(
        shard.model,
        num_heads=shard.num_heads,
        num_kv_heads=shard.num_kv_heads,
        intermediate_size=shard.intermediate_size,
        vocab_size=shard.vocab_size,
        tie_word_embeddings=False,
    )


def shard_state(state: dict[str, np.ndarray], shard: TPShard, rank: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s weights, in Hugging Face names and layout (``[out, in]``): Q/K/V, gate and
    up cut by output rows (column-parallel), o and down by input columns (row-parallel), the
    LM head by vocabulary rows (the last slice zero-padded to ``shard.vocab_size``)."""
    m = shard.model
    d = m.head_dim
    q = slice(rank * shard.num_heads * d, (rank + 1) * shard.num_heads * d)
    kv0 = shard.kv_head_start(rank)
    kv = slice(kv0 * d, (kv0 + shard.num_kv_heads) * d)
    mlp = slice(rank * shard.intermediate_size, (rank + 1) * shard.intermediate_size)
    out = {name: state[name] for name in ("model.embed_tokens.weight", "model.norm.weight")}
    for i in range(m.num_layers):
        n = layer_names(i)
        out.update({
            n["attn_norm"]: state[n["attn_norm"]], n["mlp_norm"]: state[n["mlp_norm"]],
            n["q"]: state[n["q"]][q], n["k"]: state[n["k"]][kv], n["v"]: state[n["v"]][kv],
            n["o"]: state[n["o"]][:, q],
            n["gate"]: state[n["gate"]][mlp], n["up"]: state[n["up"]][mlp], n["down"]: state[n["down"]][:, mlp],
        })  # fmt: skip
    head = state["model.embed_tokens.weight" if m.tie_word_embeddings else "lm_head.weight"]
    rows = head[rank * shard.vocab_size : (rank + 1) * shard.vocab_size]
    padded = np.zeros((shard.vocab_size, m.hidden_size), rows.dtype)
    padded[: len(rows)] = rows
    out["lm_head.weight"] = padded
    return out
