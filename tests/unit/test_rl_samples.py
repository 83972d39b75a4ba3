"""trajflow.rl.samples with a train step's refs: the training workflow's groups, rewards and versions decide the
advantages (not the records' own group ids), refs must match their records, and bad records are refused."""

from __future__ import annotations

import pytest

from trajflow.contracts.records import TrajectoryRecord, TurnContext
from trajflow.contracts.training import TrainRef
from trajflow.contracts.trajectory import SamplingParams, TrajectoryRequest, TrajectoryStatus
from trajflow.rl.samples import samples_from_records


def record(wf: str, reward: float | None, *, group: str = "", context: bool = True) -> TrajectoryRecord:
    ctx = TurnContext(
        token_ids=[1, 2, 3], logprobs=[0.0, -0.5, -0.7], loss_mask=[0, 1, 1], turn_versions=[4], turn_spans=[(1, 3)]
    )
    return TrajectoryRecord(
        workflow_id=wf,
        request=TrajectoryRequest(group=group, sampling=SamplingParams(temperature=0.7)),
        status=TrajectoryStatus.COMPLETED,
        reward=reward,
        first_observation="",
        turns=[],
        context=ctx if context else None,
        env_recoveries=0,
    )


def ref(wf: str, group: str, reward: float, version: int = 1) -> TrainRef:
    return TrainRef(workflow_id=wf, trajectory_uri=f"mem://{wf}", group=group, reward=reward, policy_version=version)


def test_refs_decide_groups_rewards_and_versions() -> None:
    # The records share request.group "" (one group if taken from the records); the workflow split them in two.
    records = [record("a", 9.0), record("b", 9.0), record("c", 9.0), record("d", 9.0)]
    refs = [ref("a", "g1", 1.0, 2), ref("b", "g1", 0.0, 3), ref("c", "g2", 0.5), ref("d", "g2", 0.5)]
    samples = samples_from_records(records, normalize_std=False, refs=refs)
    assert [s.advantage for s in samples] == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert [s.version for s in samples] == [2, 3, 1, 1]
    assert all(s.temperature == 0.7 and s.loss_mask == [0, 1, 1] for s in samples)
    # without refs the records' own single "" group and rewards give no signal at all
    assert [s.advantage for s in samples_from_records(records, normalize_std=False)] == [0.0] * 4


def test_ref_reward_scores_a_record_without_one() -> None:
    samples = samples_from_records(
        [record("a", None), record("b", None)], normalize_std=True, refs=[ref("a", "g", 1.0), ref("b", "g", 0.0)]
    )
    assert [s.advantage for s in samples] == pytest.approx([1.0, -1.0], abs=1e-5)


@pytest.mark.parametrize(
    ("records", "refs", "match"),
    [
        ([record("a", 1.0)], [ref("a", "g", 1.0), ref("b", "g", 0.0)], "aligned"),
        ([record("a", 1.0), record("b", 0.0)], [ref("b", "g", 0.0), ref("a", "g", 1.0)], "names"),
        ([record("a", 1.0), record("b", 0.0, context=False)], [ref("a", "g", 1.0), ref("b", "g", 0.0)], "token"),
    ],
)
def test_bad_batches_are_refused(records: list[TrajectoryRecord], refs: list[TrainRef], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        samples_from_records(records, normalize_std=True, refs=refs)
