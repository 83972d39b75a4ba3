"""The frozen reference policy of the KL penalty: the initial model, held by the trainer at the cost of a copy of
its trainable parameters only.

`FrozenReference` snapshots the initial values of the parameters that train (`requires_grad`), once, when the
trainer is built, before any checkpoint is loaded into it. A reference forward pass is the live model's forward
with those values swapped in for the trainable ones (`torch.func.functional_call`); everything frozen is shared,
since a frozen parameter is the same in both. So with `train_last_layers = k` the copy is the top k blocks and
the final norm, with every parameter training it is a whole second set of weights, and with adapters (LoRA) it is
the adapters' initial values (the base model, where the adapters start at zero). Tied parameters (embeddings and
LM head) follow the replacement.

Limits: the copy lives on the training device in the weights' dtype; the reference is never updated (no moving
or EMA reference); a trainer built without it cannot start a KL penalty later, because the initial values are gone.
"""

from __future__ import annotations

from typing import Any

import torch


class FrozenReference:
    """The initial values of a model's trainable parameters, and forward passes of the model with them."""

    def __init__(self, model: torch.nn.Module) -> None:
        """Snapshot `model`'s trainable parameters now (call before the first update or checkpoint load)."""
        self.params = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
        if not self.params:
            raise ValueError("the model has no trainable parameters: its reference would be itself")

    @property
    def numel(self) -> int:
        """How many values the snapshot holds (what the reference costs in memory, times the dtype's size)."""
        return sum(p.numel() for p in self.params.values())

    def forward(self, model: torch.nn.Module, **inputs: Any) -> Any:
        """`model(**inputs)` with the snapshot in place of its trainable parameters, without gradients."""
        with torch.no_grad():
            return torch.func.functional_call(model, self.params, args=(), kwargs=inputs)
