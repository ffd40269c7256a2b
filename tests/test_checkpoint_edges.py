"""Checkpoint folders that are wrong in the ways an audit found: loaded as another model
(a stray weight file beside the shard index, a Mistral sliding window past its reach, an
lm_head that tied embeddings would drop, end ids past the first), or a traceback instead of
one line naming the file. Tiny Llama checkpoints written by transformers into a temporary
folder."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from paged_bench.core.request import FinishReason, Request
from paged_bench.errors import ConfigError
from paged_bench.model.config import read_hf_config
from paged_bench.model.weights import load_state
from paged_bench.run.bench import build, build_engine
from paged_bench.run.compose import compose_config

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SHAPE = {"vocab_size": 258, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
         "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}  # fmt: skip


def checkpoint(path, seed=0, **changes):
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**SHAPE, **changes})).save_pretrained(
        path, max_shard_size="150KB"
    )
    return path


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return checkpoint(tmp_path_factory.mktemp("ckpt") / "sharded")


def _edit_config(path, **changes):
    config = path / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **changes}))


def test_only_the_shards_the_index_names_are_read(sharded, tmp_path):
    """transformers reads what model.safetensors.index.json names; a stray file sorted after the
    shards (an older export) overwrote their weights here, and the model served was another."""
    assert (sharded / "model.safetensors.index.json").is_file()
    want = load_state(read_hf_config(sharded), sharded)
    stray = checkpoint(tmp_path / "other", seed=1)
    folder = shutil.copytree(sharded, tmp_path / "with_stray")
    for i, shard in enumerate(sorted(stray.glob("*.safetensors"))):
        shutil.copy(shard, folder / f"zz-old-{i}.safetensors")
    got = load_state(read_hf_config(folder), folder)
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    first = sorted(folder.glob("model-*.safetensors"))[0]
    first.unlink()  # a shard the index names is missing: transformers raises, we ran
    with pytest.raises(ConfigError, match=f"every shard its index names \\({first.name} is missing\\)"):
        load_state(read_hf_config(folder), folder)


def test_a_mistral_sliding_window_holds_max_model_len_to_it(tmp_path):
    # past its window the model attends to the last N tokens only; up to it, full attention is
    # the same model (Mistral-7B-v0.1's 4,096 was refused at every max_model_len)
    path = checkpoint(tmp_path / "mistral")
    _edit_config(path, model_type="mistral", sliding_window=8)
    assert read_hf_config(path).sliding_window == 8
    with pytest.raises(ConfigError, match="max_model_len=9 is not allowed: at most 8, the model's sliding_window"):
        build(compose_config("backend=numpy", f"backend.model_path={path}", "max_model_len=9"))
    build(compose_config("backend=numpy", f"backend.model_path={path}", "max_model_len=8", "num_blocks=4")).backend.close()
    # auto (the server's default, as vLLM's): the window, shorter than the positions
    engine, _ = build_engine(compose_config("backend=numpy", f"backend.model_path={path}", "max_model_len=auto",
                                            "allocator=contiguous", "num_blocks=4"))  # fmt: skip
    assert engine.scheduler.max_model_len == 8 and engine.allocator.blocks_per_slab == 1  # the slab follows
    engine.backend.close()
    _edit_config(path, sliding_window="8")
    with pytest.raises(ConfigError, match="sliding_window='8' is not allowed: null or a number of tokens"):
        read_hf_config(path)
    _edit_config(path, sliding_window=None)
    assert read_hf_config(path).sliding_window is None


def test_tied_embeddings_beside_a_different_lm_head_are_refused(tmp_path):
    """tie_word_embeddings true dropped the checkpoint's own lm_head; transformers keeps it."""
    path = checkpoint(tmp_path / "untied")
    _edit_config(path, tie_word_embeddings=True)
    with pytest.raises(ConfigError, match="tie_word_embeddings true with no lm_head.weight, or one equal"):
        load_state(read_hf_config(path), path)


