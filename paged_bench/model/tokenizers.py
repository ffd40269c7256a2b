"""The tokenizer a checkpoint ships with (through ``transformers``, from the local folder
only), behind the same ``encode``/``decode`` interface as the built-in byte tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paged_bench.errors import ConfigError
from paged_bench.tokenizer import ByteTokenizer

_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


class HFTokenizer:
    def __init__(self, hf: Any) -> None:
        self.hf = hf  # the transformers tokenizer, for chat templates and the like
        self.vocab_size = len(hf)
        self.bos_token_id = hf.bos_token_id
        self.eos_token_id = hf.eos_token_id

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text))

    def decode(self, token_ids: list[int]) -> str:
        return self.hf.decode(token_ids, skip_special_tokens=True)


def load_tokenizer(model_path: str | None) -> HFTokenizer | ByteTokenizer:
    if not model_path or not any((Path(model_path) / f).is_file() for f in _FILES):
        return ByteTokenizer()
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ConfigError(
            "backend.model_path", model_path, "a checkpoint whose tokenizer can be read: pip install transformers"
        ) from e
    return HFTokenizer(AutoTokenizer.from_pretrained(model_path, local_files_only=True))
