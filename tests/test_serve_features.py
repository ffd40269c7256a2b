"""The API features real tools use (issue 9, item 4 and 8), through the official ``openai``
client: ``logprobs``/``top_logprobs``, ``echo`` with prompt log-probabilities (how
lm-eval-harness scores log-likelihoods), ``n > 1`` and prompt lists (the choices share the
prompt's KV blocks), and the default subword tokenizer and context. Loopback only."""

from __future__ import annotations

import math
import time

import httpx
import openai
import pytest

from paged_bench.serve import serve_in_thread
from tests.test_serve_api import FAST, MetricSampler, all_free, metric, wait_for

QUIET = ("server.port=0", "server.log_level=warning")
NUMPY = "paged-bench-numpy"


@pytest.fixture(scope="module")
def tiny():
    handle = serve_in_thread(*QUIET, "backend=numpy", "backend.model=tiny", "max_batch=16", "max_model_len=2048")
    yield handle
    handle.stop()


@pytest.fixture
def client(tiny):
    return openai.OpenAI(base_url=tiny.url + "/v1", api_key="x", max_retries=0)


def test_completion_logprobs_with_two_top_entries(client):
    r = client.completions.create(model=NUMPY, prompt="The cat", max_tokens=6, logprobs=2, temperature=0,
                                  extra_body={"ignore_eos": True})  # fmt: skip
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert all(len(top) >= 1 and len(top) <= 2 for top in lp.top_logprobs)  # greedy: the chosen is the best of 2
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and math.isclose(chosen, max(top.values()), abs_tol=1e-9)  # greedy: the best one
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]


def test_completion_top_logprobs_hold_the_sampled_token_too(client):
    # OpenAI's legacy logprobs: "up to logprobs+1 elements", the sampled token always among
    # them (vLLM: num_output_top_logprobs + 1); they held the top k alone
    r = client.completions.create(model=NUMPY, prompt="The cat", max_tokens=24, logprobs=1, temperature=1.5, seed=3,
                                  extra_body={"ignore_eos": True})  # fmt: skip
    lp = r.choices[0].logprobs
    for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert top[token] == chosen and 1 <= len(top) <= 2
        assert next(iter(top)) == token  # first, as vLLM's
    assert any(len(top) == 2 for top in lp.top_logprobs)  # sampled off the top one somewhere
    zero = client.completions.create(model=NUMPY, prompt="The cat", max_tokens=3, logprobs=0, temperature=0)
    lp = zero.choices[0].logprobs
    assert [list(top) for top in lp.top_logprobs] == [[t] for t in lp.tokens]


def test_chat_logprobs_and_top_logprobs(client):
    r = client.chat.completions.create(model=NUMPY, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       logprobs=True, top_logprobs=2, temperature=0)  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, abs_tol=1e-9)
    with pytest.raises(openai.BadRequestError, match="`logprobs` must be set to true"):
        client.chat.completions.create(model=NUMPY, messages=[{"role": "user", "content": "hi"}], top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="at most 20"):
        client.completions.create(model=NUMPY, prompt="x", logprobs=21)


def test_streamed_logprobs_one_entry_per_chunk(client):
    chunks = list(client.completions.create(model=NUMPY, prompt="ab", max_tokens=5, logprobs=1, stream=True,
                                            extra_body={"ignore_eos": True}))  # fmt: skip
    assert len(chunks) == 5
    assert all(len(c.choices[0].logprobs.token_logprobs) == 1 for c in chunks)


def test_echo_scores_the_prompt_like_generation_does(client):
    """lm-eval-harness's log-likelihood request: echo=True, max_tokens=0, logprobs=1. The
    prompt's token logprobs must be the model's: scoring a prompt that ends with greedily
    generated tokens gives back those tokens' generation logprobs."""
    gen = client.completions.create(model=NUMPY, prompt="Once upon", max_tokens=4, logprobs=0, temperature=0,
                                    extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})  # fmt: skip
    generated = gen.choices[0].logprobs
    prompt_ids = list(b"Once upon")
    gen_ids = [int(t.removeprefix("token_id:")) for t in generated.tokens]
    scored = client.completions.create(model=NUMPY, prompt=prompt_ids + gen_ids, max_tokens=0, echo=True,
                                       logprobs=1)  # fmt: skip
    choice = scored.choices[0]
    assert choice.text == "Once upon" + gen.choices[0].text  # the prompt itself, nothing generated
    assert scored.usage.completion_tokens == 0
    lp = choice.logprobs
    assert len(lp.token_logprobs) == len(prompt_ids) + 4 and lp.token_logprobs[0] is None
    for echoed, generated_lp in zip(lp.token_logprobs[-4:], generated.token_logprobs):
        assert math.isclose(echoed, generated_lp, rel_tol=1e-4, abs_tol=1e-4)
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])


