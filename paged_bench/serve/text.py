"""Text on the way in and out: the chat template, and incremental detokenization with stop strings.

Chat template: the checkpoint's own (a Hugging Face tokenizer's ``apply_chat_template``) when
the backend's tokenizer has one; otherwise this simple one, documented in docs/serving.md::

    <|system|>\\n{content}\\n<|user|>\\n{content}\\n ... <|assistant|>\\n

Detokenization: every generated token yields one text delta (possibly empty), so a stream has
exactly one chunk per token. A delta holds back what may still change: the tail of an
incomplete UTF-8 sequence (decoded as U+FFFD until its last byte arrives) and any tail that could
be the start of a stop string. A matched stop string ends the text before it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

REPLACEMENT = "\ufffd"


def simple_chat_template(messages: list[dict[str, str]]) -> str:
    body = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return body + "<|assistant|>\n"


def chat_renderer(tokenizer: Any) -> Callable[[list[dict[str, str]]], list[int]]:
    """messages -> prompt token ids, with the checkpoint's template when it ships one."""
    hf = getattr(tokenizer, "hf", None) or tokenizer  # model.tokenizers.HFTokenizer keeps it in .hf
    if getattr(hf, "chat_template", None) and hasattr(hf, "apply_chat_template"):

        def render(messages: list[dict[str, str]]) -> list[int]:
            ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):  # newer transformers return a BatchEncoding
                ids = ids["input_ids"]
            return list(ids)

        return render
    return lambda messages: tokenizer.encode(simple_chat_template(messages))


class TextStream:
    """A request's output tokens -> text deltas, one per token."""

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...] = ()) -> None:
        self._decode = decode
        self._stop = stop
        self._max_stop = max((len(s) for s in stop), default=0)
        self.token_ids: list[int] = []
        self.text = ""  # what has been sent so far
        self.stopped = False  # a stop string matched

    def add(self, token_id: int) -> str:
        """The delta for one more token; sets ``stopped`` when a stop string completes."""
        self.token_ids.append(token_id)
        full = self._decode(self.token_ids)
        if self._stop:
            start = max(0, len(self.text) - self._max_stop)
            hits = [i for s in self._stop if (i := full.find(s, start)) >= 0]
            if hits:
                self.stopped = True
                return self._emit(full[: min(hits)])
        end = len(full.rstrip(REPLACEMENT))
        end -= self._stop_prefix_len(full[:end])
        return self._emit(full[:end])

    def flush(self) -> str:
        """Everything held back, at the end of a request that did not stop on a string."""
        return "" if self.stopped else self._emit(self._decode(self.token_ids))

    def _stop_prefix_len(self, text: str) -> int:
        for k in range(min(self._max_stop - 1, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self._stop):
                return k
        return 0

    def _emit(self, upto: str) -> str:
        # decoding can rewrite earlier text (a held-back byte turns U+FFFD into a character);
        # what was sent stays sent, so only the part past it goes out
        if len(upto) <= len(self.text):
            return ""
        delta = upto[len(self.text) :]
        self.text = upto
        return delta
