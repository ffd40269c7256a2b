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


class ChatTemplateError(ValueError):
    """The checkpoint's chat template refused the messages (``raise_exception`` in it: a system
    role it does not take, roles that do not alternate): the client's to fix."""


def chat_renderer(tokenizer: Any) -> Callable[[list[dict[str, str]]], list[int]]:
    """messages -> prompt token ids, with the checkpoint's template when it ships one."""
    hf = getattr(tokenizer, "hf", None) or tokenizer  # model.tokenizers.HFTokenizer keeps it in .hf
    if getattr(hf, "chat_template", None) and hasattr(hf, "apply_chat_template"):
        from jinja2 import TemplateError  # what transformers renders templates with

        def render(messages: list[dict[str, str]]) -> list[int]:
            try:
                ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            except (TemplateError, ValueError, TypeError) as e:  # as vLLM's serving_chat: a 400
                raise ChatTemplateError(f"the model's chat template refused the messages: {e}") from e
            if isinstance(ids, dict) or hasattr(ids, "keys"):  # newer transformers return a BatchEncoding
                ids = ids["input_ids"]
            return list(ids)

        return render
    return lambda messages: tokenizer.encode(simple_chat_template(messages))


class TextStream:
    """A request's output tokens -> text deltas, one per token, at a bounded cost per token.

    Decoding is incremental, as vLLM's ``detokenize_incrementally``: each token decodes only
    the few tokens since the last emitted text (``prefix``..end), never the whole output, and
    stop strings are searched only in the text's tail that a new token can complete. With
    the server's limits on stop strings the work per token is bounded, whatever the output
    length (docs/serving.md, "Limits")."""

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...] = ()) -> None:
        self._decode = decode
        self._stop = stop
        self._max_stop = max((len(s) for s in stop), default=0)
        self.token_ids: list[int] = []
        self._prefix = 0  # token_ids[_prefix:_read] decode to the tail of ``_text``
        self._read = 0
        self._text = ""  # decoded so far (what is sent, plus what is held back)
        self.text = ""  # what has been sent so far
        self.stopped = False  # a stop string matched

    def add(self, token_id: int) -> str:
        """The delta for one more token; sets ``stopped`` when a stop string completes."""
        self.token_ids.append(token_id)
        before = len(self._text)
        self._text += self._new_text()
        stop_at = self._stop_in(self._text, before)
        if stop_at is not None:
            return self._emit(self._text[:stop_at])
        return self._emit(self._text[: len(self._text) - self._stop_prefix_len(self._text)])

    def flush(self) -> str:
        """Everything held back, at the end of a request that did not stop on a string (it may
        stop now: on a stop string that ends in the U+FFFD of an incomplete last character)."""
        if self.stopped:
            return ""
        tail = self._decode(self.token_ids[self._prefix :])  # an incomplete character as U+FFFD
        prefix_text = self._decode(self.token_ids[self._prefix : self._read])
        text = self._text + tail[len(prefix_text) :]
        stop_at = self._stop_in(text, len(self._text))
        return self._emit(text if stop_at is None else text[:stop_at])

    def _stop_in(self, text: str, new_from: int) -> int | None:
        """Where the first stop string that ends past ``new_from`` starts in ``text`` (and
        ``stopped`` set), or None."""
        if not self._stop:
            return None
        start = max(0, new_from - self._max_stop + 1)
        hits = [i for s in self._stop if (i := text.find(s, start)) >= 0]
        if not hits:
            return None
        self.stopped = True
        return min(hits)

    def _new_text(self) -> str:
        ids = self.token_ids
        prefix_text = self._decode(ids[self._prefix : self._read])
        new_text = self._decode(ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT):
            self._prefix, self._read = self._read, len(ids)
            return new_text[len(prefix_text) :]
        return ""  # an incomplete UTF-8 sequence: wait for its next byte

    def _stop_prefix_len(self, text: str) -> int:
        """The longest tail of ``text`` that begins a stop string. Only where a stop string's
        first character stands in the tail can one begin, so those places alone are tried
        (str.find): 16 stop strings of 256 characters cost ~1 ms a token tried tail by tail."""
        longest = 0
        for s in self._stop:
            window = text[-(len(s) - 1) :] if len(s) > 1 else ""
            j = window.find(s[0])
            while j >= 0 and len(window) - j > longest:
                if s.startswith(window[j:]):
                    longest = len(window) - j
                    break
                j = window.find(s[0], j + 1)
        return longest

    def _emit(self, upto: str) -> str:
        if len(upto) <= len(self.text):
            return ""
        delta = upto[len(self.text) :]
        self.text = upto
        return delta
