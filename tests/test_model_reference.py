"""Our numpy and torch backends against transformers' LlamaForCausalLM: the same checkpoint,
the same greedy tokens, through the real engine (scheduler + allocator + backend) under every
KV layout and scheduling path, and the same logits to float32 tolerance."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from paged_bench.core.kv.paged import PagedAllocator
from paged_bench.core.plan import NewRequestData, StepPlan
from paged_bench.core.request import Request
from paged_bench.model import ops_numpy
from paged_bench.run.bench import build
from paged_bench.run.registry import create
from tests.conftest import compose_config

VOCAB, NEW_TOKENS, STEP_S = 320, 20, 0.001


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random Llama saved like any HF checkpoint, and its greedy continuations."""
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
        initializer_range=0.2, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    rng = np.random.default_rng(0)
    prefix = rng.integers(3, VOCAB, 37).tolist()  # shared by most prompts: prefix-cache hits
    prompts = [prefix + rng.integers(3, VOCAB, n).tolist() for n in (5, 12, 20, 3)]
    prompts += [rng.integers(3, VOCAB, n).tolist() for n in (9, 30)]
    refs = []
    with torch.no_grad():
        for p in prompts:
            # eos_token_id=None: neither stop at EOS nor ban it (min_new_tokens would), as
            # ignore_eos does in our engine
            out = model.generate(
                torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
            )
            seq = out[0].tolist()
            # a near-tie would make the comparison depend on rounding, not on correctness
            top2 = torch.topk(model(out).logits[0, len(p) - 1 : -1], 2).values
            assert (top2[:, 0] - top2[:, 1]).min() > 1e-3
            refs.append(seq[len(p) :])
    return str(path), prompts, refs, model


def _requests(prompts):
    # staggered arrivals (virtual time, one millisecond a step): later requests find the
    # shared prefix already computed and cached, and join a running batch
    return [Request(i, i * 4 * STEP_S, list(p), NEW_TOKENS) for i, p in enumerate(prompts)]


# the same checks on a GPU where there is one (float32, so greedy tokens compare exactly)
BACKENDS = ["numpy", "torch"] + (["torch-cuda"] if torch.cuda.is_available() else [])
DEVICE_OVERRIDES = {
    "numpy": ["backend=numpy", "backend.threads=1"],
    "torch": ["backend=torch", "backend.threads=1", "backend.device=cpu"],
    "torch-cuda": ["backend=torch", "backend.device=cuda", "backend.dtype=float32"],
}


def _run(backend, path, prompts, *overrides):
    cfg = compose_config(
        *DEVICE_OVERRIDES[backend], f"backend.model_path={path}", "clock=virtual", "max_model_len=96",
        "max_batch=8", "tracking.enabled=false", *overrides,
    )  # fmt: skip
    bench = build(cfg)
    real = bench.backend.execute
    seen = {"reprefilled_outputs": 0, "swapped_in": 0}

    def timed(plan):  # real tokens, a fixed virtual step time: the schedule is deterministic
        for new in plan.new_reqs:  # recomputing a preempted sequence's own tokens
            if len(new.token_ids) > new.num_prompt_tokens and new.num_computed_tokens < len(new.token_ids) - 1:
                seen["reprefilled_outputs"] += 1
        seen["swapped_in"] += len(plan.swap_in)
        out = real(plan)
        out.duration = STEP_S
        return out

    bench.backend.execute = timed
    reqs = _requests(prompts)
    try:
        result = bench.engine.run(reqs)
    finally:
        bench.backend.close()
    assert result.error is None and result.leaks == []
    return result, reqs, seen


