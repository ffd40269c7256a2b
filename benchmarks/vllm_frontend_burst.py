"""How long a burst of requests takes to get through an HTTP front end built like vLLM 0.6.0's,
measured here (issue 35: the H100 cases' TTFT with every request at once).

benchmarks/vllm060_server_intake.py measures the same on vLLM 0.6.0's own code (this file's client).
Here, vLLM 0.6.0's serving path rebuilt from the same parts (not vLLM's code): the benchmark client is
vllm-project/vllm ``benchmarks/backend_request_func.py`` ``async_request_openai_completions``
(tag v0.6.0): one ``aiohttp.ClientSession`` per request, a streamed POST to /v1/completions,
``st`` taken just before the POST. The server is a uvicorn + FastAPI app in its own process, as
``vllm/entrypoints/openai/api_server.py`` is: the body validated into a pydantic model of the
completion request's fields, the prompt tokenised there (0.6.0's API server "handles request
validation, tokenization, and JSON formatting", the v0.6.0 blog post), then handed to the engine
from a task created when the streamed response starts (``merge_async_iterators`` in
``vllm/utils.py`` starts one task per prompt) -- here the "engine" only stamps the hand-off time.
Nothing is answered until every request has been handed off (the real engine is busy prefilling
by then), so the hand-offs are timed as the burst's start sees them.

The tokenizer: byte-level BPE trained here on local English text (no model hub downloads) with
Llama-3's pre-tokenising split pattern and vocabulary size asked for (128,256; the local corpus
may give fewer merges: the size reached is printed), called as vLLM 0.6.0 calls its tokenizer:
through transformers' ``PreTrainedTokenizerFast`` (``tokenizer(prompt, add_special_tokens=True)
.input_ids``, ``_normalize_prompt_text_to_input`` in vllm/entrypoints/openai/serving_engine.py).
Prompts of 462 tokens (the post's sonnet sets) or 202 (its ShareGPT mean). ``--tokenizer`` takes
Llama 3's own ``tokenizer.model`` instead (tiktoken ranks, as benchmarks/derive_sharegpt_lengths.py
takes it; needs ``pip install tiktoken``), converted by transformers' ``TikTokenConverter``.

    .venv/bin/python benchmarks/vllm_frontend_burst.py [--requests 500] [--prompt-tokens 462] [--tokenizer FILE]

Prints, for the burst: the client's CPU seconds, the server's CPU seconds (and per request), the
tokeniser's time per prompt, the server's CPU before the first hand-off (per request: what
``frontend.intake_ms`` prices), and each request's wait from its ``st`` to its hand-off (mean,
first, last). Wall times on this shared 2-core machine are stretched by other work: read the CPU
times beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
VOCAB = 128_256
HERE = Path(__file__).resolve().parent


def corpus_lines() -> list[str]:
    """Local English text: the Python docs' topics and this repository's docs, as lines."""
    from pydoc_data import topics

    text = "\n".join(topics.topics.values())
    for md in sorted((HERE.parent / "docs").glob("*.md")):
        text += "\n" + md.read_text()
    return [line + "\n" for line in text.splitlines() if len(line.split()) >= 4]


def train_tokenizer(lines: list[str]):  # -> tokenizers.Tokenizer
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(lines, trainer)
    return tok


def llama3_tokenizer(path: str):  # -> tokenizers.Tokenizer
    """Llama 3's BPE from its tokenizer.model, as a Hugging Face fast tokenizer."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    return TikTokenConverter(vocab_file=path, pattern=LLAMA3_SPLIT,
                             additional_special_tokens=["<|begin_of_text|>"]).converted()  # fmt: skip


def prompts(tok, lines: list[str], n: int, tokens: int) -> list[str]:
    """``n`` prompts of about ``tokens`` tokens, lines drawn as the sonnet sampler draws poem lines."""
    import random

    rng = random.Random(0)
    out = []
    for _ in range(n):
        text = "Pick as many lines as you can from these poem lines:\n"
        while len(tok.encode(text).ids) < tokens:
            text += rng.choice(lines)
        out.append(text)
    return out


# ---- the server (its own process) ----


class CompletionRequest(BaseModel):  # the fields vLLM 0.6.0's protocol.py names, defaults alike
    model: str
    prompt: str | list[int] | list[str]
    best_of: int | None = None
    echo: bool | None = False
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    max_tokens: int | None = 16
    n: int = 1
    presence_penalty: float | None = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: dict | None = None
    suffix: str | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    user: str | None = None
    use_beam_search: bool = False
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    add_special_tokens: bool = True


def serve(port: int, n: int, tok_path: str) -> None:
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(tok_path))

    app = FastAPI()
    handed: dict[str, float] = {}
    all_in = asyncio.Event()
    cpu0 = [0.0]

    async def engine_add(req_id: str, token_ids: list[int]) -> None:
        if not handed:
            cpu0[0] = time.process_time()
        handed[req_id] = time.perf_counter()
        if len(handed) == n:
            all_in.set()

    @app.post("/v1/completions")
    async def create_completion(request: CompletionRequest):
        ids = tok(request.prompt, add_special_tokens=True).input_ids  # the API server tokenises (0.6.0)
        params = {
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
            "ignore_eos": request.ignore_eos,
        }

        async def stream():
            # merge_async_iterators: a task per prompt, started when the body is first iterated
            await asyncio.create_task(engine_add(request.user, ids))
            await all_in.wait()
            chunk = {
                "id": request.user,
                "choices": [{"index": 0, "text": " x", "logprobs": None, "finish_reason": None}],
                **params,
            }
            yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.get("/handed")
    async def handed_times():
        return JSONResponse({"handed": handed, "cpu_s": time.process_time(), "cpu_first": cpu0[0]})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")


