"""trajflow.rl.devices: which device a setting resolves to (with torch's view of the GPUs patched, so the choice is
tested without one), the clear error for a GPU that is not there, torch threads, and the engine and trainer computing on
the device their setting resolves to (the CPU here)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from trajflow.contracts.config import ModelConfig
from trajflow.contracts.training import TrainerConfig
from trajflow.rl import devices
from trajflow.rl.devices import DeviceUnavailable, resolve_device
from trajflow.rl.engines.hf import HFEngine
from trajflow.rl.engines.load import decode_device, decode_precision, load_engine
from trajflow.rl.precision import choose_precision
from trajflow.rl.trainer import PolicyTrainer


def _gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(
    ("requested", "gpus", "expected"),
    [
        ("auto", 0, "cpu"),
        ("auto", 1, "cuda"),
        ("cpu", 2, "cpu"),
        ("cuda", 1, "cuda"),
        ("cuda:1", 2, "cuda:1"),
    ],
)
def test_a_setting_resolves_to_what_is_visible(
    monkeypatch: pytest.MonkeyPatch, requested: str, gpus: int, expected: str
) -> None:
    _gpus(monkeypatch, gpus)
    assert resolve_device(requested) == expected


def test_a_gpu_asked_for_where_none_is_visible_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 0)
    with pytest.raises(DeviceUnavailable, match="sees no CUDA GPU"):
        resolve_device("cuda")
    _gpus(monkeypatch, 2)
    with pytest.raises(DeviceUnavailable, match=r"sees 2 GPU\(s\).*CUDA_VISIBLE_DEVICES"):
        resolve_device("cuda:2")
    with pytest.raises(ValueError, match="use auto, cpu, cuda or cuda:N"):
        resolve_device("gpu")


def test_the_visible_count_can_be_given_instead_of_asking_torch() -> None:
    assert resolve_device("auto", visible=2) == "cuda" and resolve_device("auto", visible=0) == "cpu"
    assert resolve_device("cuda:1", visible=2) == "cuda:1"
    with pytest.raises(DeviceUnavailable, match="sees no CUDA GPU"):
        resolve_device("cuda", visible=0)


def test_a_host_given_gpus_fails_when_its_worker_sees_fewer(monkeypatch: pytest.MonkeyPatch) -> None:
    devices.require_gpus(None, None, visible=0)  # nothing expected: no host, or one with gpus unset or ""
    devices.require_gpus(0, "cpu-host", visible=0)
    devices.require_gpus(2, "gpu", visible=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    sees = r"this worker sees 1 \(torch .*, CUDA build: .*, CUDA_VISIBLE_DEVICES='0,1'\)"
    with pytest.raises(DeviceUnavailable, match=rf"host 'gpu' was given 2 GPU\(s\), but {sees}; it will not fall back"):
        devices.require_gpus(2, "gpu", visible=1)
    _gpus(monkeypatch, 0)  # what torch says when no visible count is given
    with pytest.raises(DeviceUnavailable, match="host 'gpu' was given 1 GPU"):
        devices.require_gpus(1, "gpu")


def test_decode_precision_follows_the_resolved_device(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "device", lambda _device: contextlib.nullcontext())
    model = ModelConfig(name_or_path="tiny")
    assert decode_device(model, "auto") == "cuda"
    assert decode_precision(model, "auto").dtype == "bfloat16"  # a GPU that runs bf16 natively
    assert decode_precision(model, "cpu") == choose_precision("cpu")  # this CPU's own choice


def test_threads_are_set_and_reported() -> None:
    before = torch.get_num_threads()
    try:
        assert devices.set_threads(1) == 1 == torch.get_num_threads()
        assert devices.set_threads(None) == 1  # None leaves torch's setting alone
        with pytest.raises(ValueError, match="at least 1"):
            devices.set_threads(0)
    finally:
        torch.set_num_threads(before)


async def test_the_engine_loads_on_the_device_its_setting_resolves_to(tmp_path: Path) -> None:
    engine = load_engine(
        ModelConfig(name_or_path="tiny", max_batch=2, batch_wait_ms=1.0), cache_dir=tmp_path, device="auto"
    )
    assert isinstance(engine, HFEngine)
    await engine.start()
    try:
        assert engine.device == torch.device(resolve_device("auto"))
        assert next(engine.model.parameters()).device == engine.device
    finally:
        await engine.close()


def test_the_engine_refuses_a_gpu_that_is_not_there(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _gpus(monkeypatch, 0)
    with pytest.raises(DeviceUnavailable):
        load_engine(ModelConfig(name_or_path="tiny"), cache_dir=tmp_path, device="cuda:0")


def test_the_trainer_takes_its_device_from_the_setting(monkeypatch: pytest.MonkeyPatch, tiny_model: Path) -> None:
    trainer = PolicyTrainer(tiny_model, TrainerConfig(autocast="off"), device="cpu")
    assert trainer.accelerator.device.type == "cpu"
    assert next(trainer.unwrapped_model.parameters()).device.type == "cpu"
    _gpus(monkeypatch, 0)
    with pytest.raises(DeviceUnavailable, match="no CUDA GPU"):
        PolicyTrainer(tiny_model, TrainerConfig(autocast="off"), device="cuda")