def test_echo_without_logprobs_prepends_the_prompt(client):
    r = client.completions.create(model=NUMPY, prompt="abc", max_tokens=3, echo=True, extra_body={"ignore_eos": True})
    assert r.choices[0].text.startswith("abc") and r.usage.completion_tokens == 3


def test_n_and_prompt_lists_fan_out(client, tiny):
    r = client.completions.create(model=NUMPY, prompt="The same prompt", max_tokens=8, n=3, temperature=1.0,
                                  seed=11, extra_body={"ignore_eos": True})  # fmt: skip
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.text for c in r.choices}) > 1  # seed + j per sample: different samples
    assert r.usage.completion_tokens == 24 and r.usage.prompt_tokens == len("The same prompt")
    again = client.completions.create(model=NUMPY, prompt="The same prompt", max_tokens=8, n=3, temperature=1.0,
                                      seed=11, extra_body={"ignore_eos": True})  # fmt: skip
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    stream = client.completions.create(model=NUMPY, prompt=["one", "two"], max_tokens=4, n=2, stream=True,
                                       extra_body={"ignore_eos": True})  # fmt: skip
    per_choice: dict[int, int] = {}
    for chunk in stream:
        per_choice[chunk.choices[0].index] = per_choice.get(chunk.choices[0].index, 0) + 1
    assert per_choice == {0: 4, 1: 4, 2: 4, 3: 4}
    chat = client.chat.completions.create(model=NUMPY, messages=[{"role": "user", "content": "x"}], n=2,
                                          max_tokens=3)  # fmt: skip
    assert len(chat.choices) == 2
    wait_for(lambda: all_free(tiny))


@pytest.mark.parametrize("n", [2, 4])
def test_n_choices_share_the_prompts_kv_blocks(n):
    """n choices over a 64-token prompt (4 full blocks of 16), admitted in one step: the extra
    choices get the prompt's full blocks from the prefix cache (blocks are cacheable at
    allocation) instead of computing them: vLLM v1's parallel sampling, PagedAttention's sharing."""
    handle = serve_in_thread(*QUIET, *FAST, "backend.step_overhead_ms=5.0", "server.tokenizer=byte",
                             "block_size=16", "max_model_len=512")  # fmt: skip
    try:
        client = openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0)
        hits0 = metric(handle.url, "paged_bench_prefix_cache_hits_total")
        with MetricSampler(handle.url, "paged_bench_kv_blocks_shared", 0.005) as shared:
            r = client.completions.create(model="paged-bench-sim", prompt=list(range(1, 65)), max_tokens=40, n=n,
                                          extra_body={"ignore_eos": True})  # fmt: skip
        assert len(r.choices) == n
        hits = metric(handle.url, "paged_bench_prefix_cache_hits_total") - hits0
        assert hits >= (n - 1) * 48  # each extra choice reuses at least the first 3 full blocks
        assert max(shared.values) >= 3
        wait_for(lambda: all_free(handle))
    finally:
        handle.stop()


# -- the default tokenizer and context ----------------------------------------------------


def test_default_server_speaks_subword_bpe_with_2k_context():
    handle = serve_in_thread(*QUIET, *FAST)  # the defaults: backend=sim, server.tokenizer=auto
    try:
        client = openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0)
        model = client.models.list().data[0]
        assert model.model_extra["max_model_len"] == 2048
        text = "The quick brown fox jumps over the lazy dog, and the server answers every request."
        r = client.completions.create(model=model.id, prompt=text, max_tokens=1)
        assert r.usage.prompt_tokens < len(text.encode()) / 3  # subwords, not bytes
        long_prompt = "word " * 1500  # ~1500 tokens: refused at 512 bytes-as-tokens, served now
        assert client.completions.create(model=model.id, prompt=long_prompt, max_tokens=1).usage.prompt_tokens > 512
    finally:
        handle.stop()


def test_bpe_is_deterministic_and_cached(tmp_path):
    from paged_bench.model.tokenizers import bpe_tokenizer

    a, b = bpe_tokenizer(tmp_path / "a"), bpe_tokenizer(tmp_path / "b")
    assert a.tok.to_str() == b.tok.to_str()  # trained twice from scratch: the same tokenizer
    cached = list((tmp_path / "a").glob("bpe-*.json"))
    assert len(cached) == 1
    t0 = time.perf_counter()
    c = bpe_tokenizer(tmp_path / "a")
    assert time.perf_counter() - t0 < 1.0 and c.encode("héllo wörld") == a.encode("héllo wörld")
    assert c.decode(c.encode("héllo wörld ✓")) == "héllo wörld ✓"


