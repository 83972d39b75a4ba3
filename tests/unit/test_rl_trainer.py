"""trajflow.rl.trainer on the tiny random model (float32, CPU): learning moves logprobs the right way, micro-batching
does not change the step, checkpoints resume exactly, exported weights load, records become samples, and the
trainer's teacher-forced logprobs match what the decode engine recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from trajflow.contracts.records import TrajectoryRecord, TurnContext
from trajflow.contracts.training import LossConfig, TrainerConfig
from trajflow.contracts.trajectory import SamplingParams, TrajectoryRequest, TrajectoryStatus
from trajflow.rl.precision import CpuInfo
from trajflow.rl.samples import TrainSample, samples_from_records
from trajflow.rl.trainer import PolicyTrainer
from trajflow.rl.weights import apply_weights

CONFIG = TrainerConfig(lr=1e-3, micro_batch=4, autocast="off")  # float32 on every CPU, so tolerances hold


def make_trainer(path: Path, config: TrainerConfig = CONFIG) -> PolicyTrainer:
    return PolicyTrainer(path, config, seed=0)


def sample(trainer: PolicyTrainer, prompt: str, completion: str, advantage: float) -> TrainSample:
    """An on-policy sample: behaviour logprobs are the trainer's own, so every ratio starts at 1."""
    p = trainer.tokenizer.encode(prompt, add_special_tokens=False)
    c = [*trainer.tokenizer.encode(completion, add_special_tokens=False), trainer.tokenizer.eos_token_id]
    draft = TrainSample(p + c, [0.0] * (len(p) + len(c)), [0] * len(p) + [1] * len(c), advantage)
    logprobs = trainer.logprobs([draft])[0]
    return TrainSample(
        draft.token_ids,
        [lp if m else 0.0 for lp, m in zip(logprobs, draft.loss_mask, strict=True)],
        draft.loss_mask,
        advantage,
    )


def completion_logprob(trainer: PolicyTrainer, s: TrainSample) -> float:
    return sum(lp for lp, m in zip(trainer.logprobs([s])[0], s.loss_mask, strict=True) if m)


def batch(trainer: PolicyTrainer) -> list[TrainSample]:
    """Four samples of different lengths (so micro-batches pad), with off-policy behaviour logprobs."""
    out = [
        sample(trainer, "Guess the number.", "5", 1.0),
        sample(trainer, "I am thinking of a number between 1 and 10.", "I guess 7, is it correct?", -0.5),
        sample(trainer, "Hello!", "How are you today?", 0.8),
        sample(trainer, "What is two plus two?", "Two plus two is four.", -1.3),
    ]
    for k, s in enumerate(out):  # shift the behaviour so ratios differ from 1 and clipping can happen
        s.behaviour_logprobs = [
            b - 0.05 * ((k + i) % 5 - 2) if m else 0.0
            for i, (b, m) in enumerate(zip(s.behaviour_logprobs, s.loss_mask, strict=True))
        ]
    return out


def params(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}


def assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        torch.testing.assert_close(value, b[name], atol=atol, rtol=0, msg=name)


def test_training_raises_the_rewarded_completion_and_lowers_the_punished(tiny_model: Path) -> None:
    trainer = make_trainer(tiny_model)
    good = sample(trainer, "Guess the number.", "I guess 5.", 1.0)
    bad = sample(trainer, "Guess the number.", "Hello there", -1.0)
    before = completion_logprob(trainer, good), completion_logprob(trainer, bad)
    for step in range(3):
        metrics = trainer.train_step([good, bad])
        assert trainer.version == step + 1
    after = completion_logprob(trainer, good), completion_logprob(trainer, bad)
    assert after[0] > before[0] + 0.5
    assert after[1] < before[1] - 0.5
    assert metrics["sequences"] == 2
    assert metrics["tokens"] == sum(good.loss_mask) + sum(bad.loss_mask)
    assert metrics["grad_norm"] > 0 and metrics["seconds"] > 0
    assert metrics["ratio_max"] > 1.0  # behaviour logprobs stayed those of version 0


def test_all_zero_advantages_count_but_change_nothing(tiny_model: Path) -> None:
    trainer = make_trainer(tiny_model)
    samples = [sample(trainer, "Hello!", "How are you?", 0.0), sample(trainer, "Hello!", "Fine.", 0.0)]
    before = params(trainer)
    metrics = trainer.train_step(samples)
    assert trainer.version == 1
    assert metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0 and metrics["sequences"] == 2
    assert_same_params(before, params(trainer), atol=0.0)


