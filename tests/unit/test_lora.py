"""LoRA in the trainer (`trajflow.rl.lora`, `trainer.lora`) on the tiny random model, float32 on the CPU: only the
adapters train, a checkpoint holds the adapter and its AdamW state and a resumed trainer continues exactly, the exported
merged weights give the peft model's logits in a plain Hugging Face model (and in place, as a decode engine
applies them), and bad configs fail with a clear message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from trajflow.contracts.training import LoraConfig, TrainerConfig
from trajflow.rl import lora
from trajflow.rl.samples import TrainSample
from trajflow.rl.trainer import PolicyTrainer
from trajflow.rl.weights import apply_weights

LORA = LoraConfig(rank=4, alpha=8)
CONFIG = TrainerConfig(lr=1e-2, micro_batch=2, autocast="off", lora=LORA)
"""float32 on every CPU (no bf16 autocast), so tolerances hold; a large lr so one step visibly moves the logits."""


def batch(start: int) -> list[TrainSample]:
    """Three samples of uneven lengths (micro-batches pad), advantages of both signs, off-policy behaviour."""
    return [
        TrainSample([start, 6, 7, 8, 9], [0.0, -1.0, -2.0, -1.5, -0.4], [0, 1, 1, 1, 1], 1.0),
        TrainSample([start + 1, 10, 11], [0.0, 0.0, -0.7], [0, 0, 1], -1.0),
        TrainSample([start + 2, 13, 14, 15], [0.0, 0.0, -3.0, -0.2], [0, 0, 1, 1], 0.5),
    ]


def adapters(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.unwrapped_model.named_parameters() if p.requires_grad}


def frozen(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.unwrapped_model.named_parameters() if not p.requires_grad}


def logits(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def test_only_the_adapters_train(tiny_model: Path) -> None:
    trainer = PolicyTrainer(tiny_model, CONFIG)
    names = set(adapters(trainer))
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    # every attention and MLP projection of every block got its A and B
    blocks = trainer.unwrapped_model.get_base_model().config.num_hidden_layers
    assert len(names) == blocks * 7 * 2
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in trainer.unwrapped_model.parameters() if p.requires_grad}
    base_before, adapters_before = frozen(trainer), adapters(trainer)

    trainer.train_step(batch(5))
    trainer.train_step(batch(5))
    assert all(torch.equal(v, frozen(trainer)[n]) for n, v in base_before.items())
    changed = [n for n, v in adapters(trainer).items() if not torch.equal(v, adapters_before[n])]
    assert any(".lora_A." in n for n in changed) and any(".lora_B." in n for n in changed)


@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["no-dropout", "dropout"])
def test_a_resumed_lora_trainer_continues_exactly(tiny_model: Path, tmp_path: Path, dropout: float) -> None:
    """Step 1, checkpoint, then step 2 on a fresh trainer built from the checkpoint equals step 2 of the trainer
    that was never interrupted: adapters, AdamW state and (with dropout, which draws from torch's RNG) the RNG."""
    config = CONFIG.model_copy(update={"lora": LORA.model_copy(update={"dropout": dropout})})
    original = PolicyTrainer(tiny_model, config, seed=3)
    original.train_step(batch(5))
    original.save_checkpoint(tmp_path / "ckpt")
    continued = original.train_step(batch(20))

    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert {"adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "rng-0.pt"} <= set(saved)
    assert not any(name.startswith("model") for name in saved)  # the adapter, not the full model
    assert json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text())["version"] == 1

    resumed = PolicyTrainer(tiny_model, config, seed=99)  # another seed: every bit of state must come from the files
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.version == 1
    state = resumed.optimizer.state_dict()["state"]
    assert state and all(float(s["step"]) == 1 for s in state.values())
    again = resumed.train_step(batch(20))
    assert resumed.version == original.version == 2
    assert again["loss"] == pytest.approx(continued["loss"], abs=1e-7)
    assert again["grad_norm"] == pytest.approx(continued["grad_norm"], rel=1e-6)
    expected = adapters(original)
    got = adapters(resumed)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, atol=1e-7, rtol=0, msg=name)


