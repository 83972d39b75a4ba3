"""trajflow.rl.distributed in a single process (a group of one, what the trainer worker is without a launcher): `lead`
runs the step here and sends nothing, the trainer is kept between steps and rebuilt from a checkpoint when an order says
so, and the follower-only and leader-only calls refuse the wrong rank. Two ranks:
tests/integration/test_trainer_ranks.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trajflow.contracts.training import TrainerConfig
from trajflow.rl.distributed import StepOrder, TrainerRanks, join_launched_group, launched
from trajflow.rl.samples import TrainSample

CONFIG = TrainerConfig(lr=1e-3, micro_batch=2, autocast="off")


def batch() -> list[TrainSample]:
    return [
        TrainSample([5, 6, 7, 8], [0.0, -1.0, -2.0, -1.5], [0, 1, 1, 1], 1.0),
        TrainSample([9, 10, 11], [0.0, 0.0, -0.7], [0, 0, 1], -1.0),
        TrainSample([12, 13, 14, 15, 16], [0.0, 0.0, -3.0, -0.2, -1.0], [0, 0, 1, 1, 1], 0.5),
    ]


def order(tmp_path: Path, version: int, *, rebuild: bool, restore_from: Path | None = None) -> StepOrder:
    return StepOrder(
        run_id="run",
        version=version,
        config=CONFIG,
        samples=batch(),
        rebuild=rebuild,
        restore_from=restore_from,
        checkpoint_dir=tmp_path / f"ckpt-v{version + 1}",
        export_dir=tmp_path / f"weights-v{version + 1}",
        export_dtype="float32",
    )


def weights(ranks: TrainerRanks) -> dict[str, torch.Tensor]:
    assert ranks.trainer is not None
    return {k: v.detach().clone() for k, v in ranks.trainer.unwrapped_model.state_dict().items()}


def test_a_group_of_one_trains_keeps_and_resumes(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not launched()
    join_launched_group()  # nothing to join
    ranks = TrainerRanks(tiny_model)
    assert (ranks.rank, ranks.world, ranks.is_leader) == (0, 1, True)
    assert not ranks.holds("run", 0)

    first = ranks.lead(order(tmp_path, 0, rebuild=True))
    assert first["sequences"] == 3 and ranks.holds("run", 1)
    assert (tmp_path / "ckpt-v1" / "optimizer.pt").is_file() and (tmp_path / "weights-v1" / "config.json").is_file()
    ranks.keepalive()  # a group of one: nothing to send
    ranks.lead(order(tmp_path, 1, rebuild=False))
    kept = weights(ranks)

    resumed = TrainerRanks(tiny_model)
    resumed.lead(order(tmp_path / "again", 1, rebuild=True, restore_from=tmp_path / "ckpt-v1"))
    assert resumed.holds("run", 2)
    for name, value in weights(resumed).items():
        torch.testing.assert_close(value, kept[name], rtol=0, atol=0)

    with pytest.raises(ValueError, match="is at v1, the step is v2"):
        TrainerRanks(tiny_model).lead(order(tmp_path / "wrong", 2, rebuild=True, restore_from=tmp_path / "ckpt-v1"))
    with pytest.raises(RuntimeError, match="only ranks > 0 follow"):
        ranks.follow()
    ranks.stop()