CASES = {
    "paged-bs1": (["block_size=1"], "hits"),
    "paged-bs16": (["block_size=16"], "hits"),
    "paged-bs16-no-prefix-cache": (["block_size=16", "allocator.prefix_caching=false"], "no-hits"),
    "contiguous": (["allocator=contiguous"], "no-hits"),
    "chunked-prefill": (["block_size=4", "max_num_batched_tokens=8"], "chunked"),
    "preempt-recompute": (["scheduler=preemptive", "block_size=4", "num_blocks=30"], "recompute"),
    "preempt-swap": (["scheduler=preemptive", "scheduler.mode=swap", "block_size=4", "num_blocks=30"], "swap"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_match_transformers_generate(checkpoint, backend, case):
    path, prompts, refs, _ = checkpoint
    overrides, expect = CASES[case]
    result, reqs, seen = _run(backend, path, prompts, *overrides)
    for req, ref in zip(reqs, refs):
        assert req.output_token_ids == ref, f"request {req.request_id} diverged from transformers"
    # the path under test was really taken
    if expect == "hits":
        assert result.prefix_hit_tokens >= 32
    if expect == "no-hits":
        assert result.prefix_hit_tokens == 0
    if expect == "chunked":
        assert max(s.prefill_tokens for s in result.steps) <= 8 < max(len(p) for p in prompts)
    if expect in ("recompute", "swap"):
        assert result.num_preemptions > 0
    if expect == "recompute":  # a victim mid-generation re-prefilled its prompt and its outputs
        assert seen["reprefilled_outputs"] > 0 and result.swapped_blocks == 0
    if expect == "swap":  # a victim's blocks went to swap space and came back
        assert seen["swapped_in"] > 0 and seen["reprefilled_outputs"] == 0


def _logits(be, alloc, reqs, news):
    """The backend's logits for one step that (re)starts ``reqs``, computing ``news`` tokens each."""
    plan = StepPlan.starting((NewRequestData.from_request(r, alloc.block_table(r)), n) for r, n in zip(reqs, news))
    return be.ops.to_numpy(be.logits(plan, be.states.apply(plan)))


def _two_steps(be, prompts):
    """Logits of a mixed prefill step and of a decode + chunk step, and the sequences after."""
    alloc = PagedAllocator(num_blocks=64, block_size=4, prefix_caching=False)
    be.bind(alloc)
    reqs = [Request(i, 0.0, list(p), 4) for i, p in enumerate(prompts[:3])]
    # step 1: two prompts whole and the third's first chunk
    news = [len(reqs[0].token_ids), len(reqs[1].token_ids), 10]
    for r, n in zip(reqs, news):
        alloc.allocate_slots(r, n)
    first = _logits(be, alloc, reqs, news)
    for r, n in zip(reqs, news):
        r.num_computed_tokens += n
    reqs[0].token_ids.append(7)
    reqs[1].token_ids.append(9)
    # step 2: two decodes and the rest of the third prompt, in one batch
    news = [1, 1, len(reqs[2].token_ids) - 10]
    for r, n in zip(reqs, news):
        alloc.allocate_slots(r, n)
    second = _logits(be, alloc, reqs, news)
    return first, second, [list(r.token_ids) for r in reqs]


def _hf_last_logits(model, seqs):
    with torch.no_grad():
        return np.stack([model(torch.tensor([s])).logits[0, -1].numpy() for s in seqs])


def test_numpy_and_torch_logits_agree_with_transformers(checkpoint):
    path, prompts, _, model = checkpoint
    np_first, np_second, seqs = _two_steps(create("backend", "numpy", model_path=path), prompts)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        be = create("backend", "torch", model_path=path, device=device, dtype="float32")
        t_first, t_second, _ = _two_steps(be, prompts)
        np.testing.assert_allclose(np_first, t_first, rtol=1e-4, atol=1e-4, err_msg=device)
        np.testing.assert_allclose(np_second, t_second, rtol=1e-4, atol=1e-4, err_msg=device)
    # and both are transformers' logits at the same positions (the third prompt's first
    # chunk samples nothing, so its row is not compared)
    np.testing.assert_allclose(np_second, _hf_last_logits(model, seqs), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np_first[:2], _hf_last_logits(model, [s[:-1] for s in seqs[:2]]), rtol=1e-4, atol=1e-4)


def test_numpy_prefill_attention_in_slices_gives_the_whole_chunks_logits(checkpoint, monkeypatch):
    """The numpy backend bounds a prefill's scores by slicing its query rows (each slice against
    the keys up to its own last position): at one row a slice, the logits are the unsliced ones."""
    path, prompts, _, model = checkpoint
    whole_first, whole_second, _ = _two_steps(create("backend", "numpy", model_path=path), prompts)
    monkeypatch.setattr(ops_numpy, "SCORE_ELEMENTS", 1)
    first, second, _ = _two_steps(create("backend", "numpy", model_path=path), prompts)
    np.testing.assert_allclose(first, whole_first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(second, whole_second, rtol=1e-5, atol=1e-5)