def test_bpe_that_does_not_fit_the_model_is_a_config_error():
    from paged_bench.errors import ConfigError
    from paged_bench.run.compose import compose_config
    from paged_bench.serve.server import build_app

    with pytest.raises(ConfigError, match="fit the model's vocabulary of 258") as e:
        build_app(compose_config("backend=numpy", "backend.model=tiny", "server.tokenizer=bpe", config_name="serve"))
    # the override it suggests composes (without its +, Hydra refused it: the model is a preset's name)
    from paged_bench.model.config import resolve_model

    suggested = str(e.value).split("(set ")[1].split(",")[0]
    cfg = compose_config("backend=numpy", suggested, "server.tokenizer=bpe", config_name="serve")
    assert resolve_model(cfg["backend"]["model"], None).vocab_size == 16386


def test_openapi_declares_bodies_and_responses(tiny):
    spec = httpx.get(tiny.url + "/openapi.json").json()
    for path, schema in (("/v1/completions", "CompletionRequest"), ("/v1/chat/completions", "ChatRequest")):
        post = spec["paths"][path]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(schema)
        assert {"200", "400", "401", "404", "413", "429"} <= set(post["responses"])
    props = spec["components"]["schemas"]["CompletionRequest"]["properties"]
    assert {"prompt", "max_tokens", "logprobs", "echo", "n", "seed", "stop"} <= set(props)


def test_prompt_scoring_is_complete_even_when_the_prompt_is_cached(client):
    """A prompt already in the prefix cache must still be scored at every position: a
    request wanting prompt log-probabilities skips the cache (as vLLM v1's does)."""
    prompt = [(7 * i) % 250 + 1 for i in range(40)]  # 2 full blocks of 16: cacheable
    first, second = (client.completions.create(model=NUMPY, prompt=prompt, max_tokens=0, echo=True, logprobs=0)
                     for _ in range(2))  # fmt: skip
    a, b = first.choices[0].logprobs.token_logprobs, second.choices[0].logprobs.token_logprobs
    assert len(a) == len(b) == 40 and a[0] is None and None not in a[1:]
    assert a == b


def test_completions_default_to_16_tokens_as_openai_and_vllm(client):
    # the default was the room max_model_len leaves: 2,000-odd tokens for a client that relies on 16
    body = {"model": NUMPY, "prompt": "Hi", "extra_body": {"ignore_eos": True}}
    assert client.completions.create(**body).usage.completion_tokens == 16
    room = client.completions.create(**body, max_tokens=None, temperature=0)  # an explicit null: the room
    assert room.usage.completion_tokens + room.usage.prompt_tokens == 2048 == room.usage.total_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_stop_token_ids_end_a_choice_counted_with_their_text_left_out(client, stream):
    # vLLM's check_stop: the sampled id ends the choice "stop"; its detokenizer leaves the
    # stop token's text out (include_stop_str_in_output: false), usage counts it
    body = {"model": NUMPY, "prompt": "The cat", "temperature": 0, "extra_body": {"ignore_eos": True}}
    as_ids = {**body, "extra_body": {"ignore_eos": True, "return_tokens_as_token_ids": True}}
    ids = client.completions.create(**as_ids, max_tokens=12, logprobs=0).choices[0].logprobs.tokens
    ids = [int(t.removeprefix("token_id:")) for t in ids]
    k = next(i for i in range(1, 12) if ids[i] not in ids[:i])
    stopped = {**body, "max_tokens": 12, "extra_body": {"ignore_eos": True, "stop_token_ids": [ids[k]]}}
    if stream:
        chunks = list(client.completions.create(**stopped, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        completion_tokens = chunks[-1].usage.completion_tokens
    else:
        r = client.completions.create(**stopped)
        text, reason, completion_tokens = r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens
    assert (reason, completion_tokens) == ("stop", k + 1)
    assert text == client.completions.create(**body, max_tokens=k).choices[0].text  # greedy: the same k before it
    with pytest.raises(openai.BadRequestError, match="stop token id 999 is out of range: 0 to 257"):
        client.completions.create(**{**body, "max_tokens": 2, "extra_body": {"stop_token_ids": [999]}})