def _corrupt(path, how):
    weights = sorted(path.glob("*.safetensors"))[0]
    data = weights.read_bytes()
    if how == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        weights.write_bytes(b"")
    elif how == "garbage":
        weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00\xb0\xb1\xb2\xb3\xb4\xb5\xb6\xb7")
    elif how == "config_a_list":
        (path / "config.json").write_text("[1, 2]")
    elif how == "no_heads":
        _edit_config(path, num_attention_heads=0, head_dim=None)  # hidden // heads: a ZeroDivisionError
    elif how == "odd_head_dim":
        _edit_config(path, head_dim=15, num_attention_heads=4)


@pytest.mark.parametrize(("how", "says"), [
    ("truncated", "a whole safetensors file (ValueError"),
    ("empty", "a whole safetensors file (ValueError: cannot mmap an empty file)"),
    ("garbage", "a whole safetensors file ("),
    ("config_a_list", "a config.json holding a JSON object"),
    ("no_heads", "a Llama config.json"),
    ("odd_head_dim", "head_dim=15 is not allowed: an even number"),
])  # fmt: skip
def test_a_broken_checkpoint_is_one_config_error(sharded, tmp_path, how, says):
    path = shutil.copytree(sharded, tmp_path / how)
    _corrupt(path, how)
    with pytest.raises(ConfigError, match=says.replace("(", "\\(").replace(")", "\\)")):
        load_state(read_hf_config(path), path)


def test_torch_threads_past_any_core_count_are_refused():
    """30,000 made libgomp fail mid-run and 100,000 crashed the process."""
    from paged_bench.run.bench import build

    with pytest.raises(ConfigError, match="backend.threads=100000 is not allowed: an integer from 1 to 1,024"):
        build(compose_config("backend=torch", "backend.model=tiny", "backend.threads=100000"))


def test_max_model_len_past_the_models_positions_is_refused(sharded):
    """Positions past max_position_embeddings turn rotary angles the model never saw: its output
    is another model's. It ran; vLLM refuses it (its derived max_model_len is the same field)."""
    from paged_bench.run.bench import build

    ckpt = ("backend=numpy", f"backend.model_path={sharded}")
    with pytest.raises(ConfigError, match="max_model_len=1024 is not allowed: at most 512, the model's"):
        build(compose_config(*ckpt, "max_model_len=1024", "workload.num_requests=2"))
    fits = build(compose_config(*ckpt, "max_model_len=512", "workload.num_requests=2"))
    assert fits.engine.scheduler.max_model_len == 512
    with pytest.raises(ConfigError, match="max_model_len=512 is not allowed: at most 256"):
        build(compose_config("backend=numpy", "backend.model={preset: tiny, max_position_embeddings: 256}"))


@pytest.mark.parametrize("where", ["config.json", "generation_config.json"])
@pytest.mark.parametrize("backend", ["numpy", "hf_generate"])
def test_every_end_id_a_checkpoint_names_stops_a_request_as_generate_does(tmp_path, where, backend):
    # Llama 3.1 lists three end ids in config.json; Llama 3 Instruct adds <|eot_id|> in
    # generation_config.json: only the first of either stopped a request, which ran on past it
    path = checkpoint(tmp_path / "ckpt")
    model = transformers.LlamaForCausalLM.from_pretrained(path)
    prompt = [5, 6, 7, 8]

    def generate(end_ids):
        out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=end_ids,
                             pad_token_id=0)  # fmt: skip
        return out[0, len(prompt) :].tolist()

    free = generate(None)
    k = next(i for i in range(1, 12) if free[i] not in free[:i])  # a token first sampled k tokens in
    assert 2 not in free[: k + 1]
    if where == "config.json":
        _edit_config(path, eos_token_id=[2, free[k]])
    else:
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, free[k]]}))
    assert generate([2, free[k]]) == free[: k + 1]  # transformers stops at it
    bench = build(compose_config(f"backend={backend}", f"backend.model_path={path}", "clock=virtual",
                                 "max_model_len=64", *(["scheduler=static"] if backend == "hf_generate" else [])))  # fmt: skip
    req = Request(0, 0.0, prompt, 12, ignore_eos=False)
    try:
        bench.engine.run([req])
    finally:
        bench.backend.close()
    assert list(req.output_token_ids) == free[: k + 1] and req.finish_reason is FinishReason.STOP