def test_the_checkpoint_is_a_peft_adapter(tiny_model: Path, tmp_path: Path) -> None:
    """peft itself reads the checkpoint's adapter onto a plain base model: the same policy as the trainer's."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer = PolicyTrainer(tiny_model, CONFIG)
    trainer.train_step(batch(5))
    trainer.save_checkpoint(tmp_path / "ckpt")
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), tmp_path / "ckpt")
    ids = [5, 6, 7, 8, 9, 10]
    torch.testing.assert_close(logits(loaded, ids), logits(trainer.unwrapped_model, ids), atol=1e-5, rtol=0)


def test_merged_export_gives_the_peft_models_logits(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    trainer = PolicyTrainer(tiny_model, CONFIG)
    for _ in range(3):
        trainer.train_step(batch(5))
    ids = [5, 6, 7, 8, 9, 10, 11, 12]
    expected = logits(trainer.unwrapped_model, ids)
    before = adapters(trainer)

    trainer.export_weights(tmp_path / "v3", "float32")
    assert not (tmp_path / "v3" / "adapter_config.json").exists()  # a plain checkpoint: decode needs no peft
    fresh = AutoModelForCausalLM.from_pretrained(tmp_path / "v3")
    torch.testing.assert_close(logits(fresh, ids), expected, atol=1e-5, rtol=0)

    engine_model = AutoModelForCausalLM.from_pretrained(tiny_model)  # version 0, as a decode engine holds it
    assert not torch.allclose(logits(engine_model, ids), expected, atol=1e-3)  # the adapters did change the policy
    apply_weights(engine_model, tmp_path / "v3")
    torch.testing.assert_close(logits(engine_model, ids), expected, atol=1e-5, rtol=0)

    # exporting merged nothing into the trainer's own model: it trains on from the same adapters
    assert lora.is_wrapped(trainer.unwrapped_model)
    assert all(torch.equal(v, adapters(trainer)[n]) for n, v in before.items())
    torch.testing.assert_close(logits(trainer.unwrapped_model, ids), expected, atol=0, rtol=0)


def test_lora_and_last_layers_exclude_each_other() -> None:
    with pytest.raises(ValidationError, match="set one of them"):
        TrainerConfig(lora=LoraConfig(), train_last_layers=8)
    with pytest.raises(ValidationError):
        LoraConfig(rank=0)
    with pytest.raises(ValidationError):
        LoraConfig(target_modules=[])
    assert TrainerConfig.model_validate({"lora": {}}).lora == LoraConfig()


def test_unknown_target_modules_name_the_models_layers(tiny_model: Path) -> None:
    config = CONFIG.model_copy(update={"lora": LoraConfig(target_modules=["q_proj", "c_attn"])})
    with pytest.raises(ValueError, match=r"\['c_attn'\] name no linear layer.*'q_proj'"):
        PolicyTrainer(tiny_model, config)


def test_a_checkpoint_of_another_kind_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    plain = PolicyTrainer(tiny_model, CONFIG.model_copy(update={"lora": None}))
    plain.save_checkpoint(tmp_path / "full")
    with pytest.raises(ValueError, match="trained with lora = None"):
        PolicyTrainer(tiny_model, CONFIG).load_checkpoint(tmp_path / "full")
    PolicyTrainer(tiny_model, CONFIG).save_checkpoint(tmp_path / "rank4")
    other = CONFIG.model_copy(update={"lora": LoraConfig(rank=8)})
    with pytest.raises(ValueError, match="'rank': 4"):
        PolicyTrainer(tiny_model, other).load_checkpoint(tmp_path / "rank4")
    with pytest.raises(ValueError, match="lora is fixed"):
        PolicyTrainer(tiny_model, CONFIG).train_step(batch(5), other)
