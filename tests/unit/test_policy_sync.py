"""Weights reach the decode engine: a version published to the store (as the trainer does) is picked up by a
running HFEngine between batches, stamped on its completions, and really changes what it generates."""

from __future__ import annotations

import shutil

import pytest
import torch

from trajflow.contracts.trajectory import SamplingParams
from trajflow.infra.policies import PolicyStore
from trajflow.infra.store import LocalStore
from trajflow.rl.engines.hf import HFEngine


def _perturbed(src, dst) -> None:
    """A copy of the checkpoint with every weight changed (as a trainer step would, only more)."""
    from transformers import AutoModelForCausalLM

    shutil.copytree(src, dst)
    model = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    model.save_pretrained(dst, safe_serialization=True)


async def _greedy(path, prompt, params):
    fresh = HFEngine(path, max_batch=1, batch_wait_ms=0)
    await fresh.start()
    try:
        return await fresh.generate(prompt, params)
    finally:
        await fresh.close()


@pytest.mark.parametrize("prefix_cache_bytes", [0, 2**26], ids=["no-prefix-cache", "prefix-cache"])
async def test_engine_follows_published_versions(tiny_model, tmp_path, prefix_cache_bytes) -> None:
    """With a prefix cache, the same prompt again after a new version must not reuse the old weights' keys."""
    store = LocalStore(tmp_path / "store")
    follower = PolicyStore(store, tmp_path / "decode-cache", pointer_ttl_s=0.0)
    publisher = PolicyStore(store, tmp_path / "trainer-cache")
    engine = HFEngine(
        tiny_model,
        max_batch=4,
        batch_wait_ms=1,
        weights=follower,
        prefix_cache_bytes=prefix_cache_bytes,
        weight_slots=1,  # one set of weights: going back to the initial model reloads it (test_weight_slots: two)
    )
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


def test_prune_keeps_the_newest_versions(tiny_model, tmp_path) -> None:
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


def test_split_policy_reads_a_pin_only_from_run_at_digits() -> None:
    from trajflow.contracts.trajectory import split_policy

    assert split_policy("run-a@3") == ("run-a", 3)
    assert split_policy("run-a@0") == ("run-a", 0)
    assert split_policy("run-a") == ("run-a", None)
    assert split_policy("") == ("", None)
    for unpinned in ("run-a@", "@3", "run-a@v3", "run-a@-1", "run-a@\u00b2"):
        assert split_policy(unpinned) == (unpinned, None)


async def test_engine_serves_a_pinned_version_not_the_newest(tiny_model, tmp_path) -> None:
    """`RUN@V` generates with exactly version V while newer versions are published; the newest still serves the
    unpinned run; a version that is not in the store is reported as not available (0) and never served."""
    store = LocalStore(tmp_path / "store")
    follower = PolicyStore(store, tmp_path / "decode-cache", pointer_ttl_s=0.0)
    publisher = PolicyStore(store, tmp_path / "trainer-cache")
    _perturbed(tiny_model, tmp_path / "v1")
    publisher.publish("run-a", 1, tmp_path / "v1")
    publisher.publish("run-a", 2, tiny_model)  # v2: the initial weights again, so v1 and v2 generate differently
    assert follower.versions("run-a") == [1, 2] and follower.versions("nobody") == []
    engine = HFEngine(tiny_model, max_batch=4, batch_wait_ms=1, weights=follower)
    await engine.start()
    try:
        greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
        prompt = engine.tokenizer.encode("hello there")
        expected_v1 = await _greedy(tmp_path / "v1", prompt, greedy)
        expected_v2 = await _greedy(tiny_model, prompt, greedy)
        assert expected_v1.token_ids != expected_v2.token_ids

        assert engine.available_version("run-a") == 2 and engine.available_version("run-a@1") == 1
        pinned = await engine.generate(prompt, greedy, policy="run-a@1")
        newest = await engine.generate(prompt, greedy, policy="run-a")
        assert (pinned.policy_version, pinned.token_ids) == (1, expected_v1.token_ids)
        assert (newest.policy_version, newest.token_ids) == (2, expected_v2.token_ids)
        initial = await engine.generate(prompt, greedy, policy="run-a@0")
        assert (initial.policy_version, initial.token_ids) == (0, expected_v2.token_ids)

        assert engine.available_version("run-a@7") == 0  # not published: a request pinned to it waits
        with pytest.raises(KeyError):  # and a batch that tries it fails rather than serving other weights
            await engine.generate(prompt, greedy, policy="run-a@7")
        publisher.publish("run-a", 3, tiny_model)
        publisher.prune("run-a", keep=2)
        assert follower.versions("run-a") == [2, 3]
        assert engine.available_version("run-b@1") == 0
    finally:
        await engine.close()


def test_caches_of_dead_workers_on_this_host_are_swept(tmp_path) -> None:
    import os
    import subprocess

    from trajflow.infra.policies import sweep_dead_worker_caches

    exited = subprocess.Popen(["true"])
    exited.wait()
    dead_pid = exited.pid
    root = tmp_path / "policies"
    dead = root / f"box-a-{dead_pid}-abc123"
    live = root / f"box-a-{os.getpid()}-def456"
    other_host = root / f"box-b-{dead_pid}-abc123"
    for d in (dead, live, other_host):
        (d / "run" / "v000001").mkdir(parents=True)
    assert sweep_dead_worker_caches(root, "box-a") == [dead]
    assert not dead.exists() and live.exists() and other_host.exists()
    assert sweep_dead_worker_caches(tmp_path / "missing", "box-a") == []
