"""The server on a real model (backend=numpy): sampling knobs reach the model, and a local
Hugging Face checkpoint brings its own tokenizer and chat template. Loopback only; the
checkpoint is written by the test (no downloads)."""

from __future__ import annotations

import httpx
import openai
import pytest

from paged_bench.serve import serve_in_thread
from paged_bench.serve.text import simple_chat_template

TINY = ("backend=numpy", "backend.model=tiny", "server.port=0", "server.log_level=warning")


@pytest.fixture(scope="module")
def tiny():
    handle = serve_in_thread(*TINY)
    yield handle
    handle.stop()


def test_numpy_model_streams_exact_lengths(tiny):
    client = openai.OpenAI(base_url=tiny.url + "/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(model="paged-bench-numpy", prompt="The cat", max_tokens=12, stream=True,
                                       extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
    chunks = list(stream)
    assert len(chunks) == 12 + 1 and chunks[-1].usage.completion_tokens == 12


def test_seed_and_temperature_reach_the_sampler(tiny):
    def text(**kw) -> str:
        body = {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True, **kw}
        return httpx.post(tiny.url + "/v1/completions", json=body).json()["choices"][0]["text"]

    assert text(temperature=1.0, seed=7) == text(temperature=1.0, seed=7)
    sampled = {text(temperature=1.0, seed=s) for s in range(4)}
    assert len(sampled) > 1  # different seeds, different samples (a random model over 258 tokens)
    assert text(temperature=0.0) == text(temperature=0.0, seed=123)  # greedy ignores the seed
    # vLLM's SamplingParams reads seed -1 as no seed; here it was a seed, the same text every time
    assert len({text(temperature=1.0, seed=-1) for _ in range(4)}) > 1
    assert text(temperature=1.0, seed=-2) == text(temperature=1.0, seed=-2)


TEMPLATE = "{% for m in messages %}<s> [{{ m['role'] }}] {{ m['content'] }} {% endfor %}[assistant]"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama checkpoint with a word-level tokenizer that ships a chat template."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    words = ["<unk>", "<s>", "</s>", "[user]", "[system]", "[assistant]", "hello", "world", "the", "cat", "sat"]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    hf.chat_template = TEMPLATE
    path = tmp_path_factory.mktemp("ckpt") / "tiny-llama"
    hf.save_pretrained(path)
    config = transformers.LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      bos_token_id=1, eos_token_id=2)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path, hf


@pytest.mark.slow
def test_checkpoint_tokenizer_and_chat_template(checkpoint):
    path, hf = checkpoint
    # no max_model_len: the model's 512 positions, as vLLM (the server's 2048 was refused for it)
    handle = serve_in_thread("backend=numpy", f"backend.model_path={path}", "server.port=0", "server.log_level=warning")
    try:
        client = openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny-llama"]  # the folder's name
        assert client.models.list().data[0].model_extra["max_model_len"] == 512
        messages = [{"role": "system", "content": "hello world"}, {"role": "user", "content": "the cat sat"}]
        r = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=5,
                                           extra_body={"ignore_eos": True})
        expected = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        expected = expected["input_ids"] if hasattr(expected, "keys") else expected
        assert r.usage.prompt_tokens == len(expected)
        assert r.usage.prompt_tokens != len(hf.encode(simple_chat_template(messages)))  # not our fallback
        assert r.usage.completion_tokens == 5
        c = client.completions.create(model="tiny-llama", prompt="the cat sat", max_tokens=3)
        assert c.usage.prompt_tokens == len(hf.encode("the cat sat"))
        # out-of-vocabulary token ids are refused
        with pytest.raises(openai.BadRequestError, match="out of range"):
            client.completions.create(model="tiny-llama", prompt=[3, 99], max_tokens=2)
    finally:
        handle.stop()


def test_bpe_on_a_checkpoint_points_at_its_own_tokenizer(checkpoint):
    # it suggested +backend.model.vocab_size, which a checkpoint's config.json overrides
    from paged_bench.errors import ConfigError
    from paged_bench.run.compose import compose_config
    from paged_bench.serve.server import build_app

    path, _ = checkpoint
    with pytest.raises(ConfigError, match=r"vocabulary of 11 \(server.tokenizer=auto, the checkpoint's own\)$"):
        build_app(compose_config("backend=numpy", f"backend.model_path={path}", "max_model_len=512",
                                 "server.tokenizer=bpe", config_name="serve"))  # fmt: skip
