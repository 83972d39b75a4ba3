"""Trainer checkpoints and weight export, on disk.

- `save_checkpoint` / `load_checkpoint`: the weights (safetensors; with frozen lower blocks only the trained
  parameters; with LoRA only the adapter, in peft's format), AdamW state, version and each process's RNG state,
  written to a temp dir beside the target and renamed, so a reader sees an old or a new checkpoint, whole.
- `export_weights`: a Hugging Face checkpoint (config, safetensors, tokenizer) in a given dtype, for decode
  workers; with LoRA the adapters merged into the base weights (`trajflow.rl.lora.merged_state_dict`), so a decode
  worker needs no peft. `trajflow.rl.weights.apply_weights` copies such a checkpoint into an existing model in place.

Tensors are written from CPU copies (a trainer on a GPU writes checkpoints any host can read) and loaded onto
the model's own device.

Limits: DDP-style replicated weights only (FSDP/DeepSpeed sharded state dicts are not handled).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trajflow.rl import lora
from trajflow.rl.weights import apply_weights

if TYPE_CHECKING:
    from trajflow.rl.trainer import PolicyTrainer

_STATE_FILE = "trainer_state.json"
_OPTIMIZER_FILE = "optimizer.pt"
_TRAINABLE_FILE = "trainable.safetensors"
"""With frozen lower blocks, a checkpoint holds only the trained parameters (the rest is the initial model)."""


def _replace_dir(tmp: Path, target: Path) -> None:
    """Rename the finished `tmp` to `target`, replacing an older `target` (never leaving a half-written one)."""
    old = target.with_name(f".{target.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    if old.exists():
        shutil.rmtree(old)


def _fresh_tmp(target: Path) -> Path:
    tmp = target.with_name(f".{target.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def _save_in_dtype(model: Any, out: Path, dtype: torch.dtype, weights: dict[str, torch.Tensor] | None = None) -> None:
    """`save_pretrained` of `weights` (None: the model's state dict) with every tensor cast to `dtype` (tied tensors
    stay tied) and the config saying so."""
    import copy

    cast: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    for name, tensor in (model.state_dict() if weights is None else weights).items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in cast:
            cast[key] = tensor.detach().to(device="cpu", dtype=dtype)
        state[name] = cast[key]
    model.save_pretrained(out, state_dict=state)
    config = copy.deepcopy(model.config)
    config.dtype = dtype
    config.save_pretrained(out)


def _on_cpu(value: Any) -> Any:
    """A copy of a (nested) state dict with every tensor on the CPU, so a checkpoint written on a GPU loads anywhere
    (`load_state_dict` moves optimizer state back to each parameter's device)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(trainer: PolicyTrainer, directory: Path) -> None:
    """Weights, AdamW state, version and RNG state into `directory` (replaced whole, via a temp dir)."""
    acc = trainer.accelerator
    directory = Path(directory)
    tmp = directory.with_name(f".{directory.name}.tmp")
    if acc.is_main_process:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = _fresh_tmp(directory)
        if trainer.config.lora is not None:
            lora.save_adapter(trainer.unwrapped_model, tmp)
        elif trainer.config.train_last_layers:
            # frozen parameters equal the initial model's: keep only what training changes
            from safetensors.torch import save_file

            model = trainer.unwrapped_model
            trainable = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
            save_file(trainable, str(tmp / _TRAINABLE_FILE))
        else:
            trainer.unwrapped_model.save_pretrained(tmp)
            trainer.tokenizer.save_pretrained(tmp)
        torch.save(_on_cpu(trainer.optimizer.state_dict()), tmp / _OPTIMIZER_FILE)
        state = {"version": trainer.version, "num_processes": acc.num_processes, "config": trainer.config.model_dump()}
        (tmp / _STATE_FILE).write_text(json.dumps(state, indent=2))
    acc.wait_for_everyone()
    torch.save(_rng_state(), tmp / f"rng-{acc.process_index}.pt")
    acc.wait_for_everyone()
    if acc.is_main_process:
        _replace_dir(tmp, directory)
    acc.wait_for_everyone()


def load_checkpoint(trainer: PolicyTrainer, directory: Path) -> None:
    """Resume from `save_checkpoint`'s directory: weights, AdamW state, version and (this rank's) RNG."""
    directory = Path(directory)
    state = json.loads((directory / _STATE_FILE).read_text())
    saved_lora = state.get("config", {}).get("lora")
    ours = trainer.config.lora.model_dump() if trainer.config.lora is not None else None
    if saved_lora != ours:
        raise ValueError(f"{directory} was trained with lora = {saved_lora}; this trainer has lora = {ours}")
    if ours is not None:
        lora.load_adapter(trainer.unwrapped_model, directory)
    elif (directory / _TRAINABLE_FILE).exists():  # frozen blocks are the initial model's, already loaded
        from safetensors.torch import load_file

        saved = load_file(str(directory / _TRAINABLE_FILE))
        params = dict(trainer.unwrapped_model.named_parameters())
        expected = {n for n, p in params.items() if p.requires_grad}
        if set(saved) != expected:
            raise ValueError(f"{directory} holds other trainable tensors than this trainer trains")
        with torch.no_grad():
            for name, tensor in saved.items():
                params[name].copy_(tensor)
    else:
        apply_weights(trainer.unwrapped_model, directory)
    optimizer_state = torch.load(directory / _OPTIMIZER_FILE, map_location="cpu", weights_only=True)
    trainer.optimizer.load_state_dict(optimizer_state)
    rng_file = directory / f"rng-{trainer.accelerator.process_index}.pt"
    if rng_file.exists():
        _set_rng_state(torch.load(rng_file, weights_only=True))
    trainer.version = int(state["version"])


def export_weights(trainer: PolicyTrainer, directory: Path, dtype: torch.dtype) -> None:
    """A Hugging Face checkpoint of the current weights in `dtype`, with the tokenizer, for decode workers
    (`from_pretrained(directory)` or `apply_weights`). Replaces `directory` whole, via a temp dir."""
    acc = trainer.accelerator
    if acc.is_main_process:
        target = Path(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = _fresh_tmp(target)
        model = trainer.unwrapped_model
        if lora.is_wrapped(model):  # decode workers get W + scale B A under the base model's names
            _save_in_dtype(model.get_base_model(), tmp, dtype, lora.merged_state_dict(model))
        else:
            _save_in_dtype(model, tmp, dtype)
        trainer.tokenizer.save_pretrained(tmp)
        _replace_dir(tmp, target)
    acc.wait_for_everyone()
