"""Swap weights into a loaded model in place: how a decode engine moves to a new policy version between
batches without rebuilding the model (no new graph, no new tokenizer, no reallocation of the KV cache).

The directory is a Hugging Face checkpoint (`*.safetensors`, possibly sharded). Tensors are cast to the model's
own dtype. Tied weights (e.g. SmolLM2's lm_head = embed_tokens) are absent from the files and stay tied.
"""

from __future__ import annotations

from pathlib import Path

import torch


def load_weights_into(model: torch.nn.Module, directory: Path) -> int:
    """Copy every tensor of the checkpoint in `directory` into `model`; returns how many were copied.

    Raises ValueError when the checkpoint does not fit the model (unknown names, missing parameters that are
    not tied, shape mismatches), so a wrong checkpoint never half-loads silently.
    """
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory} holds no *.safetensors files")
    params = dict(model.state_dict())
    tied = {name for name in params if _is_tied(model, name)}
    seen: set[str] = set()
    with torch.no_grad():
        for file in files:
            for name, tensor in load_file(str(file)).items():
                if name not in params:
                    raise ValueError(f"{file.name}: tensor {name!r} is not a parameter of {type(model).__name__}")
                target = params[name]
                if target.shape != tensor.shape:
                    raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(target.shape)}")
                target.copy_(tensor.to(dtype=target.dtype, device=target.device))
                seen.add(name)
    missing = set(params) - seen - tied
    if missing:
        raise ValueError(f"{directory} lacks {len(missing)} parameters, e.g. {sorted(missing)[:3]}")
    return len(seen)


def _is_tied(model: torch.nn.Module, name: str) -> bool:
    """Whether `name` shares storage with another parameter (tied embeddings), so a checkpoint may omit it."""
    get = getattr(model, "get_output_embeddings", None)
    out = get() if callable(get) else None
    if out is None or not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return False
    return name.endswith("lm_head.weight")
