"""Weights reach the decode engine: a version published to the store (as the trainer does) is picked up by a
running HFEngine between batches, stamped on its completions, and really changes what it generates."""

from __future__ import annotations

import shutil

import pytest
import torch

from contracts.trajectory import SamplingParams
from infra.policies import PolicyStore
from infra.store import LocalStore
from rl.engines.hf import HFEngine


def _perturbed(src, dst) -> None:  # type: ignore[no-untyped-def]
    """A copy of the checkpoint with every weight changed (as a trainer step would, only more)."""
    from transformers import AutoModelForCausalLM

    shutil.copytree(src, dst)
    model = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    model.save_pretrained(dst, safe_serialization=True)


async def _greedy(path, prompt, params):  # type: ignore[no-untyped-def]
    fresh = HFEngine(path, max_batch=1, batch_wait_ms=0)
    await fresh.start()
    try:
        return await fresh.generate(prompt, params)
    finally:
        await fresh.close()


async def test_engine_follows_published_versions(tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = LocalStore(tmp_path / "store")
    follower = PolicyStore(store, tmp_path / "decode-cache", pointer_ttl_s=0.0)
    publisher = PolicyStore(store, tmp_path / "trainer-cache")
    engine = HFEngine(tiny_model, max_batch=4, batch_wait_ms=1, weights=follower)
    await engine.start()
    try:
        greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
        prompt = engine.tokenizer.encode("hello there")
        base = await engine.generate(prompt, greedy, policy="run-a")
        assert base.policy_version == 0 and engine.available_version("run-a") == 0

        _perturbed(tiny_model, tmp_path / "v1")
        publisher.publish("run-a", 1, tmp_path / "v1")
        assert engine.available_version("run-a") == 1
        after = await engine.generate(prompt, greedy, policy="run-a")
        assert after.policy_version == 1
        # swapped in place, the engine generates exactly what a fresh engine on the new weights does
        expected = await _greedy(tmp_path / "v1", prompt, greedy)
        assert after.token_ids == expected.token_ids and after.token_ids != base.token_ids
        assert after.logprobs == pytest.approx(expected.logprobs, abs=1e-5)

        # another policy (or none) gets the initial weights back, and its own version stamp
        again = await engine.generate(prompt, greedy, policy="")
        assert again.policy_version == 0 and again.token_ids == base.token_ids
        assert engine.stats()["weight_loads"] == 2
    finally:
        await engine.close()


def test_prune_keeps_the_newest_versions(tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = LocalStore(tmp_path / "store")
    policies = PolicyStore(store, tmp_path / "cache")
    for v in (1, 2, 3):
        policies.publish("r", v, tiny_model)
    policies.prune("r", keep=2)
    kept = {u.split("/policy/")[1].split("/")[0] for u in store.list("runs/r/policy/v")}
    assert kept == {"v000002", "v000003"}
    latest = policies.latest("r")
    assert latest is not None and latest.version == 3
    with pytest.raises(KeyError):
        policies.fetch("r", 1)
