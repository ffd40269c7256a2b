"""The built-in byte-level tokenizer: UTF-8 bytes are tokens 0-255, then a few specials.

Used when a backend has no tokenizer of its own (random-weight models, the simulator), so
that text workloads and the HTTP server work without downloading anything.
"""

from __future__ import annotations


class ByteTokenizer:
    bos_token_id = 256
    eos_token_id = 257
    vocab_size = 258

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")