@pytest.mark.parametrize(
    "loss",
    [
        LossConfig(kind="ppo_clip", clip_low=0.02, clip_high=0.02),
        LossConfig(kind="tis", aggregation="seq_mean"),
        LossConfig(kind="topr", aggregation="token_sum_norm", norm_length=64, kl_coef=0.1, entropy_coef=0.01),
    ],
    ids=["ppo_clip", "tis-seq_mean", "topr-token_sum_norm-kl-entropy"],
)
def test_micro_batching_does_not_change_the_step(tiny_model: Path, loss: LossConfig) -> None:
    whole = make_trainer(tiny_model, CONFIG.model_copy(update={"loss": loss, "micro_batch": 4}))
    split = make_trainer(tiny_model, CONFIG.model_copy(update={"loss": loss, "micro_batch": 1}))
    samples = batch(whole)
    # right padding in a micro-batch of 4 leaves every real token's logprob as it is alone
    torch.testing.assert_close(
        torch.tensor([lp for row in whole.logprobs(samples) for lp in row]),
        torch.tensor([lp for row in split.logprobs(samples) for lp in row]),
        atol=1e-5,
        rtol=0,
    )
    a, b = whole.train_step(samples), split.train_step(samples)
    for key in ("loss", "grad_norm", "clip_frac", "kl_rollout_trainer", "ratio_max", "tokens", "entropy"):
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    assert 0 < a["clip_frac"] < 1 or loss.kind != "ppo_clip"
    # Adam's first step is lr * g / (|g| + eps): a gradient element that is ~0 turns float32 summation-order
    # noise into visible changes, so a few elements differ by ~1e-5 (1% of lr). A mis-weighted micro-batch
    # changes the direction of the whole update (differences of the order of lr); grad_norm above catches scale.
    assert_same_params(params(whole), params(split), atol=5e-5)


@pytest.mark.parametrize("last_layers", [0, 1], ids=["all-trained", "last-block-only"])
def test_checkpoint_resumes_exactly(tiny_model: Path, tmp_path: Path, last_layers: int) -> None:
    config = CONFIG.model_copy(update={"train_last_layers": last_layers})
    original = make_trainer(tiny_model, config)
    samples = batch(original)
    original.train_step(samples[:2])
    original.save_checkpoint(tmp_path / "ckpt")
    original.save_checkpoint(tmp_path / "ckpt")  # replacing an existing checkpoint works
    continued = original.train_step(samples[2:])

    resumed = make_trainer(tiny_model, config)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.version == 1
    state = resumed.optimizer.state_dict()["state"]
    assert state and all(float(s["step"]) == 1 for s in state.values())
    again = resumed.train_step(samples[2:])
    assert resumed.version == original.version == 2
    assert again["loss"] == pytest.approx(continued["loss"], abs=1e-7)
    assert again["grad_norm"] == pytest.approx(continued["grad_norm"], rel=1e-6)
    assert_same_params(params(original), params(resumed), atol=1e-7)
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temp dir left behind
    if last_layers:  # only the trained block and the norm are saved, and only they ever changed
        assert (tmp_path / "ckpt" / "trainable.safetensors").exists()
        assert not (tmp_path / "ckpt" / "model.safetensors").exists()
        fresh = make_trainer(tiny_model, config)
        frozen = [n for n, p in original.unwrapped_model.named_parameters() if not p.requires_grad]
        assert frozen and all(
            torch.equal(
                dict(original.unwrapped_model.named_parameters())[n], dict(fresh.unwrapped_model.named_parameters())[n]
            )
            for n in frozen
        )


def logits(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def test_exported_weights_load_and_apply_in_place(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = make_trainer(tiny_model)
    samples = batch(trainer)
    trainer.train_step(samples)
    ids = samples[1].token_ids
    expected = logits(trainer.unwrapped_model, ids)

    trainer.export_weights(tmp_path / "v1", "float32")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "v1")
    assert AutoTokenizer.from_pretrained(tmp_path / "v1").encode("Hello!") == trainer.tokenizer.encode("Hello!")
    torch.testing.assert_close(logits(loaded, ids), expected, atol=1e-5, rtol=0)

    engine_model = AutoModelForCausalLM.from_pretrained(tiny_model)  # version 0, as a decode engine holds it
    assert not torch.allclose(logits(engine_model, ids), expected, atol=1e-3)
    apply_weights(engine_model, tmp_path / "v1")
    torch.testing.assert_close(logits(engine_model, ids), expected, atol=1e-5, rtol=0)

    trainer.export_weights(tmp_path / "v1-bf16", torch.bfloat16)
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "v1-bf16").dtype == torch.bfloat16
    apply_weights(engine_model, tmp_path / "v1-bf16")
    assert engine_model.dtype == torch.float32  # the model keeps its dtype; values are rounded through bf16
    torch.testing.assert_close(logits(engine_model, ids), expected, atol=0.1, rtol=0)


