"""The response and stream-chunk shapes of ``/v1/completions`` and ``/v1/chat/completions``.

Streaming follows what benchmark clients rely on: one chunk per generated token and choice,
the chat role sent only together with a choice's first token, ``finish_reason`` on its last
token's chunk, and the ``choices: []`` usage chunk only when ``stream_options.include_usage``
asks for it. Log-probabilities take the two OpenAI shapes: completions' parallel lists
(``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``) and chat's ``content`` list
of ``{token, logprob, bytes, top_logprobs}``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from paged_bench.model.logprobs import TokenLogprob

Kind = Literal["completions", "chat"]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass
class ChoiceResult:
    """One finished choice of a non-streamed response."""

    index: int
    text: str
    finish_reason: str
    logprobs: dict | None = None


@dataclass
class LogprobFormatter:
    """Token ids and their log-probabilities -> the endpoint's ``logprobs`` object."""

    kind: Kind
    decode: Callable[[list[int]], str]
    as_ids: bool = False  # vLLM's return_tokens_as_token_ids

    def token(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_ids else self.decode([token_id])

    def completion(self, entries: Sequence[TokenLogprob | None], ids: Sequence[int], offset: int = 0) -> dict:
        """Completions' shape; ``entries[i]`` is None where there is no log-probability (the
        first prompt token under ``echo``)."""
        tokens = [self.token(t) for t in ids]
        offsets, pos = [], offset
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": [None if e is None else e.logprob for e in entries],
            "top_logprobs": [None if e is None else self._top_dict(e) for e in entries],
            "text_offset": offsets,
        }

    def _top_dict(self, entry: TokenLogprob) -> dict[str, float]:
        """Text -> logprob: the chosen token first, then the most likely (OpenAI's legacy
        ``logprobs``: "up to logprobs+1 elements"; vLLM's ``num_output_top_logprobs + 1``).
        Tokens that decode to the same text keep the first one's, as a dict holds only one."""
        out = {self.token(entry.token_id): entry.logprob}
        for token_id, logprob in entry.top:
            out.setdefault(self.token(token_id), logprob)
        return out

    def chat(self, entries: Sequence[TokenLogprob]) -> dict:
        def one(token_id: int, logprob: float) -> dict:
            text = self.token(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        return {"content": [{**one(e.token_id, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
                            for e in entries]}  # fmt: skip

    def of(self, entries: Sequence[TokenLogprob], offset: int = 0) -> dict:
        if self.kind == "chat":
            return self.chat(entries)
        return self.completion(entries, [e.token_id for e in entries], offset)


@dataclass
class ResponseFormat:
    """Builds one endpoint's response objects (``completions`` or ``chat``) for one request."""

    kind: Kind
    model: str
    id: str = ""
    created: int = 0
    _role_sent: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.id = self.id or f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = self.created or int(time.time())

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    def _envelope(self, obj: str, choices: list[dict], usage_: dict | None) -> dict:
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage_ is not None:
            out["usage"] = usage_
        return out

    def chunk(self, index: int, text: str, finish_reason: str | None, logprobs: dict | None = None,
              usage_: dict | None = None) -> dict:  # fmt: skip
        if self.kind == "chat":
            delta = {"content": text}
            if index not in self._role_sent:  # the role comes with a choice's first token
                self._role_sent.add(index)
                delta = {"role": "assistant", "content": text}
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return self._envelope(self._chunk_object, [choice], usage_)

    def usage_chunk(self, usage_: dict) -> dict:
        return self._envelope(self._chunk_object, [], usage_)

    def response(self, choices: list[ChoiceResult], usage_: dict) -> dict:
        if self.kind == "chat":
            out = [{"index": c.index, "message": {"role": "assistant", "content": c.text}, "logprobs": c.logprobs,
                    "finish_reason": c.finish_reason} for c in choices]  # fmt: skip
            return self._envelope("chat.completion", out, usage_)
        out = [{"index": c.index, "text": c.text, "logprobs": c.logprobs, "finish_reason": c.finish_reason}
               for c in choices]  # fmt: skip
        return self._envelope("text_completion", out, usage_)


def model_card(model: str, max_model_len: int, created: int) -> dict:
    """OpenAI's model object (``GET /v1/models/{id}``), with vLLM's ``max_model_len``."""
    return {"id": model, "object": "model", "created": created, "owned_by": "paged_bench", "max_model_len": max_model_len}


def models_list(model: str, max_model_len: int, created: int) -> dict:
    return {"object": "list", "data": [model_card(model, max_model_len, created)]}
