"""The model's parts on their own: config parsing, checkpoint reading (bf16, tied, sharded),
the step batch's slot arithmetic, sampling, and the KV-byte estimate."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from paged_bench.backends.request_state import RequestStates
from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import NewRequestData, StepPlan
from paged_bench.core.request import Request
from paged_bench.errors import ConfigError
from paged_bench.model.batch import build_batch
from paged_bench.model.config import PRESETS, ModelConfig, read_hf_config, resolve_model
from paged_bench.model.ops_numpy import NumpyOps
from paged_bench.model.ops_torch import TorchOps
from paged_bench.model.sampling import request_rng, sample
from paged_bench.model.weights import load_state, random_state, shapes
from paged_bench.sizing import kv_bytes

HF_BASE = {
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 300, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6, "eos_token_id": [2, 5], "bos_token_id": 1,
}  # fmt: skip


@pytest.mark.parametrize(
    "rope",
    [{"rope_theta": 500000.0}, {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}],
    ids=["transformers-4", "transformers-5"],
)
def test_hf_config_both_spellings(rope):
    cfg = ModelConfig.from_hf({**HF_BASE, **rope})
    assert (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta) == (2, 2, 16, 500000.0)
    assert cfg.eos_token_id == 2  # the first of several end tokens


@pytest.mark.parametrize(
    "bad",
    [{"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, {"attention_bias": True}, {"model_type": "gpt2"}],
)
def test_hf_config_rejects_what_the_forward_does_not_do(bad):
    with pytest.raises(ConfigError):
        ModelConfig.from_hf({**HF_BASE, **bad})


def test_resolve_model_presets_mappings_and_errors(tmp_path):
    assert resolve_model("tiny") is PRESETS["tiny"]
    custom = resolve_model({"preset": "tiny", "num_layers": 3})
    assert custom.num_layers == 3 and custom.hidden_size == PRESETS["tiny"].hidden_size
    for bad in ("nope", {"num_layerz": 3}, {"num_heads": 6, "num_kv_heads": 4}, {"num_layers": 0}):
        with pytest.raises(ConfigError):
            resolve_model(bad)
    with pytest.raises(ConfigError, match="model_path"):
        read_hf_config(tmp_path)  # no config.json: no hub fallback


def test_random_weights_follow_the_seed():
    cfg = PRESETS["tiny"]
    a, b, c = random_state(cfg, 1), random_state(cfg, 1), random_state(cfg, 2)
    assert set(a) == set(shapes(cfg))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["lm_head.weight"], c["lm_head.weight"])


def _write_safetensors(path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    """A minimal safetensors writer (the format: 8-byte header size, JSON header, raw data)."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        if dtype == "BF16":  # round-to-nearest-even of the float32's top half
            bits = a.astype(np.float32).view(np.uint32)
            raw = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
        else:
            raw = a.astype({"F32": np.float32, "F16": np.float16}[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


@pytest.mark.parametrize("dtype,tol", [("F32", 0), ("F16", 1e-3), ("BF16", 8e-3)])
def test_checkpoint_reading_dtypes_shards_and_tied_embeddings(tmp_path, dtype, tol):
    cfg = ModelConfig.from_hf({**HF_BASE, "tie_word_embeddings": True})
    state = random_state(cfg, 0)
    names = sorted(state)
    # two shards, as large checkpoints come
    _write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {n: state[n] for n in names[:5]}, dtype)
    _write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {n: state[n] for n in names[5:]}, dtype)
    loaded = load_state(cfg, tmp_path)
    assert "lm_head.weight" not in loaded and set(loaded) == set(state)
    for n in names:
        assert loaded[n].dtype == np.float32
        np.testing.assert_allclose(loaded[n], state[n], rtol=tol, atol=tol)


def test_checkpoint_with_a_missing_tensor_is_one_clear_error(tmp_path):
    cfg = PRESETS["tiny"]
    state = random_state(cfg, 0)
    state.pop("model.norm.weight")
    _write_safetensors(tmp_path / "model.safetensors", state, "F32")
    with pytest.raises(ConfigError, match="model.norm.weight"):
        load_state(cfg, tmp_path)