def test_apply_weights_rejects_foreign_tensors(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    save_file({"not.a.weight": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="does not have"):
        apply_weights(model, tmp_path)
    first = next(iter(model.state_dict()))
    save_file({first: model.state_dict()[first].clone()}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="lacks"):
        apply_weights(model, tmp_path)


def record(
    group: str,
    reward: float | None,
    *,
    status: TrajectoryStatus = TrajectoryStatus.COMPLETED,
    temperature: float = 1.0,
    context: bool = True,
) -> TrajectoryRecord:
    ctx = TurnContext(
        token_ids=[1, 2, 3, 4, 5],
        logprobs=[0.0, 0.0, -0.5, 0.0, -0.7],
        loss_mask=[0, 0, 1, 0, 1],
        turn_versions=[3, 2],
        turn_spans=[(2, 3), (4, 5)],
    )
    return TrajectoryRecord(
        workflow_id=f"wf-{group}-{reward}",
        request=TrajectoryRequest(group=group, sampling=SamplingParams(temperature=temperature)),
        status=status,
        reward=reward,
        first_observation="",
        turns=[],
        context=ctx if context else None,
        env_recoveries=0,
    )


def test_samples_from_records_uses_group_advantages() -> None:
    records = [record("a", 1.0), record("b", 0.3), record("a", 0.0, temperature=0.0), record("b", 0.3, temperature=0.7)]
    grpo = samples_from_records(records, normalize_std=True)
    assert [s.advantage for s in grpo] == pytest.approx([1.0, 0.0, -1.0, 0.0], abs=1e-5)  # (r - 0.5) / 0.5
    dr = samples_from_records(records, normalize_std=False)
    assert [s.advantage for s in dr] == pytest.approx([0.5, 0.0, -0.5, 0.0])
    first = grpo[0]
    assert first.token_ids == [1, 2, 3, 4, 5] and first.loss_mask == [0, 0, 1, 0, 1]
    assert first.behaviour_logprobs == [0.0, 0.0, -0.5, 0.0, -0.7]
    assert first.version == 2  # the oldest turn's policy
    assert [s.temperature for s in grpo] == [1.0, 1.0, 1.0, 0.7]  # greedy (0) recorded T = 1 logprobs


@pytest.mark.parametrize(
    "bad",
    [
        record("a", None),
        record("a", 1.0, context=False),
        record("a", 1.0, status=TrajectoryStatus.FAILED),
    ],
)
def test_samples_from_records_refuses_unscored_trajectories(bad: TrajectoryRecord) -> None:
    with pytest.raises(ValueError):
        samples_from_records([record("a", 1.0), bad], normalize_std=True)


@pytest.mark.parametrize(
    ("setting", "cpu", "bf16"),
    [
        ("auto", CpuInfo("AVX2", frozenset({"avx2"})), False),  # emulated bf16: autocast stays off
        ("auto", CpuInfo("AVX512", frozenset({"amx_bf16"})), True),
        ("off", CpuInfo("AVX512", frozenset({"amx_bf16"})), False),
    ],
)
def test_autocast_follows_the_cpu_and_is_reported(tiny_model: Path, setting: str, cpu: CpuInfo, bf16: bool) -> None:
    config = CONFIG.model_copy(update={"autocast": setting})
    trainer = PolicyTrainer(tiny_model, config, seed=0, cpu=cpu)
    assert trainer.autocast.bf16 is bf16 and trainer.autocast.reason
    metrics = trainer.train_step([sample(trainer, "Guess the number.", "5", 1.0)])
    assert metrics["autocast_bf16"] == (1.0 if bf16 else 0.0)
    # a later step may switch the setting; the trainer re-decides for the same CPU
    flipped = trainer.train_step(
        [sample(trainer, "Guess.", "5", 1.0)], config.model_copy(update={"autocast": "bf16" if not bf16 else "off"})
    )
    assert flipped["autocast_bf16"] == (0.0 if bf16 else 1.0)


def test_train_sample_is_validated() -> None:
    with pytest.raises(ValueError, match="first token"):
        TrainSample([1, 2], [-0.1, -0.2], [1, 1], 1.0)
    with pytest.raises(ValueError, match="aligned"):
        TrainSample([1, 2], [0.0], [0, 1], 1.0)


async def test_teacher_forced_logprobs_match_the_engine(tiny_model: Path) -> None:
    from trajflow.rl.chat import append_user
    from trajflow.rl.engines.hf import HFEngine

    trainer = make_trainer(tiny_model)
    engine = HFEngine(tiny_model, max_batch=1)
    await engine.start()
    try:
        _, prompt = append_user(TurnContext(), trainer.tokenizer, "Guess the number between 1 and 10.", "Play well.")
        for temperature in (1.0, 0.7):
            completion = await engine.generate(prompt, SamplingParams(temperature=temperature, max_new_tokens=16))
            ids = prompt + completion.token_ids
            s = TrainSample(ids, [0.0] * len(ids), [0] * len(ids), 0.0, temperature=temperature)
            ours = trainer.logprobs([s])[0][len(prompt) :]
            assert ours == pytest.approx(completion.logprobs, abs=1e-4)
    finally:
        await engine.close()
