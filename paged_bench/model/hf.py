"""Our weights as a ``transformers`` ``LlamaForCausalLM``: the reference model and the
baseline that serves the very same weights through Hugging Face's ``generate``."""

from __future__ import annotations

import numpy as np

from paged_bench.errors import PluginError
from paged_bench.model.config import ModelConfig


def to_transformers(cfg: ModelConfig, state: dict[str, np.ndarray], device: str = "cpu", dtype: str = "float32"):
    """A ``LlamaForCausalLM`` holding ``state`` (Hugging Face names), in eval mode."""
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        raise PluginError(
            f"the Hugging Face baseline needs transformers and torch: pip install 'paged-bench[hf,torch]' ({e})"
        ) from e
    hf_cfg = LlamaConfig(**cfg.to_hf())
    with torch.device("meta"):  # no throw-away random init of a model we overwrite anyway
        model = LlamaForCausalLM(hf_cfg)
    tensors = {name: torch.from_numpy(a) for name, a in state.items()}
    if cfg.tie_word_embeddings:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    model.load_state_dict(tensors, strict=True, assign=True)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    # rotary frequencies are a buffer, not a weight: rebuild them off the meta device
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config=hf_cfg)
    dt = getattr(torch, dtype)
    return model.to(device=device, dtype=dt).eval()
