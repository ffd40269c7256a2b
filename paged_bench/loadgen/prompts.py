"""A chat request's text, of the workload's prompt length.

A completions request carries the prompt's token ids, exact. A chat message carries text, and
random token ids seldom decode to text that reads back as as many tokens (a byte tokenizer
drops ids past its bytes, a subword one merges what the decoded text joins). So, as vLLM's
benchmark client does (``gen_prompt_decode_to_target_len``): decode, encode the text again,
and trim or pad it with random ids until it reads back as the prompt's length. The server's
chat template then adds its own tokens, as it does to any chat.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paged_bench.core.request import Request
from paged_bench.model.tokenizers import plain_ids

TRIES = 10  # vLLM's max_retry


def text_of_length(tokenizer: Any, token_ids: list[int], rng: np.random.Generator) -> str:
    """Text that ``tokenizer`` reads as ``len(token_ids)`` tokens; after ``TRIES`` rounds the
    last text tried (as vLLM's, which reports the mismatch and sends it)."""
    target, ids = len(token_ids), list(token_ids)
    for _ in range(TRIES):
        text = tokenizer.decode(ids)
        ids = plain_ids(tokenizer, text)
        if len(ids) == target:
            break
        if len(ids) > target:
            ids = ids[:target]
        else:
            ids += rng.integers(0, tokenizer.vocab_size, target - len(ids)).tolist()
    return text


def chat_texts(requests: list[Request], tokenizer: Any, seed: int) -> list[str]:
    """Each request's chat text, in the order of ``requests`` (the same texts for the same seed):
    a prompt that was text (a trace's: its ids are what ``tokenizer``, the server's, which read
    the workload's texts, makes of their own text) goes as that text, as vLLM sends a dataset's;
    random ids are made text of their length in ``tokenizer``."""
    rng = np.random.default_rng(seed)
    texts = []
    for req in requests:
        ids = list(req.prompt_token_ids)
        text = tokenizer.decode(ids)
        texts.append(text if plain_ids(tokenizer, text) == ids else text_of_length(tokenizer, ids, rng))
    return texts
