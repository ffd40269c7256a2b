"""The tokenizer a checkpoint ships with (through ``transformers``, from the local folder
only), behind the same ``encode``/``decode`` interface as the built-in byte tokenizer; and
which tokenizer the server speaks (``server.tokenizer``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paged_bench.errors import ConfigError, one_line
from paged_bench.tokenizer import ByteTokenizer

_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


class HFTokenizer:
    max_token_bytes = None  # unbounded: a normaliser may drop text, so bytes bound no token count

    def __init__(self, hf: Any) -> None:
        self.hf = hf  # the transformers tokenizer, for chat templates and the like
        self.vocab_size = len(hf)
        self.bos_token_id = hf.bos_token_id
        self.eos_token_id = hf.eos_token_id

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text))

    def decode(self, token_ids: list[int]) -> str:
        return self.hf.decode(token_ids, skip_special_tokens=True)


def plain_ids(tokenizer: Any, text: str) -> list[int]:
    """``text``'s token ids without special tokens (a checkpoint's tokenizer adds its BOS)."""
    hf = getattr(tokenizer, "hf", None)
    return list(hf.encode(text, add_special_tokens=False) if hf is not None else tokenizer.encode(text))


def text_token_count(tokenizer: Any, text: str) -> int:
    """How many tokens a response's text is, as vLLM's benchmark client counts it: no special
    tokens (a checkpoint's tokenizer would add its BOS to every count)."""
    return len(plain_ids(tokenizer, text))


def load_tokenizer(model_path: str | None) -> HFTokenizer | ByteTokenizer:
    if not model_path or not any((Path(model_path) / f).is_file() for f in _FILES):
        return ByteTokenizer()
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ConfigError(
            "backend.model_path", model_path, "a checkpoint whose tokenizer can be read: pip install transformers"
        ) from e
    try:
        return HFTokenizer(AutoTokenizer.from_pretrained(model_path, local_files_only=True))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:  # a broken tokenizer file
        raise ConfigError("backend.model_path", model_path, f"a readable tokenizer ({one_line(e)})") from None


TOKENIZER_CHOICES = ("auto", "bpe", "byte")


def serving_tokenizer(choice: str, backend_tokenizer: Any, vocab_size: int) -> Any:
    """The tokenizer the server speaks for a backend whose model has ``vocab_size`` tokens.

    ``auto``: the checkpoint's own when the backend has one, else the built-in BPE when the
    model's vocabulary holds it (the simulator's does), else the byte tokenizer (the small
    random-weight models' 258-token vocabulary). ``bpe`` / ``byte`` ask for one by name; its
    ids must fit the model's vocabulary."""
    from paged_bench.tokenizer import BPE_MERGED_VOCAB, bpe_tokenizer

    if choice not in TOKENIZER_CHOICES:
        raise ConfigError("server.tokenizer", choice, ", ".join(TOKENIZER_CHOICES))
    if choice == "auto":
        if not isinstance(backend_tokenizer, ByteTokenizer):
            return backend_tokenizer
        choice = "bpe" if vocab_size >= BPE_MERGED_VOCAB + 2 else "byte"
    tok = bpe_tokenizer() if choice == "bpe" else ByteTokenizer()
    if tok.vocab_size > vocab_size:
        # a checkpoint's vocabulary is its own: only a random-weight model's can grow
        fix = ("server.tokenizer=auto, the checkpoint's own" if not isinstance(backend_tokenizer, ByteTokenizer)
               else f"set +backend.model.vocab_size={tok.vocab_size}, or server.tokenizer=byte")  # fmt: skip
        raise ConfigError(
            "server.tokenizer", choice, f"a tokenizer whose {tok.vocab_size} ids fit the model's vocabulary of {vocab_size} ({fix})"
        )
    return tok
