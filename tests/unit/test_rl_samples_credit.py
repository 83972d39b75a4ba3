"""trajflow.rl.samples with per-turn credit, on synthetic two-turn game records: `trajectory` mode is today's samples
exactly, `step_groups` and `tree` put each turn's advantage (worked out by hand) on that turn's completion tokens,
the step's refs decide the groups, and records credit cannot read are refused; the config refuses TOPR with it."""

from __future__ import annotations

import pytest

from trajflow.contracts.records import TrajectoryRecord, TurnContext
from trajflow.contracts.training import CreditConfig, LossConfig, TrainerConfig, TrainingRunConfig, TrainRef
from trajflow.contracts.trajectory import SamplingParams, TrajectoryRequest, TrajectoryStatus, TurnSummary
from trajflow.rl.samples import samples_from_records

PROMPT = [100, 101]
OBSERVATION_TOKENS = {"higher": [201], "lower": [202], "win": [203], "lose": [204, 205]}


def game(wf: str, reward: float, turns: list[tuple[list[int], str]], group: str = "g") -> TrajectoryRecord:
    """A trajectory: the prompt, then per turn its completion tokens (mask 1, logprob -0.1) and the observation's
    tokens (mask 0). Its layout for turns ([1, 2], "higher"), ([3], "win"): ids 100 101 | 1 2 | 201 | 3 | 203."""
    ids, mask, spans = list(PROMPT), [0, 0], []
    summaries = []
    for completion, observation in turns:
        spans.append((len(ids), len(ids) + len(completion)))
        ids += completion
        mask += [1] * len(completion)
        ids += OBSERVATION_TOKENS[observation]
        mask += [0] * len(OBSERVATION_TOKENS[observation])
        summaries.append(
            TurnSummary(
                action=str(completion),
                observation=observation,
                env_reward=0.0,
                policy_version=0,
                completion_tokens=len(completion),
                decode_pool="default",
            )
        )
    ctx = TurnContext(
        token_ids=ids,
        logprobs=[-0.1 if m else 0.0 for m in mask],
        loss_mask=mask,
        turn_versions=[0] * len(turns),
        turn_spans=spans,
    )
    return TrajectoryRecord(
        workflow_id=wf,
        request=TrajectoryRequest(group=group, sampling=SamplingParams(temperature=1.0)),
        status=TrajectoryStatus.COMPLETED,
        reward=reward,
        first_observation="Guess a number from 1 to 10.",
        turns=summaries,
        context=ctx,
        env_recoveries=0,
    )


# A won in two guesses, B lost; both heard "higher" after their first guess.
A = game("a", 1.0, [([5, 5], "higher"), ([8], "win")])
B = game("b", 0.0, [([3], "higher"), ([4, 4], "lose")])


def test_trajectory_mode_is_todays_samples() -> None:
    default = samples_from_records([A, B], normalize_std=True)
    explicit = samples_from_records([A, B], normalize_std=True, credit=CreditConfig(mode="trajectory"))
    assert default == explicit
    assert [s.advantage for s in default] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert all(s.token_advantages is None for s in default)


def test_step_groups_put_each_turns_advantage_on_its_completion_tokens() -> None:
    # gamma 0.5, omega 1, Dr. GRPO. Episode: (0.5, -0.5). Returns A (0.5, 1), B (0, 0).
    # Step group "Guess a number..." (both turn 0s): (0.5, 0) -> (0.25, -0.25); "higher" (both turn 1s):
    # (1, 0) -> (0.5, -0.5). A: (0.75, 1.0), B: (-0.75, -1.0).
    cfg = CreditConfig(mode="step_groups", step_weight=1.0, discount=0.5)
    a, b = samples_from_records([A, B], normalize_std=False, credit=cfg)
    # A's ids: 100 101 | 5 5 | 201 | 8 | 203
    assert a.token_advantages == pytest.approx([0, 0, 0.75, 0.75, 0, 1.0, 0])
    # B's ids: 100 101 | 3 | 201 | 4 4 | 204 205
    assert b.token_advantages == pytest.approx([0, 0, -0.75, 0, -1.0, -1.0, 0, 0])
    assert (a.advantage, b.advantage) == (0.5, -0.5)  # the trajectory's, kept beside


