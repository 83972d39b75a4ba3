"""trajflow.lab.bench.lora at its quick size, so `trajflow bench lora` cannot rot: every option runs in its own process
and reports sane figures, and the options are the default config's trainer with only the way of freezing (or, for
`every-logit`, where logits are computed) changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trajflow.contracts.config import load_run_config
from trajflow.lab.bench.lora import OPTIONS, main, trainer_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_options_differ_from_the_default_config_only_in_how_they_freeze() -> None:
    default = load_run_config(ROOT / "trajflow" / "configs" / "default.toml").train
    blocks, batch = trainer_config("last-blocks", quick=False, rank=16)
    assert blocks == default.trainer and batch == default.batch_size == 16 and blocks.train_last_layers == 8
    lora, _ = trainer_config("lora", quick=False, rank=16)
    assert lora.lora is not None and (lora.lora.rank, lora.lora.alpha) == (16, 32) and lora.train_last_layers == 0
    assert lora.model_copy(update={"lora": None, "train_last_layers": 8}) == blocks
    assert trainer_config("every-logit", quick=False, rank=16)[0] == blocks  # the same config, logits everywhere
    with pytest.raises(ValueError, match="unknown option"):
        trainer_config("full", quick=False, rank=16)


def test_the_quick_bench_runs_every_option(cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "lora.json"
    assert main(quick=True, json_path=out, models_dir=cache_dir / "models", steps=1, rank=4) == 0
    report = json.loads(out.read_text())
    assert report["quick"] is True and os.cpu_count() == report["cores"]
    rows = {r["option"]: r for r in report["options"]}
    assert tuple(rows) == OPTIONS
    for r in rows.values():
        assert r["median_step_s"] > 0 and len(r["step_s"]) == 1 and r["losses_finite"] is True
        assert (
            r["maxrss_steps_mib"] >= r["maxrss_built_mib"] > 0 and r["export_bytes"] > 0 and r["checkpoint_bytes"] > 0
        )
        assert r["tokens_per_step"] == sum(160 + 60 * (1 + i % 4) for i in range(4))
    assert rows["lora"]["trainer"]["lora"]["rank"] == 4 and rows["last-blocks"]["trainer"]["lora"] is None
    assert rows["every-logit"]["trainable_params"] == rows["last-blocks"]["trainable_params"]
    # rank 4 on 7 projections of 4 blocks (hidden 128, kv 64, MLP 384): r x (in + out) per projection
    assert rows["lora"]["trainable_params"] == 4 * 4 * (2 * 256 + 2 * 192 + 3 * 512)