# ---- the client (vLLM 0.6.0's benchmark client, one session a request) ----


@dataclass(frozen=True)
class Streamed:
    """One streamed completion as the client saw it (time.perf_counter: CLOCK_MONOTONIC, the same
    clock in every process): when it was sent, and its first and last data chunk."""

    sent: float
    first: float
    last: float


async def one(url: str, prompt: str, i: int, model: str = "m", max_tokens: int = 16) -> Streamed:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)) as session:
        payload = {
            "model": model,
            "prompt": prompt,
            "temperature": 0.0,
            "best_of": 1,
            "max_tokens": max_tokens,
            "stream": True,
            "user": str(i),
        }
        headers = {"Authorization": "Bearer none"}
        sent = time.perf_counter()  # benchmark_serving.py's ``st``: just before the POST
        first = last = 0.0
        async with session.post(url=url, json=payload, headers=headers) as response:
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {await response.text()}")
            async for line in response.content:
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    last = time.perf_counter()
                    first = first or last
        return Streamed(sent, first, last)


async def burst(url: str, texts: list[str], model: str = "m", max_tokens: int | list[int] = 16,
                gaps: list[float] | None = None) -> list[Streamed]:  # fmt: skip
    """``texts`` sent in order, one task each, as benchmark_serving.py sends them: ``gaps`` the
    seconds its get_request sleeps before each (the drawn interval; none: all at once, an infinite
    rate); ``max_tokens`` one for all or each request's."""
    each = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(texts)
    gaps = [0.0] * len(texts) if gaps is None else gaps
    if len(each) != len(texts) or len(gaps) != len(texts):
        raise ValueError(f"{len(each)} max_tokens and {len(gaps)} gaps for {len(texts)} prompts: one each")
    tasks = []
    for i, (p, n, gap) in enumerate(zip(texts, each, gaps)):
        if gap > 0:
            await asyncio.sleep(gap)
        tasks.append(asyncio.create_task(one(url, p, i, model, n)))
    return await asyncio.gather(*tasks)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, tries: int = 200) -> None:
    """Until the server just started answers ``url`` (0.1 s between tries)."""
    import urllib.request

    for _ in range(tries):
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--prompt-tokens", type=int, default=462)
    p.add_argument("--tokenizer", help="Llama 3's tokenizer.model (default: a BPE trained here)")
    p.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        serve(int(a.serve[0]), int(a.serve[1]), a.serve[2])
        return
    import tempfile
    import urllib.request

    lines = corpus_lines()
    tok = llama3_tokenizer(a.tokenizer) if a.tokenizer else train_tokenizer(lines)
    texts = prompts(tok, lines, a.requests, a.prompt_tokens)
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok)
    t0 = time.thread_time()
    for t in texts:
        wrapped(t, add_special_tokens=True)
    per_prompt_ms = (time.thread_time() - t0) / len(texts) * 1e3
    mean_tokens = statistics.mean(len(tok.encode(t).ids) for t in texts)
    with tempfile.TemporaryDirectory() as tmp:
        tok_path = os.path.join(tmp, "tok.json")
        tok.save(tok_path)
        port = free_port()
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(a.requests), tok_path])
        try:
            wait_for(f"http://127.0.0.1:{port}/handed")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/handed") as r:
                server_cpu0 = json.load(r)["cpu_s"]
            c0 = resource.getrusage(resource.RUSAGE_SELF)
            streams = asyncio.run(burst(f"http://127.0.0.1:{port}/v1/completions", texts))
            c1 = resource.getrusage(resource.RUSAGE_SELF)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/handed") as r:
                stats = json.load(r)
        finally:
            server.terminate()
            server.wait()
    handed = stats["handed"]
    starts = {str(i): s.sent for i, s in enumerate(streams)}
    waits = [handed[k] - starts[k] for k in starts]
    first = min(starts.values())
    client_cpu = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
    server_cpu = stats["cpu_s"] - server_cpu0
    asked = "Llama 3's tokenizer.model" if a.tokenizer else f"asked {VOCAB:,}"
    print(f"tokenizer: vocabulary {tok.get_vocab_size():,} ({asked}); prompts of {mean_tokens:.0f} tokens: "
          f"{per_prompt_ms:.3f} ms CPU a prompt")  # fmt: skip
    print(f"burst of {len(starts)} requests: client CPU {client_cpu:.2f} s ({client_cpu / len(starts) * 1e3:.2f} ms a request), "
          f"server CPU {server_cpu:.2f} s ({server_cpu / len(starts) * 1e3:.2f} ms a request, the answers included)")  # fmt: skip
    print(f"wait from st to hand-off: mean {statistics.mean(waits) * 1e3:.0f} ms, first hand-off at "
          f"{(min(handed.values()) - first) * 1e3:.0f} ms, last at {(max(handed.values()) - first) * 1e3:.0f} ms after the first st")  # fmt: skip
    intake = stats["cpu_first"] - server_cpu0
    print(f"server CPU before the first hand-off (the intake): {intake:.2f} s, {intake / len(starts) * 1e3:.2f} ms a request; "
          f"after it (the answers): {stats['cpu_s'] - stats['cpu_first']:.2f} s")  # fmt: skip
    print(f"load average now: {os.getloadavg()[0]:.2f} (2 cores)")


if __name__ == "__main__":
    main()