def test_step_batch_maps_positions_through_block_tables():
    alloc = PagedAllocator(num_blocks=32, block_size=4, prefix_caching=False)
    a = Request("a", 0.0, list(range(10)), 4)
    b = Request("b", 0.0, list(range(3)), 4)
    alloc.allocate_slots(b, 3)  # b's block is allocated first: a's blocks are not 0, 1, 2
    alloc.allocate_slots(a, 10)
    b.num_computed_tokens = 2  # b decodes its last prompt token; a prefills all of it
    plan = StepPlan.starting(
        (NewRequestData.from_request(r, alloc.block_table(r)), n) for r, n in ((a, 10), (b, 1))
    )
    batch = build_batch(plan, RequestStates().apply(plan), alloc.layout.block_size)
    table_a, table_b = alloc.block_table(a), alloc.block_table(b)
    assert batch.input_ids.tolist() == list(range(10)) + [2]
    assert batch.positions.tolist() == list(range(10)) + [2]
    assert batch.slots.tolist() == [table_a[p // 4] * 4 + p % 4 for p in range(10)] + [table_b[0] * 4 + 2]
    assert batch.sample_rows.tolist() == [9, 10]
    decode, prefill = sorted(batch.groups, key=lambda g: g.rows.shape[1])  # padded separately
    assert prefill.rows.shape == (1, 10) and decode.rows.shape == (1, 1)
    assert decode.rows.tolist() == [[10]] and decode.q_pos.tolist() == [[2]]
    assert decode.ctx_slots.tolist() == [[table_b[0] * 4 + j for j in range(3)]]
    allowed = prefill.allowed()[0]
    assert allowed[3].tolist() == [True] * 4 + [False] * 6  # causal


def test_each_prefill_attends_alone_not_padded_to_the_longest():
    """A 2-token prompt beside a 12-token one: both backends attend it over its own 2 queries
    and 2 keys (padded, it took 12 x 12: the long prompt's shape, for every prompt of the step)."""
    alloc = PagedAllocator(num_blocks=32, block_size=4, prefix_caching=False)
    reqs = [Request("long", 0.0, list(range(12)), 4), Request("short", 0.0, [5, 6], 4), Request("d", 0.0, [1, 2], 4)]
    for r in reqs:
        alloc.allocate_slots(r, len(r.token_ids))
    reqs[2].num_computed_tokens = 1  # d decodes its last prompt token
    plan = StepPlan.starting((NewRequestData.from_request(r, alloc.block_table(r)), n)
                             for r, n in zip(reqs, (12, 2, 1)))  # fmt: skip
    batch = build_batch(plan, RequestStates().apply(plan), alloc.layout.block_size)
    prefills = next(g for g in batch.groups if g.rows.shape[1] > 1)
    assert prefills.rows.shape == (2, 12)  # packed padded; each() takes them apart
    assert [(one.rows.tolist(), one.ctx_slots.shape) for one in prefills.each()] == [
        ([list(range(12))], (1, 12)), ([[12, 13]], (1, 2))]
    cfg = PRESETS["tiny"]
    on_numpy = NumpyOps(cfg).prepare(batch).groups
    on_torch = TorchOps(cfg, torch.device("cpu"), torch.float32).prepare(batch).groups
    assert [g.src.ctx_slots.shape for g in on_numpy] == [(1, 2), (1, 12), (1, 2)]  # the decode, then each prefill
    assert [tuple(g.ctx_slots.shape) for g in on_torch] == [(1, 2), (1, 12), (1, 2)]


def test_sampling_greedy_top_p_and_seeds():
    logits = np.array([1.0, 3.0, 2.0, -1.0], np.float32)
    rng = np.random.default_rng(0)
    assert sample(logits, 0.0, 1.0, rng) == 1
    assert {sample(logits, 1.0, 0.01, rng) for _ in range(50)} == {1}  # nucleus of one token
    draws = np.bincount([sample(logits, 1.0, 1.0, rng) for _ in range(4000)], minlength=4) / 4000
    p = np.exp(logits - logits.max())
    np.testing.assert_allclose(draws, p / p.sum(), atol=0.03)
    req = Request(0, 0.0, [1, 2, 3], 4, temperature=1.0, sampling_seed=7)
    params = NewRequestData.from_request(req, ()).sampling
    first = [sample(logits, 1.0, 1.0, request_rng(params, req.num_tokens, rng)) for _ in range(3)]
    assert len(set(first)) == 1  # same seed, same position: the same token, whatever else ran
    assert request_rng(NewRequestData.from_request(Request(0, 0.0, [1], 4), ()).sampling, 1, rng) is rng


def test_kv_byte_estimate_matches_the_formula(capsys):
    est = kv_bytes.estimate(PRESETS["llama-3-8b"], 2048)
    assert est.bytes_per_token == 32 * 8 * 128 * 2 * 2
    assert est.bytes_per_sequence == 32 * 8 * 128 * 2 * 2 * 2048 == 256 * 2**20
    assert kv_bytes.main(["--model", "small", "--seq-len", "512", "--batch", "16", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "4 layers x 2 KV heads x 32 head_dim x 2 bytes" in out and "x 16 sequences = 8.0 MiB" in out
    assert kv_bytes.main(["--model", "nope"]) == 2
    assert "--model='nope'" in capsys.readouterr().err
    for flag, value in [("--block-size", "0"), ("--tp", "0"), ("--gpu-memory-utilization", "7"), ("--max-num-seqs", "-1")]:
        assert kv_bytes.main(["--hardware", "h100", flag, value]) == 2  # a traceback, or another flag's name, before
        assert capsys.readouterr().err.startswith(f"error: {flag}=")


def test_rotary_table_grows_past_its_initial_length():
    from paged_bench.model.batch import StepBatch
    from paged_bench.model.forward import rope_table
    from paged_bench.model.ops_numpy import NumpyOps

    cfg = PRESETS["tiny"]
    ops = NumpyOps(cfg)
    pos = np.array([5000])
    st = ops.prepare(StepBatch(np.zeros(1, np.int64), pos, pos, [], np.zeros(1, np.int64)))
    cos, sin = rope_table(cfg, 5001)
    np.testing.assert_array_equal(st.cos[0, 0], cos[5000])
    np.testing.assert_array_equal(st.sin[0, 0], sin[5000])