def test_tree_credits_the_turn_where_branches_part() -> None:
    # C branches from A at turn 2 (same first guess [5, 5], same "higher"), and loses. Group mean 1/2;
    # V(turn 1's node) = mean(A, C) = 1/2, so turn 1 gets 0 in both; turn 2: A 1 - 1/2, C 0 - 1/2. Dr. GRPO.
    c = game("c", 0.0, [([5, 5], "higher"), ([9], "lose")])
    a, c_sample = samples_from_records([A, c], normalize_std=False, credit=CreditConfig(mode="tree"))
    assert a.token_advantages == pytest.approx([0, 0, 0.0, 0.0, 0, 0.5, 0])
    assert c_sample.token_advantages == pytest.approx([0, 0, 0.0, 0.0, 0, -0.5, 0, 0])


def test_tree_without_shared_prefixes_is_the_trajectory_advantage_on_every_token() -> None:
    trajectory = samples_from_records([A, B], normalize_std=True)
    tree = samples_from_records([A, B], normalize_std=True, credit=CreditConfig(mode="tree"))
    for plain, credited in zip(trajectory, tree, strict=True):
        assert credited.token_advantages == [plain.advantage if m else 0.0 for m in plain.loss_mask]


def test_refs_decide_the_groups_of_per_turn_credit() -> None:
    # The records name groups of their own; the step's refs put them in one: the step_groups values above.
    apart = [r.model_copy(update={"request": r.request.model_copy(update={"group": r.workflow_id})}) for r in (A, B)]
    refs = [
        TrainRef(
            workflow_id=r.workflow_id,
            trajectory_uri="mem://x",
            group="g",
            reward=float(r.reward or 0),
            policy_version=0,
        )
        for r in apart
    ]
    cfg = CreditConfig(mode="step_groups", step_weight=1.0, discount=0.5)
    a, b = samples_from_records(apart, normalize_std=False, refs=refs, credit=cfg)
    assert a.token_advantages == pytest.approx([0, 0, 0.75, 0.75, 0, 1.0, 0])
    alone = samples_from_records(apart, normalize_std=False, credit=cfg)  # groups of one: no signal
    assert all(s.token_advantages == [0.0] * len(s.token_ids) for s in alone)


def test_records_credit_cannot_read_are_refused() -> None:
    assert A.context is not None
    stray = A.model_copy(update={"context": A.context.model_copy(update={"loss_mask": [0, 0, 1, 1, 1, 1, 0]})})
    with pytest.raises(ValueError, match="outside its turn spans"):
        samples_from_records([stray, B], normalize_std=True, credit=CreditConfig(mode="tree"))
    blind = A.model_copy(update={"turns": []})
    with pytest.raises(ValueError, match="observations"):
        samples_from_records([blind, B], normalize_std=True, credit=CreditConfig(mode="step_groups"))


def test_the_config_selects_credit_and_refuses_topr_with_it() -> None:
    run = TrainingRunConfig.model_validate({"trainer": {"credit": {"mode": "step_groups", "discount": 0.9}}})
    assert run.trainer.credit == CreditConfig(mode="step_groups", step_weight=1.0, discount=0.9)
    assert TrainerConfig().credit.mode == "trajectory"
    assert TrainerConfig(loss=LossConfig(kind="topr")).loss.kind == "topr"
    for mode in ("step_groups", "tree"):
        with pytest.raises(ValueError, match="topr"):
            TrainerConfig(loss=LossConfig(kind="topr"), credit=CreditConfig(mode=mode))
