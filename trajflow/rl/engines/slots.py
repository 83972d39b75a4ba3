"""Weight slots: the sets of weights an `HFEngine` holds at once (`[model] weight_slots`), so that the version an
eval pins (`RUN@V`) and the version training follows do not evict each other between batches.

An engine serves every policy its requests name, one batch at a time, and a batch never mixes policies. With one
slot, each switch copies the other policy's weights in (`trajflow.rl.weights.apply_weights`) and empties the prefix
cache: an eval during training (`[train.eval] every`) alternates with training's batches, so every batch of both
reloads, and training's next turns are prefilled from scratch. With two slots the pinned version and the followed one
each keep a model of their own with its prefix cache, and a switch between them swaps references.

Which slot a policy gets (`WeightSlots.take`):
1. the slot that holds exactly its weights (policy and version), as they are;
2. else the slot of its line, reloaded in place: a followed run (`RUN`) at an older version, or another pinned
   version of the same run (`RUN@W`), since evals of one run come one after another;
3. else a new slot, a copy of the running model, while there are fewer than the capacity;
4. else the parked slot activated longest ago (with one slot, the running one), reloaded in place.

`None` (auto): two slots when one more copy of the model's parameters and buffers takes at most a quarter of the
memory its device has free when the model is loaded (a GPU: `torch.cuda.mem_get_info`; the CPU: MemAvailable), else
one. Each slot's prefix cache has the engine's whole `prefix_cache_bytes` budget.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trajflow.contracts.trajectory import split_policy
from trajflow.rl.engines.prefix_cache import PrefixCache

_log = logging.getLogger(__name__)

MAX_SLOTS = 8
"""The most slots `weight_slots` may ask for (each is a full copy of the model)."""


@dataclass
class Slot:
    """One set of weights: the model holding them, what they are ("" at version 0: the initial model), and the
    prefix cache computed with them."""

    model: Any
    policy: str
    version: int
    prefix_cache: PrefixCache | None
    activated: int = 0
    """When this slot last became the running one (a counter of `WeightSlots.take` calls)."""


def line(policy: str) -> str:
    """The weights a slot keeps for `policy` across versions: a followed run's own id, or `RUN@` for any version of
    RUN that an eval pins."""
    run, pinned = split_policy(policy)
    return policy if pinned is None else f"{run}@"


class WeightSlots:
    """The parked slots of an engine (the running one is the engine's own model); see the module docstring."""

    def __init__(self, capacity: int, prefix_cache_bytes: int) -> None:
        if not 1 <= capacity <= MAX_SLOTS:
            raise ValueError(f"weight slots must be 1..{MAX_SLOTS}; got {capacity}")
        self.capacity = capacity
        self.prefix_cache_bytes = prefix_cache_bytes
        self.parked: list[Slot] = []
        self._ticks = 0
        self._running_since = 0

    def take(self, running: Slot, want: tuple[str, int]) -> tuple[Slot, bool]:
        """The slot to run policy `want` = (policy, version) on, and whether its weights must be loaded first (and
        its prefix cache cleared; the caller does both and stamps the slot with `want`). `running` (the engine's
        model and what it holds) is parked when another slot is returned."""
        self._ticks += 1
        running.activated = self._running_since
        chosen, load = self._choose(running, want)
        if chosen is not running:
            self.parked = [s for s in self.parked if s is not chosen] + [running]
        self._running_since = chosen.activated = self._ticks
        return chosen, load

    def _choose(self, running: Slot, want: tuple[str, int]) -> tuple[Slot, bool]:
        for slot in self.parked:
            if (slot.policy, slot.version) == want:
                return slot, False
        for slot in (running, *self.parked):
            if line(slot.policy) == line(want[0]):
                return slot, True
        if len(self.parked) + 1 < self.capacity:
            cache = PrefixCache(self.prefix_cache_bytes) if running.prefix_cache is not None else None
            return Slot(copy.deepcopy(running.model), running.policy, running.version, cache), True
        if not self.parked:
            return running, True
        return min(self.parked, key=lambda s: s.activated), True


def auto_capacity(model: torch.nn.Module, device: torch.device) -> int:
    """Two slots when one more copy of `model` takes at most a quarter of `device`'s free memory, else one."""
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    free = _free_bytes(device)
    slots = 2 if free is not None and size * 4 <= free else 1
    _log.info("weight slots: %d (a copy of the model is %.0f MiB, %s free)", slots, size / 2**20, _mib(free))
    return slots


def _free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    meminfo = Path("/proc/meminfo")
    if device.type == "cpu" and meminfo.is_file():
        for row in meminfo.read_text().splitlines():
            if row.startswith("MemAvailable:"):
                return int(row.split()[1]) * 1024
    return None


def _mib(free: int | None) -> str:
    return "unknown" if free is None else f"{free / 2**20:.0f} MiB"
