"""Swap weights into a loaded model in place: how a decode engine moves to a new policy version between
batches without rebuilding the model (no new graph, no new tokenizer, no reallocation).

The directory is a Hugging Face checkpoint (`*.safetensors`, possibly sharded). Tensors are cast to the model's
own dtype and device. Tied weights (e.g. SmolLM2's lm_head = embed_tokens) may be absent from the files.
"""

from __future__ import annotations

from pathlib import Path

import torch


def apply_weights(model: torch.nn.Module, directory: Path) -> None:
    """Copy the safetensors weights of a saved checkpoint into `model` in place (each tensor cast to the
    model's dtype and device). Raises ValueError on unknown or missing tensors; a tensor left out because it is
    tied to one that was saved (e.g. lm_head = embeddings) is fine."""
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {directory}")
    loaded: dict[str, torch.Tensor] = {}
    for file in files:
        loaded.update(load_file(file))
    state = model.state_dict()
    unexpected = sorted(set(loaded) - set(state))
    if unexpected:
        raise ValueError(f"{directory} holds tensors the model does not have: {unexpected[:5]}")
    saved_storage = {state[name].data_ptr() for name in loaded}
    missing = [name for name in state if name not in loaded and state[name].data_ptr() not in saved_storage]
    if missing:
        raise ValueError(f"{directory} lacks tensors of the model: {missing[:5]}")
    with torch.no_grad():
        for name, tensor in loaded.items():
            if state[name].shape != tensor.shape:
                raise ValueError(f"{name}: saved shape {tuple(tensor.shape)} != model's {tuple(state[name].shape)}")
            state[name].copy_(tensor)
