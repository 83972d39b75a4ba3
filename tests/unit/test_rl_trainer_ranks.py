"""The step loop over two data-parallel CPU processes (gloo, spawned here; no Temporal): with epochs, mini-batches,
decoupled PPO's once-per-step proximal logprobs and the KL penalty, two ranks each training on their shard of
every mini-batch end with the weights and metrics of one process training on the whole batch. The trainer worker
under `accelerate launch`: tests/integration/test_trainer_ranks.py."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.spawn import spawn

from trajflow.contracts.training import LossConfig, TrainerConfig
from trajflow.rl.samples import TrainSample

CONFIG = TrainerConfig(
    lr=1e-3,
    micro_batch=1,
    autocast="off",
    ppo_epochs=2,
    mini_batches=2,
    seed=3,
    loss=LossConfig(kind="decoupled_ppo", clip_low=0.02, clip_high=0.02, kl_coef=0.2, entropy_coef=0.01),
)
"""float32, and micro-batches of one: the two runs may differ only by summation order."""


def batch() -> list[TrainSample]:
    """Five samples of uneven lengths, off-policy: mini-batches of 3 and 2, so a rank's shard is 2, 1 or 1 long."""
    return [
        TrainSample([5, 6, 7, 8], [0.0, -6.0, -6.5, -5.5], [0, 1, 1, 1], 1.0),
        TrainSample([9, 10, 11], [0.0, 0.0, -6.2], [0, 0, 1], -1.0),
        TrainSample([12, 13, 14, 15, 16], [0.0, 0.0, -6.0, -6.3, -6.1], [0, 0, 1, 1, 1], 0.5),
        TrainSample([17, 18, 19, 20, 21, 22], [0.0, -6.4, -6.0, -6.2, -6.6, -5.9], [0, 1, 1, 1, 1, 1], -0.5),
        TrainSample([23, 24], [0.0, -6.1], [0, 1], 0.8),
    ]


def _rank(rank: int, port: int, model: str, out: str) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
        }
    )
    torch.set_num_threads(1)
    from trajflow.rl.trainer import PolicyTrainer

    trainer = PolicyTrainer(Path(model), CONFIG, seed=0, device="cpu")
    assert trainer.accelerator.num_processes == 2
    metrics = [trainer.train_step(batch()) for _ in range(2)]
    if rank == 0:
        torch.save({"metrics": metrics, "weights": trainer.unwrapped_model.state_dict()}, out)
    trainer.accelerator.wait_for_everyone()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_train_what_one_process_trains(tiny_model: Path, tmp_path: Path) -> None:
    from trajflow.rl.trainer import PolicyTrainer

    out = tmp_path / "rank0.pt"
    spawn(_rank, args=(free_port(), str(tiny_model), str(out)), nprocs=2, join=True)
    two = torch.load(out)
    one = PolicyTrainer(tiny_model, CONFIG, seed=0, device="cpu")
    metrics = [one.train_step(batch()) for _ in range(2)]
    for got, want in zip(two["metrics"], metrics, strict=True):
        assert got["updates"] == want["updates"] == 4
        for key in ("loss", "grad_norm", "clip_frac", "kl_ref", "entropy", "tokens", "ratio_max", "is_weight_mean"):
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert metrics[1]["clip_frac"] > 0 and metrics[1]["kl_ref"] > 0
    for name, value in one.unwrapped_model.state_dict().items():
        torch.testing.assert_close(two["weights"][name], value, atol=5e-5, rtol=0, msg=name)
