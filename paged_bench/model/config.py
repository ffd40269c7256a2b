"""The model's shape: a Llama-family decoder (RMSNorm, rotary positions, GQA, SwiGLU MLP).

A ``ModelConfig`` comes from a named preset, a mapping of fields (a preset plus overrides),
or a Hugging Face ``config.json``. It also knows the model's size figures that the KV-byte
estimate and the simulator's roofline need.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from paged_bench.errors import ConfigError, check, check_choice, check_int, check_number
from paged_bench.model.tokenizers import ByteTokenizer

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int = 4
    hidden_size: int = 256
    num_heads: int = 8
    num_kv_heads: int = 4
    head_dim: int = 32
    intermediate_size: int = 688
    vocab_size: int = ByteTokenizer.vocab_size
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    dtype: str = "float32"  # of the weights as stored; the backend picks its compute dtype
    bos_token_id: int | None = ByteTokenizer.bos_token_id
    eos_token_id: int | None = ByteTokenizer.eos_token_id
    # more ids that end a sequence: the rest of a checkpoint's list (Llama 3.1's three) and its
    # generation_config.json's (Llama 3 Instruct's <|eot_id|>), which transformers' generate
    # and vLLM (its stop_token_ids) stop on too
    more_eos_token_ids: tuple[int, ...] = ()
    # Mistral's: each token attends to the last N only; the same model as full attention up to
    # N tokens, so a max_model_len past it is refused (build), not the checkpoint
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            check_int(f"backend.model.{f}", getattr(self, f))
        check_int("backend.model.vocab_size", self.vocab_size, 2)
        check_int("backend.model.max_position_embeddings", self.max_position_embeddings)
        check_number("backend.model.rope_theta", self.rope_theta, 0, strict=True)
        check_number("backend.model.rms_norm_eps", self.rms_norm_eps, 0, strict=True)
        check(
            self.num_heads % self.num_kv_heads == 0,
            "backend.model.num_kv_heads",
            self.num_kv_heads,
            f"a divisor of num_heads={self.num_heads} (grouped-query attention)",
        )
        check_choice("backend.model.dtype", self.dtype, DTYPE_BYTES)
        # rotary embeddings turn pairs of a head's dimensions
        check(self.head_dim % 2 == 0, "backend.model.head_dim", self.head_dim, "an even number (rotary positions)")
        check(isinstance(self.tie_word_embeddings, bool), "backend.model.tie_word_embeddings",
              self.tie_word_embeddings, "true or false")  # fmt: skip
        check(isinstance(self.more_eos_token_ids, (list, tuple))
              and all(isinstance(i, int) and not isinstance(i, bool) for i in self.more_eos_token_ids),
              "backend.model.more_eos_token_ids", self.more_eos_token_ids, "a list of token ids")  # fmt: skip
        # a tuple whatever it came as (a preset's JSON, a YAML mapping): configs compare equal
        object.__setattr__(self, "more_eos_token_ids", tuple(self.more_eos_token_ids))

    # -- size figures -------------------------------------------------------------------

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one layer's matrix multiplies (attention projections and the MLP)."""
        h = self.hidden_size
        return h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 3 * h * self.intermediate_size

    @property
    def matmul_params(self) -> int:
        """Weights every step reads in full: all layers' matmuls plus the LM head (the
        embedding table is only gathered from)."""
        return self.num_layers * self.layer_matmul_params + self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        norms = (2 * self.num_layers + 1) * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return self.num_layers * self.layer_matmul_params + embed + head + norms

    def kv_bytes_per_token(self, dtype: str | None = None) -> int:
        """layers x KV heads x head_dim x bytes x 2 (K and V)."""
        return self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[dtype or self.dtype] * 2

    # -- Hugging Face config.json -------------------------------------------------------

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], where: str = "config.json") -> ModelConfig:
        """From a Llama-family ``config.json`` (transformers 4.x and 5.x spellings)."""
        arch = hf.get("model_type", "llama")
        check(arch in ("llama", "mistral"), f"{where}: model_type", arch, "a Llama-family model (llama, mistral)")
        for key in ("attention_bias", "mlp_bias"):
            check(not hf.get(key, False), f"{where}: {key}", hf.get(key), "false (biases are not supported)")
        check(hf.get("hidden_act", "silu") == "silu", f"{where}: hidden_act", hf.get("hidden_act"), "silu")
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        check(rope_type == "default", f"{where}: rope_type", rope_type, "default (rope scaling is not supported)")
        window = hf.get("sliding_window") if hf.get("use_sliding_window", True) else None
        check(window is None or (isinstance(window, int) and not isinstance(window, bool) and window > 0),
              f"{where}: sliding_window", window, "null or a number of tokens")  # fmt: skip
        heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id")
        dtype = str(hf.get("dtype") or hf.get("torch_dtype") or "float32").replace("torch.", "")
        return cls(
            num_layers=hf["num_hidden_layers"],
            hidden_size=hf["hidden_size"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            intermediate_size=hf["intermediate_size"],
            vocab_size=hf["vocab_size"],
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            dtype=dtype if dtype in DTYPE_BYTES else "float32",
            bos_token_id=hf.get("bos_token_id"),
            # a list (several end tokens): the first is the EOS, the scheduler stops on any
            eos_token_id=eos[0] if isinstance(eos, list) and eos else eos,
            more_eos_token_ids=tuple(eos[1:]) if isinstance(eos, list) else (),
            sliding_window=window,
        )

    def to_hf(self) -> dict[str, Any]:
        """The ``config.json`` of a ``LlamaForCausalLM`` with this shape."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": self.dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": [self.eos_token_id, *self.more_eos_token_ids] if self.more_eos_token_ids else self.eos_token_id,
        }


# Named shapes. ``small`` is the numpy backend's default (a step costs milliseconds on two
# cores); ``bench-200m`` is the benchmark's (fp32 weights well beyond the CPU caches);
# the Llama ones are for the KV-byte estimate and the simulator.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128),
    "small": ModelConfig(num_kv_heads=2),
    "bench-200m": ModelConfig(
        num_layers=12, hidden_size=1024, num_heads=16, num_kv_heads=4, head_dim=64,
        intermediate_size=2816, vocab_size=32000,
    ),
    "llama-3.2-1b": ModelConfig(
        num_layers=16, hidden_size=2048, num_heads=32, num_kv_heads=8, head_dim=64, intermediate_size=8192,
        vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=True, dtype="bfloat16",
        max_position_embeddings=131072,
    ),
    "llama-3-8b": ModelConfig(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336,
        vocab_size=128256, rope_theta=500000.0, dtype="bfloat16", max_position_embeddings=8192,
    ),
    "llama-3-70b": ModelConfig(
        num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, head_dim=128, intermediate_size=28672,
        vocab_size=128256, rope_theta=500000.0, dtype="bfloat16", max_position_embeddings=8192,
    ),
    "llama-2-7b": ModelConfig(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32, head_dim=128, intermediate_size=11008,
        vocab_size=32000, dtype="float16",
    ),
    "llama-2-70b": ModelConfig(
        num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, head_dim=128, intermediate_size=28672,
        vocab_size=32000, dtype="float16", max_position_embeddings=4096,
    ),
    # LLaMA (1) 33B, "30B" on the Hugging Face hub (huggyllama/llama-30b): no grouped KV heads
    "llama-33b": ModelConfig(
        num_layers=60, hidden_size=6656, num_heads=52, num_kv_heads=52, head_dim=128, intermediate_size=17920,
        vocab_size=32000, dtype="float16", max_position_embeddings=2048, rms_norm_eps=1e-6,
    ),
}  # fmt: skip


def read_hf_config(model_path: str | Path) -> ModelConfig:
    path = Path(model_path) / "config.json"
    if not path.is_file():
        raise ConfigError("backend.model_path", str(model_path), "a local folder with a config.json (no hub downloads)")
    try:
        hf = json.loads(path.read_text())
        check(isinstance(hf, dict), "backend.model_path", str(path), "a config.json holding a JSON object")
        return with_generation_eos(ModelConfig.from_hf(hf, str(path)), Path(model_path) / "generation_config.json")
    except ConfigError:
        raise
    except (KeyError, ValueError, TypeError, ZeroDivisionError, OSError) as e:
        raise ConfigError("backend.model_path", str(model_path), f"a Llama config.json ({path}: {e!r})") from e


def with_generation_eos(cfg: ModelConfig, path: Path) -> ModelConfig:
    """``cfg`` also ending on the end ids of a ``generation_config.json`` (if there is one)."""
    if not path.is_file():
        return cfg
    eos = json.loads(path.read_text()).get("eos_token_id")
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    more = [i for i in ids if i != cfg.eos_token_id and i not in cfg.more_eos_token_ids]
    check(all(isinstance(i, int) and not isinstance(i, bool) for i in more), f"{path}: eos_token_id", eos,
          "a token id or a list of them")  # fmt: skip
    return replace(cfg, more_eos_token_ids=(*cfg.more_eos_token_ids, *more)) if more else cfg


def resolve_model(
    model: str | Mapping[str, Any] | ModelConfig | None, model_path: str | None = None, key: str = "backend.model"
) -> ModelConfig:
    """``model_path`` (a checkpoint's config.json) wins; else ``model``: a preset name, or a
    mapping of fields with an optional ``preset`` key to start from."""
    if model_path:
        return read_hf_config(model_path)
    if isinstance(model, ModelConfig):
        return model
    if model is None or isinstance(model, str):
        name = "small" if model is None else model
        check(name in PRESETS, key, name, f"one of {', '.join(PRESETS)}, or a mapping of fields")
        return PRESETS[name]
    check(isinstance(model, Mapping), key, model, "a preset name or a mapping of fields")
    spec = dict(model)
    base = resolve_model(spec.pop("preset", "small"), key=key)
    names = {f.name for f in fields(ModelConfig)}
    for field, value in spec.items():
        check(field in names, f"{key}.{field}", value, f"one of preset, {', '.join(sorted(names))}")
    return replace(base, **spec)
