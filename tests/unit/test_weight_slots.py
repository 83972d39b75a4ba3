"""Weight slots (`trajflow.rl.engines.slots`): which slot a policy runs on, and an engine with two that serves an eval
pinned to an earlier version beside the version training follows, switching between them without a reload and with
exactly the tokens each version alone gives."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from trajflow.contracts.trajectory import SamplingParams
from trajflow.infra.policies import PolicyStore
from trajflow.infra.store import LocalStore
from trajflow.rl.engines import slots as slots_module
from trajflow.rl.engines.hf import HFEngine
from trajflow.rl.engines.prefix_cache import PrefixCache
from trajflow.rl.engines.slots import Slot, WeightSlots, auto_capacity, line

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)


def _slot(policy: str, version: int) -> Slot:
    return Slot(torch.nn.Linear(2, 2), policy, version, PrefixCache(1024))


def test_line_groups_a_runs_pinned_versions_apart_from_the_run_it_follows() -> None:
    assert (line("run"), line("run@3"), line("run@12"), line("")) == ("run", "run@", "run@", "")
    assert line("odd@name") == "odd@name"  # not a pin: a version is decimal digits


def test_one_slot_reloads_the_running_model_in_place() -> None:
    slots, running = WeightSlots(1, 1024), _slot("run", 2)
    chosen, load = slots.take(running, ("run@1", 1))
    assert chosen is running and load and slots.parked == []


def test_two_slots_keep_the_followed_run_and_the_pinned_version() -> None:
    slots, training = WeightSlots(2, 1024), _slot("run", 2)
    evaluating, load = slots.take(training, ("run@1", 1))
    assert evaluating is not training and load, "a new slot, a copy of the running model, loaded with v1"
    assert evaluating.model is not training.model and evaluating.prefix_cache is not training.prefix_cache
    evaluating.policy, evaluating.version = "run@1", 1  # what the engine stamps after loading
    assert slots.parked == [training]
    back, load = slots.take(evaluating, ("run", 2))
    assert back is training and not load and slots.parked == [evaluating]
    # training moves on: its own slot is reloaded in place, the pinned one stays parked
    moved, load = slots.take(training, ("run", 3))
    assert moved is training and load and slots.parked == [evaluating]
    # the next eval pins a later version: it takes the earlier eval's slot, never training's
    later, load = slots.take(training, ("run@3", 3))
    assert later is evaluating and load and slots.parked == [training]


def test_a_full_set_reloads_the_slot_activated_longest_ago() -> None:
    slots, base = WeightSlots(2, 1024), _slot("", 0)
    run, _ = slots.take(base, ("run", 1))
    run.policy, run.version = "run", 1
    other, load = slots.take(run, ("other", 1))
    assert other is base and load, "base was parked longest: its slot takes the new policy"
    assert slots.parked == [run]


def test_slot_counts_are_bounded() -> None:
    for bad in (0, slots_module.MAX_SLOTS + 1):
        with pytest.raises(ValueError, match="weight slots"):
            WeightSlots(bad, 0)


def test_auto_is_two_slots_only_where_a_copy_fits_in_a_quarter_of_free_memory(monkeypatch) -> None:
    model = torch.nn.Linear(256, 256)  # 257 * 256 float32 values: 263,168 bytes
    size = 257 * 256 * 4
    monkeypatch.setattr(slots_module, "_free_bytes", lambda device: 4 * size)
    assert auto_capacity(model, torch.device("cpu")) == 2
    monkeypatch.setattr(slots_module, "_free_bytes", lambda device: 4 * size - 1)
    assert auto_capacity(model, torch.device("cpu")) == 1
    monkeypatch.setattr(slots_module, "_free_bytes", lambda device: None)
    assert auto_capacity(model, torch.device("cpu")) == 1


def test_free_memory_is_read_on_this_cpu() -> None:
    free = slots_module._free_bytes(torch.device("cpu"))
    assert free is not None and free > 0


def _perturbed(src: Path, dst: Path, seed: int) -> None:
    """A copy of the checkpoint with every weight changed (as training would, only more)."""
    from transformers import AutoModelForCausalLM

    shutil.copytree(src, dst)
    model = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    model.save_pretrained(dst, safe_serialization=True)


async def _alone(path: Path, prompt: list[int]) -> list[int]:
    fresh = HFEngine(path, max_batch=1, batch_wait_ms=0, weight_slots=1)
    await fresh.start()
    try:
        return (await fresh.generate(prompt, GREEDY)).token_ids
    finally:
        await fresh.close()


@pytest.mark.parametrize("weight_slots, loads", [(1, 7), (2, 2)], ids=["one-slot", "two-slots"])
async def test_an_eval_pinned_beside_training_switches_without_reloading(
    tiny_model: Path, tmp_path: Path, weight_slots: int, loads: int
) -> None:
    """Training's batches (the run at v2) and an eval's (pinned at v1) alternate, as they do while an eval runs
    during training: with two slots nothing is loaded after each slot's first version; with one, every switch
    reloads. Either way each batch gives exactly what its version alone gives, with the prefix cache on."""
    store = LocalStore(tmp_path / "store")
    publisher = PolicyStore(store, tmp_path / "trainer-cache")
    for version in (1, 2):
        _perturbed(tiny_model, tmp_path / f"v{version}", seed=version)
        publisher.publish("run", version, tmp_path / f"v{version}")
    follower = PolicyStore(store, tmp_path / "decode-cache", pointer_ttl_s=0.0)
    engine = HFEngine(
        tiny_model, max_batch=4, batch_wait_ms=1, weights=follower, prefix_cache_bytes=2**26, weight_slots=weight_slots
    )
    await engine.start()
    try:
        prompt = engine.tokenizer.encode("hello there")
        expected = {"run": await _alone(tmp_path / "v2", prompt), "run@1": await _alone(tmp_path / "v1", prompt)}
        assert expected["run"] != expected["run@1"], "the two versions must generate differently to tell them apart"
        for policy in ("run", "run@1") * 3 + ("run",):
            done = await engine.generate(prompt, GREEDY, policy=policy)
            assert done.token_ids == expected[policy], policy
            assert done.policy_version == (2 if policy == "run" else 1)
        stats = engine.stats()
        assert (stats["weight_loads"], stats["slot_switches"]) == (loads, 7 - loads)
        assert engine.slots.capacity == weight_slots
    finally:
        await engine.close()


async def test_auto_gives_the_tiny_model_two_slots_on_this_machine(tiny_model: Path) -> None:
    engine = HFEngine(tiny_model, max_batch=1)
    await engine.start()
    try:
        assert engine.slots.capacity == 2
    finally:
        await engine.close()
