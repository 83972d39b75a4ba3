"""LoRA for the trainer, through `peft`: wrap a causal LM with adapters, and export merged full weights.

- `wrap` adds low-rank adapters (peft's `LoraConfig` + `get_peft_model`) to the layers a
  `trajflow.contracts.training.LoraConfig` names; every base weight is frozen, so an optimizer over `adapter_parameters`
  trains the adapters only.
- `merged_state_dict` is the state dict of the base architecture (the names an unwrapped Hugging Face model uses)
  with every adapted weight replaced by W + (alpha / rank) B A, computed into new tensors: the trainer's own model
  is never merged in place, so it keeps training the adapters. Decode workers load it like any checkpoint
  (`trajflow.rl.weights.apply_weights`, `from_pretrained`, vLLM) and need no peft.
- Trainer checkpoints (`trajflow.rl.checkpoint`) hold the adapter in peft's own format (`adapter_config.json`,
  `adapter_model.safetensors`), which `peft.PeftModel.from_pretrained(base, directory)` also reads.

Limits: plain LoRA on `torch.nn.Linear` layers (no DoRA, rsLoRA, bias training or `modules_to_save`); one
adapter, peft's `default`. Dropout acts only through the adapters' dropout modules, which stay in train mode while
the rest of the model is in eval mode, so with `dropout` > 0 every forward pass of the trainer (its `logprobs`
too) is stochastic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trajflow.contracts.training import LoraConfig

ADAPTER = "default"
"""peft's name for the one adapter the trainer trains."""


def wrap(model: torch.nn.Module, config: LoraConfig) -> Any:
    """`model` with adapters on every layer named in `config.target_modules`, base weights frozen (a
    `peft.PeftModel`; the model's own modules are modified in place). Adapter A is initialised from torch's RNG,
    B at zero, so the wrapped model starts as the base model. Raises ValueError when no layer matches."""
    import peft

    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    unknown = sorted(set(config.target_modules) - names)
    if unknown:
        raise ValueError(
            f"lora.target_modules {unknown} name no linear layer of {type(model).__name__}; its linear layers are "
            f"{sorted(names)}"
        )
    peft_config = peft.LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        target_modules=list(config.target_modules),
        lora_dropout=config.dropout,
        bias="none",
        task_type=peft.TaskType.CAUSAL_LM,
    )
    wrapped = peft.get_peft_model(model, peft_config, adapter_name=ADAPTER)
    wrapped.eval()
    if config.dropout > 0:
        for name, module in wrapped.named_modules():
            if name.endswith(f"lora_dropout.{ADAPTER}"):
                module.train()
    return wrapped


def adapter_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The trainable parameters of a wrapped model: the adapters' A and B matrices, in module order."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(model).__name__} has no trainable adapter parameters")
    return params


def is_wrapped(model: torch.nn.Module) -> bool:
    import peft

    return isinstance(model, peft.PeftModel)


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The base model's state dict (the unwrapped Hugging Face names), each adapted weight merged as W + scale B A
    into a new tensor in W's dtype on W's device (the sum computed in float32). Tensors that share storage in the
    base model (tied embeddings) still share it."""
    from peft.tuners.lora import Linear as LoraLinear

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLinear) and ADAPTER in module.lora_A:
                deltas[f"{name}.weight"] = module.get_delta_weight(ADAPTER)
        merged: dict[str, torch.Tensor] = {}
        for name, tensor in base.state_dict().items():
            if ".lora_" in name:  # the adapters' own tensors (lora_A, lora_B)
                continue
            plain = name.replace(".base_layer.", ".")
            if plain in deltas:
                merged[plain] = (tensor.float() + deltas.pop(plain).float()).to(tensor.dtype)
            else:
                merged[plain] = tensor
    if deltas:  # a LoRA layer whose base weight was not found: the names are not what this module expects
        raise RuntimeError(f"adapted layers without a base weight in the state dict: {sorted(deltas)[:5]}")
    return merged


ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""peft's file of adapter weights (beside `adapter_config.json`) in a directory `save_adapter` writes."""


def save_adapter(model: Any, directory: Path) -> None:
    """The adapter (config and weights, peft's format; not the base model) into `directory`."""
    model.save_pretrained(directory)


def load_adapter(model: Any, directory: Path) -> None:
    """Copy `save_adapter`'s weights into the adapters of `model` (wrapped with the same `LoraConfig`) in place.
    Raises ValueError when the files lack one of the model's adapter tensors or hold others."""
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    saved = load_peft_weights(str(directory), device="cpu")
    expected = {name for name, p in model.named_parameters() if p.requires_grad}
    result = set_peft_model_state_dict(model, saved, adapter_name=ADAPTER)
    missing = sorted(name for name in result.missing_keys if name in expected)
    if result.unexpected_keys or missing:
        raise ValueError(
            f"{directory} holds other adapter tensors than this model's: missing {missing[:3]}, "
            f"unexpected {sorted(result.unexpected_keys)[:3]}"
        )
