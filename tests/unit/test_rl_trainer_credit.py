"""trajflow.rl.trainer with per-token advantages (per-turn credit) on the tiny random model (float32, CPU): a batch
whose token advantages repeat each sample's advantage takes exactly the [B] step, mixed with samples without them
too, and the trainer uses the token values, not the scalar beside them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.unit.test_rl_trainer import CONFIG, assert_same_params, batch, make_trainer, params
from trajflow.contracts.training import LossConfig


@pytest.mark.parametrize(
    "loss",
    [LossConfig(kind="ppo_clip", clip_low=0.02, clip_high=0.02), LossConfig(kind="decoupled_ppo")],
    ids=["ppo_clip", "decoupled_ppo"],
)
def test_repeated_token_advantages_take_the_same_step(tiny_model: Path, loss: LossConfig) -> None:
    config = CONFIG.model_copy(update={"loss": loss, "micro_batch": 2, "mini_batches": 2, "ppo_epochs": 2})
    per_row, per_token = make_trainer(tiny_model, config), make_trainer(tiny_model, config)
    samples = batch(per_row)
    # the last sample keeps its scalar only: a micro-batch mixes both kinds
    tokened = [
        dataclasses.replace(s, token_advantages=[s.advantage if m else 0.0 for m in s.loss_mask]) for s in samples[:-1]
    ] + samples[-1:]
    a, b = per_row.train_step(samples), per_token.train_step(tokened)
    for key in ("loss", "grad_norm", "clip_frac", "tokens"):
        assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), key
    assert_same_params(params(per_row), params(per_token), atol=0.0)


def test_zero_token_advantages_change_nothing_whatever_the_scalar(tiny_model: Path) -> None:
    trainer = make_trainer(tiny_model)
    samples = [dataclasses.replace(s, token_advantages=[0.0] * len(s.token_ids)) for s in batch(trainer)]
    assert all(s.advantage != 0 for s in samples)
    before = params(trainer)
    metrics = trainer.train_step(samples)
    assert metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0
    assert_same_params(before, params(trainer), atol=0.0)
