"""trajflow.rl.updates and the trainer's step loop on the tiny random model (float32, CPU): epochs and mini-batches (the
number of optimizer updates, one version per step, a seeded shuffle), decoupled PPO's proximal logprobs taken
once per step (so its clip fires on later updates), the KL penalty's frozen reference (none without it), and the
entropy logged every step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.unit.test_rl_trainer import CONFIG, assert_same_params, batch, make_trainer, params, sample
from trajflow.contracts.training import LossConfig
from trajflow.rl import updates
from trajflow.rl.trainer import PolicyTrainer
from trajflow.rl.updates import token_entropy, update_plan


def test_the_plan_has_every_sample_once_per_epoch_in_near_equal_mini_batches() -> None:
    plan = update_plan(10, epochs=3, mini_batches=4, seed=0, version=5)
    assert [len(p) for p in plan] == [3, 3, 2, 2] * 3
    for epoch in range(3):
        assert sorted(i for p in plan[4 * epoch : 4 * epoch + 4] for i in p) == list(range(10))
    assert plan[:4] != plan[4:8]  # each epoch reshuffles
    assert plan == update_plan(10, epochs=3, mini_batches=4, seed=0, version=5)  # a rerun shuffles the same
    assert plan != update_plan(10, epochs=3, mini_batches=4, seed=0, version=6)  # the next step differently
    assert plan != update_plan(10, epochs=3, mini_batches=4, seed=1, version=5)
    assert update_plan(4, epochs=2, mini_batches=1, seed=0, version=0) == [[0, 1, 2, 3]] * 2  # one: kept in order
    with pytest.raises(ValueError, match="only 3 samples"):
        update_plan(3, epochs=1, mini_batches=4, seed=0, version=0)


def test_entropy_of_known_distributions() -> None:
    # rows: uniform over 4 (H = ln 4), [1/2, 1/4, 1/4, 0+] (H = 1.5 ln 2), one certain token (H = 0)
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [math.log(2), 0.0, 0.0, -1e4], [50.0, 0.0, 0.0, 0.0]]])
    valid = torch.tensor([[True, True, True]])
    entropy = token_entropy(logits, torch.logsumexp(logits, -1), valid)
    assert entropy.tolist() == [
        [pytest.approx(math.log(4)), pytest.approx(1.5 * math.log(2)), pytest.approx(0.0, abs=1e-12)]
    ]
    masked = token_entropy(logits, torch.logsumexp(logits, -1), torch.tensor([[False, True, False]]))
    assert masked.tolist() == [[0.0, pytest.approx(1.5 * math.log(2)), 0.0]]


def count_forwards(trainer: PolicyTrainer) -> list[int]:
    calls = [0]
    trainer.unwrapped_model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_epochs_and_mini_batches_make_that_many_updates_and_one_version(tiny_model: Path) -> None:
    config = CONFIG.model_copy(update={"ppo_epochs": 2, "mini_batches": 2, "micro_batch": 8})
    trainer = make_trainer(tiny_model, config)
    samples = batch(trainer)
    calls = count_forwards(trainer)
    metrics = trainer.train_step(samples)
    assert trainer.version == 1 and metrics["updates"] == 4.0
    assert all(float(s["step"]) == 4 for s in trainer.optimizer.state_dict()["state"].values())
    assert calls[0] == 4  # one forward per update: ppo_clip needs no proximal pass
    assert metrics["sequences"] == 4 and metrics["tokens"] == sum(sum(s.loss_mask) for s in samples)
    trainer.train_step(samples)
    assert trainer.version == 2


def test_decoupled_ppo_takes_the_proximal_policy_once_and_clips_on_later_updates(tiny_model: Path) -> None:
    # On-policy samples (behaviour = the trainer's own logprobs): at the start of the step r' = 1 and w = 1, so
    # with one update nothing clips. With two epochs the second update's r' is against the policy at the start
    # of the step, which the first update moved: the clip fires. A proximal policy re-taken before every update
    # would keep r' = 1 and clip_frac 0.
    loss = LossConfig(kind="decoupled_ppo", clip_low=0.02, clip_high=0.02)
    one = make_trainer(tiny_model, CONFIG.model_copy(update={"loss": loss, "lr": 1e-2, "micro_batch": 8}))
    good = [sample(one, "Guess the number.", "I guess 5.", 1.0), sample(one, "Guess the number.", "Hello there", -1.0)]
    assert one.train_step(good)["clip_frac"] == 0.0

    two = make_trainer(tiny_model, one.config.model_copy(update={"ppo_epochs": 2}))
    calls = count_forwards(two)
    metrics = two.train_step(good)
    assert metrics["updates"] == 2 and two.version == 1
    assert calls[0] == 1 + 2  # the proximal pass before the first update, then one per update
    assert 0.0 < metrics["clip_frac"] <= 0.5  # only the second update's tokens can clip: half of them at most


def test_micro_batching_is_exact_inside_mini_batches(tiny_model: Path) -> None:
    config = CONFIG.model_copy(update={"mini_batches": 2, "ppo_epochs": 2})
    whole = make_trainer(tiny_model, config.model_copy(update={"micro_batch": 4}))
    split = make_trainer(tiny_model, config.model_copy(update={"micro_batch": 1}))
    samples = batch(whole)
    a, b = whole.train_step(samples), split.train_step(samples)
    for key in ("loss", "grad_norm", "kl_rollout_trainer", "entropy", "tokens"):
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    assert_same_params(params(whole), params(split), atol=1e-4)  # Adam-noise tolerance: see test_rl_trainer.py


def test_the_shuffle_is_seeded(tiny_model: Path) -> None:
    config = CONFIG.model_copy(update={"mini_batches": 2})
    first, again, other = (make_trainer(tiny_model, config.model_copy(update={"seed": s})) for s in (7, 7, 9))
    # seeds 7 and 9 split the 4 samples into {0, 1} + {2, 3} and {1, 2} + {0, 3}
    plans = [update_plan(4, epochs=1, mini_batches=2, seed=s, version=0) for s in (7, 9)]
    assert [sorted(map(sorted, p)) for p in plans] == [[[0, 1], [2, 3]], [[0, 3], [1, 2]]]
    samples = batch(first)
    for trainer in (first, again, other):
        trainer.train_step(samples)
    assert_same_params(params(first), params(again), atol=0.0)
    with pytest.raises(AssertionError):
        assert_same_params(params(first), params(other), atol=1e-4)


def test_no_reference_without_a_kl_penalty(tiny_model: Path) -> None:
    trainer = make_trainer(tiny_model)
    assert trainer.reference is None
    metrics = trainer.train_step(batch(trainer))
    assert "kl_ref" not in metrics
    with pytest.raises(ValueError, match="cannot switch the KL penalty on"):
        trainer.train_step(batch(trainer), CONFIG.model_copy(update={"loss": LossConfig(kl_coef=0.1)}))


@pytest.mark.parametrize("last_layers", [0, 1], ids=["all-trained", "last-block-only"])
def test_the_reference_is_the_initial_model_and_the_penalty_pulls_towards_it(
    tiny_model: Path, last_layers: int
) -> None:
    def trainer(kl_coef: float) -> PolicyTrainer:
        loss = LossConfig(kind="tis", kl_coef=kl_coef, kl_estimator="k3")
        return make_trainer(tiny_model, CONFIG.model_copy(update={"loss": loss, "train_last_layers": last_layers}))

    free, held = trainer(1e-9), trainer(1.0)
    trainable = sum(p.numel() for p in free.unwrapped_model.parameters() if p.requires_grad)
    assert free.reference is not None and free.reference.numel == trainable  # a copy of the trainable part only
    if last_layers:
        assert trainable < sum(p.numel() for p in free.unwrapped_model.parameters()) / 2
    samples = batch(free)
    first = free.train_step(samples)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the policy is still the reference
    for _ in range(4):
        last_free, last_held = free.train_step(samples), held.train_step(samples)
    assert last_free["kl_ref"] > 2 * last_held["kl_ref"] > 0
    # the reference's logprobs are the untrained model's
    fresh = make_trainer(tiny_model)
    data = free.collate(samples)
    ref = updates.next_token_logprobs(free.logits(data, free.reference), data.ids)[0]
    with torch.no_grad():
        initial = updates.next_token_logprobs(fresh.logits(fresh.collate(samples)), data.ids)[0]
    torch.testing.assert_close(ref, initial, atol=1e-5, rtol=0)


def test_entropy_is_logged_every_step_at_the_sampling_temperature(tiny_model: Path) -> None:
    trainer = make_trainer(tiny_model, CONFIG.model_copy(update={"micro_batch": 1}))
    samples = batch(trainer)
    for s in samples:
        s.temperature = 0.7
    expected, count = 0.0, 0
    with torch.no_grad():
        for s in samples:
            logits = trainer.unwrapped_model(input_ids=torch.tensor([s.token_ids])).logits[0, :-1].double() / 0.7
            logp = torch.log_softmax(logits, -1)
            for t, m in enumerate(s.loss_mask[1:]):
                if m:
                    expected -= float((logp[t].exp() * logp[t]).sum())
                    count += 1
    metrics = trainer.train_step(samples)
    assert metrics["entropy"] == pytest.approx(expected / count, rel=1e-5)
    assert trainer.train_step(samples)["entropy"] > 0


def test_an_entropy_bonus_raises_the_entropy(tiny_model: Path) -> None:
    def entropy_after(coef: float) -> float:
        loss = LossConfig(kind="tis", entropy_coef=coef)
        trainer = make_trainer(tiny_model, CONFIG.model_copy(update={"loss": loss}))
        samples = [sample(trainer, "Hello!", "How are you?", 0.0), sample(trainer, "Guess.", "I guess 5.", 0.0)]
        for _ in range(3):
            trainer.train_step(samples)
        return trainer.train_step(samples)["entropy"]

    # zero advantages: only the bonus moves the policy (no bonus: nothing moves at all)
    assert entropy_after(1.0) > entropy_after(0.0) + 1e-3


def test_mini_batches_beyond_the_batch_are_refused(tiny_model: Path) -> None:
    trainer = make_trainer(tiny_model, CONFIG.model_copy(update={"mini_batches": 3}))
    with pytest.raises(ValueError, match="mini_batches = 3"):
        trainer.train_step(batch(trainer)[:2])
    assert trainer.version == 0


def test_one_update_is_the_step_of_before(tiny_model: Path) -> None:
    # defaults (one epoch, one mini-batch): no shuffle, no extra pass, and decoupled_ppo at r' = 1
    a = make_trainer(tiny_model, CONFIG.model_copy(update={"loss": LossConfig(kind="decoupled_ppo", tis_cap=10.0)}))
    b = make_trainer(tiny_model, CONFIG.model_copy(update={"loss": LossConfig(kind="tis", tis_cap=10.0)}))
    samples = batch(a)
    calls = count_forwards(a)
    ma, mb = a.train_step(samples), b.train_step(samples)
    assert calls[0] == 1 and ma["updates"] == 1
    # at r' = 1 decoupled PPO's gradient is capped-IS REINFORCE's (their loss values differ: -w r' A, -w A logp)
    assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-5) and ma["is_weight_mean"] == pytest.approx(
        mb["is_weight_mean"]
    )
    assert_same_params(params(a), params(b), atol=5e-5)  # Adam turns float noise into ~1e-5: see test_rl_trainer.py


def test_a_resumed_trainer_keeps_the_initial_model_as_its_reference(tiny_model: Path, tmp_path: Path) -> None:
    # the reference is snapshotted when the trainer is built, before a checkpoint is loaded into it
    config = CONFIG.model_copy(update={"loss": LossConfig(kind="tis", kl_coef=0.5), "mini_batches": 2, "ppo_epochs": 2})
    original = make_trainer(tiny_model, config)
    samples = batch(original)
    original.train_step(samples)
    original.save_checkpoint(tmp_path / "ckpt")
    continued = original.train_step(samples)
    resumed = make_trainer(tiny_model, config)
    resumed.load_checkpoint(tmp_path / "ckpt")
    again = resumed.train_step(samples)
    assert again["kl_ref"] == pytest.approx(continued["kl_ref"], rel=1e-5) and continued["kl_ref"] > 0
    assert again["loss"] == pytest.approx(continued["loss"], abs=1e-6)
    assert_same_params(params(original), params(resumed), atol=1e-6)


def test_logits_start_at_the_first_loss_token_and_change_nothing_but_the_work(tiny_model: Path, monkeypatch) -> None:
    # A shared prompt before every completion: the LM head skips it. Every path that reads logits runs (the
    # proximal and reference pass, the entropy bonus, two updates) and must give the step that logits at every
    # position give, to float error.
    loss = LossConfig(kind="decoupled_ppo", kl_coef=0.1, entropy_coef=0.01)
    config = CONFIG.model_copy(update={"loss": loss, "ppo_epochs": 2, "micro_batch": 2})
    prompt = "You are playing a game. Guess the number between 1 and 10 within 4 turns; hints follow each guess."
    trained, first = {}, 0
    for every_position in (False, True):
        if every_position:
            monkeypatch.setattr(updates, "first_loss_column", lambda mask: 0)
        trainer = make_trainer(tiny_model, config)
        samples = [sample(trainer, prompt, c, a) for c, a in (("5", 1.0), ("I guess 7.", -0.5), ("Eight!", 0.8))]
        first = first or updates.first_loss_column(trainer.collate(samples).mask)
        widths: list[int] = []
        head = trainer.unwrapped_model.get_output_embeddings()
        head.register_forward_hook(lambda _m, _i, out, seen=widths: seen.append(out.shape[1]))
        metrics = trainer.train_step(samples)
        trained[every_position] = (metrics, params(trainer), widths)
    (cut, cut_params, cut_widths), (full, full_params, full_widths) = trained[False], trained[True]
    assert first > 10  # the prompt's tokens
    # the same forward passes in the same order, and the head never saw the prompt's positions
    assert len(cut_widths) == len(full_widths) and all(
        c <= f - first for c, f in zip(cut_widths, full_widths, strict=True)
    )
    for name in ("loss", "kl_ref", "entropy", "clip_frac", "ratio_mean", "kl_rollout_trainer"):
        assert cut[name] == pytest.approx(full[name], rel=1e-5, abs=1e-7), name
    # AdamW divides by the gradient's running RMS, so a weight whose gradient is near zero moves by up to lr
    # whatever its float error: a few such weights differ by ~1e-5 here. A real difference would move whole
    # tensors by about lr (1e-3).
    assert_same_params(cut_params, full_params, atol=1e-4)


def test_first_loss_column_is_the_earliest_masked_token_of_any_row() -> None:
    mask = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1]], dtype=torch.float32)
    assert updates.first_loss_column(mask) == 1  # column c of the logprobs is token c + 1
    assert updates.first_loss_column(torch.zeros(2, 5)) == 0  # no loss token: every column
