"""Tokenizers, behind one ``encode``/``decode`` interface, and which one the server speaks
(``server.tokenizer``).

Built in, for backends without a checkpoint of their own (random-weight models, the
simulator), so that text workloads and the HTTP server work without downloads:

- ``ByteTokenizer``: UTF-8 bytes are tokens 0-255, then BOS and EOS (vocabulary 258).
- ``BPETokenizer``: a real subword byte-level BPE (16,384 merges-and-bytes + BOS and EOS),
  trained once with the ``tokenizers`` library on text every Python install carries (the
  standard library's English docs, ``pydoc_data/topics.py``, then its ``.py`` sources, in
  sorted order, up to a fixed budget) and cached as a ``tokenizer.json`` under the user cache
  dir (``$PAGED_BENCH_CACHE``, else ``$XDG_CACHE_HOME/paged_bench``, else ``~/.cache/paged_bench``).
  Training takes about a second; the same Python and ``tokenizers`` versions give the same
  tokenizer, byte for byte (the cache file's name carries both).

A checkpoint's own (``HFTokenizer``) is read through ``transformers``, from its local folder only.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from paged_bench.errors import ConfigError, one_line
from paged_bench.results.whole_files import write_whole


class ByteTokenizer:
    bos_token_id = 256
    eos_token_id = 257
    vocab_size = 258
    max_token_bytes = 1  # the most UTF-8 bytes of text one token covers

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")


BPE_MERGED_VOCAB = 16384  # bytes + merges; BOS and EOS come after them
BPE_TRAINING_CHARS = 8_000_000  # ~1 s of training on one core
BOS, EOS = "<|bos|>", "<|eos|>"


class BPETokenizer:
    """A ``tokenizers.Tokenizer`` behind the ``encode``/``decode`` interface of the byte one."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.vocab_size = tok.get_vocab_size()
        self.bos_token_id = tok.token_to_id(BOS)
        self.eos_token_id = tok.token_to_id(EOS)
        # byte-level: a token's string has one character per byte it covers (special tokens
        # are matched in text as written), so a text has at least len(utf-8) / this many tokens
        self.max_token_bytes = max(len(token) for token in tok.get_vocab(with_added_tokens=True))
        # the batch calls let go of the GIL while they work (``encode`` holds it throughout):
        # a long prompt tokenized in a worker thread then leaves the server's event loop running
        self._encode_batch = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def encode(self, text: str) -> list[int]:
        return self._encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, token_ids: list[int]) -> str:
        return self.tok.decode(token_ids, skip_special_tokens=True)


def cache_dir() -> Path:
    if os.environ.get("PAGED_BENCH_CACHE"):
        return Path(os.environ["PAGED_BENCH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "paged_bench"


def _training_text(budget: int) -> Iterator[str]:
    """The standard library's English docs first, then its sources, sorted: the same text on
    every install of one Python version."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs = stdlib / "pydoc_data" / "topics.py"
    sources = sorted(p for p in stdlib.rglob("*.py") if not {"test", "tests", "site-packages"} & set(p.parts))
    sent = 0
    for path in ([docs] if docs.is_file() else []) + sources:
        text = path.read_text(encoding="utf-8", errors="replace")
        yield text
        sent += len(text)
        if sent >= budget:
            return


def train_bpe(merged_vocab: int = BPE_MERGED_VOCAB, budget: int = BPE_TRAINING_CHARS) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=merged_vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_training_text(budget), trainer)
    tok.add_special_tokens([BOS, EOS])  # after the merges: ids merged_vocab and merged_vocab + 1
    return tok


def bpe_tokenizer(directory: Path | None = None) -> BPETokenizer:
    """The built-in BPE: read from the cache, or trained once and cached (atomically, so
    concurrent first uses are safe)."""
    from tokenizers import Tokenizer
    from tokenizers import __version__ as tokenizers_version

    directory = directory or cache_dir()
    version = f"py{sys.version_info.major}.{sys.version_info.minor}-tokenizers{tokenizers_version}"
    path = directory / f"bpe-{BPE_MERGED_VOCAB}-{version}.json"
    if path.is_file():
        return BPETokenizer(Tokenizer.from_file(str(path)))
    tok = train_bpe()
    directory.mkdir(parents=True, exist_ok=True)
    write_whole(path, tok.to_str())
    return BPETokenizer(tok)


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
