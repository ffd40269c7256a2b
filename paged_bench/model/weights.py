"""Weights: random from a seed, or read from a Hugging Face checkpoint folder (no hub).

Both give a ``state`` dict in Hugging Face's ``LlamaForCausalLM`` names and layout
(``[out, in]`` matrices, float32 numpy arrays), so a random model can be loaded into
``transformers`` and a checkpoint into our backends alike. ``fuse`` turns a state into the
forward's layout: Q/K/V and gate/up projections concatenated, so a layer is four matmuls.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paged_bench.errors import ConfigError
from paged_bench.model.config import ModelConfig

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16}


def layer_names(i: int) -> dict[str, str]:
    p = f"model.layers.{i}."
    return {
        "attn_norm": p + "input_layernorm.weight",
        "q": p + "self_attn.q_proj.weight",
        "k": p + "self_attn.k_proj.weight",
        "v": p + "self_attn.v_proj.weight",
        "o": p + "self_attn.o_proj.weight",
        "mlp_norm": p + "post_attention_layernorm.weight",
        "gate": p + "mlp.gate_proj.weight",
        "up": p + "mlp.up_proj.weight",
        "down": p + "mlp.down_proj.weight",
    }


def shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint with its shape."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(cfg.num_layers):
        n = layer_names(i)
        out.update({
            n["attn_norm"]: (h,), n["q"]: (cfg.q_size, h), n["k"]: (cfg.kv_size, h), n["v"]: (cfg.kv_size, h),
            n["o"]: (h, cfg.q_size), n["mlp_norm"]: (h,), n["gate"]: (inter, h), n["up"]: (inter, h),
            n["down"]: (h, inter),
        })  # fmt: skip
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    return out


def random_state(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Random weights: matrices with variance 1/fan_in so activations keep their scale,
    embeddings with variance 1, norm weights 1. Uniform rather than normal: same variances,
    drawn 6x faster (a 200M-parameter model in 0.5 s). The same seed gives the same weights
    in every backend."""
    rng = np.random.default_rng(seed)
    state = {}
    for name, shape in shapes(cfg).items():
        if len(shape) == 1:
            state[name] = np.ones(shape, np.float32)
            continue
        std = 1.0 if name == "model.embed_tokens.weight" else shape[1] ** -0.5
        half_width = np.float32(std * 3**0.5)  # U(-a, a) has variance a^2 / 3
        w = rng.random(shape, dtype=np.float32)
        w *= 2 * half_width
        w -= half_width
        state[name] = w
    return state


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    with path.open("rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    n = int.from_bytes(buf[:8], "little")
    header = json.loads(buf[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ConfigError(
                "backend.model_path", str(path), f"float32/float16/bfloat16 tensors ({name} is {info['dtype']})"
            )
        begin, end = info["data_offsets"]
        raw = np.frombuffer(buf, dtype=dtype, count=(end - begin) // np.dtype(dtype).itemsize, offset=8 + n + begin)
        if info["dtype"] == "BF16":  # numpy has no bfloat16: its bits are a float32's top half
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[name] = raw.astype(np.float32).reshape(info["shape"])
    return out


INDEX_FILE = "model.safetensors.index.json"


def weight_files(model_path: str | Path) -> list[Path]:
    """The checkpoint's weight files: those its shard index names (as transformers reads them:
    a stray ``*.safetensors`` beside them is no part of the model), else every one there."""
    folder = Path(model_path)
    index = folder / INDEX_FILE
    if not index.is_file():
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ConfigError("backend.model_path", str(model_path), "a folder with *.safetensors weights")
        return files
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError("backend.model_path", str(index), f"a shard index with a weight_map ({e})") from None
    files = [folder / name for name in names]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ConfigError("backend.model_path", str(model_path), f"every shard its index names ({missing[0]} is missing)")
    return files


def _read_checked(path: Path) -> dict[str, np.ndarray]:
    try:
        return _read_safetensors(path)
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:  # truncated, empty, not safetensors
        raise ConfigError("backend.model_path", str(path), f"a whole safetensors file ({type(e).__name__}: {e})") from None


def load_state(cfg: ModelConfig, model_path: str | Path) -> dict[str, np.ndarray]:
    """The checkpoint's weight files (one file or shards), checked against ``cfg``."""
    state: dict[str, np.ndarray] = {}
    for f in weight_files(model_path):
        state.update(_read_checked(f))
    head = state.pop("lm_head.weight", None) if cfg.tie_word_embeddings else None
    embed = state.get("model.embed_tokens.weight")
    if head is not None and embed is not None and not np.array_equal(head, embed):
        # transformers then keeps both, untied: refused rather than served as another model
        raise ConfigError("backend.model_path", str(model_path), "tie_word_embeddings true with no lm_head.weight, "
                          "or one equal to the embeddings (this one differs: set it false in config.json)")  # fmt: skip
    for name, shape in shapes(cfg).items():
        got = state.get(name)
        if got is None or tuple(got.shape) != shape:
            what = "missing" if got is None else f"shaped {tuple(got.shape)}"
            raise ConfigError(
                "backend.model_path", str(model_path), f"weights matching config.json ({name} {shape} is {what})"
            )
    return state


def make_state(cfg: ModelConfig, model_path: str | None, seed: int) -> dict[str, np.ndarray]:
    return load_state(cfg, model_path) if model_path else random_state(cfg, seed)


@dataclass
class LayerWeights:
    attn_norm: Any
    qkv: Any  # [q_size + 2 kv_size, hidden]
    o: Any
    mlp_norm: Any
    gate_up: Any  # [2 intermediate, hidden]
    down: Any


@dataclass
class Weights:
    embed: Any
    layers: list[LayerWeights]
    norm: Any
    lm_head: Any


def fuse(
    state: dict[str, np.ndarray],
    cfg: ModelConfig,
    convert: Callable[[np.ndarray], Any],
    matrix: Callable[[np.ndarray], Any],
) -> Weights:
    """The forward's layout: vectors and the embedding table through ``convert``, matmul
    weights (``[out, in]``) through ``matrix`` (each backend's layout, device and dtype)."""
    layers = []
    for i in range(cfg.num_layers):
        n = layer_names(i)
        layers.append(
            LayerWeights(
                attn_norm=convert(state[n["attn_norm"]]),
                qkv=matrix(np.concatenate([state[n["q"]], state[n["k"]], state[n["v"]]])),
                o=matrix(state[n["o"]]),
                mlp_norm=convert(state[n["mlp_norm"]]),
                gate_up=matrix(np.concatenate([state[n["gate"]], state[n["up"]]])),
                down=matrix(state[n["down"]]),
            )
        )
    embed = state["model.embed_tokens.weight"]
    head = embed if cfg.tie_word_embeddings else state["lm_head.weight"]
    return Weights(convert(embed), layers, convert(state["model.norm.weight"]), matrix(head))
