"""Held-out success by step (`[train.eval] every`): the config, which versions get evaluated and when, holds on
versions in the store, resumption from the run directory's record, and what reaches summary.json, the trackers and
the plot. The evals themselves are fakes here; tests/integration/test_train_cli.py runs them on the stack."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from trajflow.cli.commands.eval_curve import CURVE_FILE, EvalCurve, due, read_points
from trajflow.cli.commands.plots import reward_figure
from trajflow.cli.commands.train import summarise, verdict
from trajflow.contracts.runs import CurvePoint, EpisodeEval, EvalResult
from trajflow.contracts.training import EvalConfig, StepRecord, TrainingCounters, TrainingResult, TrainingRunConfig
from trajflow.contracts.trajectory import TrajectoryStatus
from trajflow.infra.policies import PolicyStore
from trajflow.infra.store import LocalStore
from trajflow.observability.tracking.base import Fanout, curve_scalars


def test_every_defaults_to_before_and_after_only_and_during_episodes_to_at_most_20() -> None:
    assert EvalConfig().every == 0
    assert EvalConfig(episodes=50).curve_episodes() == 20
    assert EvalConfig(episodes=8).curve_episodes() == 8
    assert EvalConfig(episodes=50, during_episodes=5).curve_episodes() == 5


def test_during_episodes_are_a_subset_and_every_needs_episodes() -> None:
    with pytest.raises(ValidationError, match="must not exceed eval.episodes"):
        EvalConfig(episodes=10, during_episodes=11)
    with pytest.raises(ValidationError, match="needs held-out episodes"):
        EvalConfig(episodes=0, every=2)
    with pytest.raises(ValidationError):
        EvalConfig(every=-1)


def test_due_versions_are_the_multiples_below_the_last_step() -> None:
    assert due(3, 18, 17) == [3, 6, 9, 12, 15]
    assert due(3, 18, 18) == [3, 6, 9, 12, 15]  # 18 is the eval after training's
    assert due(1, 4, 2) == [1, 2]
    assert due(2, 10, 1) == []
    assert due(0, 10, 9) == []


class FakeHolds:
    """A run's holds: `pruned` versions' weights are gone already; `prune(newest)` is the trainer's prune, which keeps
    the held versions."""

    def __init__(self, pruned: frozenset[int] = frozenset(), held: frozenset[int] = frozenset()) -> None:
        self.pruned = set(pruned)
        self.now: set[int] = set(held)
        self.log: list[str] = []

    def hold(self, version: int) -> bool:
        self.log.append(f"hold {version}")
        if version in self.pruned:
            self.now.discard(version)
            return False
        self.now.add(version)
        return True

    def reserve(self, version: int) -> None:
        self.log.append(f"reserve {version}")
        self.now.add(version)

    def prune(self, newest: int, keep: int = 2) -> None:
        self.pruned |= {v for v in range(1, newest - keep + 1) if v not in self.now}

    def release(self, version: int) -> None:
        self.log.append(f"release {version}")
        self.now.discard(version)

    def held(self) -> set[int]:
        return set(self.now)


class Recorder:
    """A tracker that keeps what it is given."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []

    def config(self, config) -> None: ...

    def scalars(self, step: int, values) -> None:
        self.logged.append((step, dict(values)))

    def close(self) -> None: ...


def an_eval(version: int, wins: list[bool], seconds: float = 2.0) -> EvalResult:
    rows = [
        EpisodeEval(
            seed=1000 + i, task="t", greedy_status=TrajectoryStatus.COMPLETED, greedy_reward=float(w), greedy_win=w
        )
        for i, w in enumerate(wins)
    ]
    rate = sum(wins) / len(wins)
    return EvalResult(
        version=version, episodes=len(wins), scored=len(wins), not_completed=0, success_rate=rate,
        mean_reward=rate, seconds=seconds, per_episode=rows,
    )  # fmt: skip


def a_curve(
    tmp_path: Path, holds: FakeHolds, evaluated: list[int], said: list[str], **kw
) -> tuple[EvalCurve, Recorder]:
    async def run_eval(version: int) -> EvalResult:
        evaluated.append(version)
        if version in kw.get("failing", ()):
            raise RuntimeError("the stack went away")
        return an_eval(version, [True, version % 2 == 0, False, False])

    tracker = Recorder()
    curve = EvalCurve(
        run_eval, every=kw.get("every", 2), steps=kw.get("steps", 10), episodes=4, run_dir=tmp_path,
        trackers=Fanout([("rec", tracker)], said.append), say=said.append, holds=holds, defer=kw.get("defer", False),
    )  # fmt: skip
    return curve, tracker


async def test_each_due_version_is_held_evaluated_once_in_order_and_recorded(tmp_path: Path) -> None:
    holds, evaluated, said = FakeHolds(), [], []
    curve, tracker = a_curve(tmp_path, holds, evaluated, said)
    assert holds.now == {2, 4, 6, 8}  # every due version held before the run starts
    curve.seen(1)
    curve.seen(5)  # a poll that skipped steps: 2 and 4 are due
    curve.seen(4)
    curve.seen(5)
    points = await curve.close(None, None)
    assert evaluated == [2, 4] and [p.version for p in points] == [2, 4]
    assert holds.now == set()  # 6 and 8 were never reached: released at the end
    assert holds.log == [*(f"reserve {v}" for v in (2, 4, 6, 8)), "hold 2", "hold 4", "release 2", "release 4",
                         "release 6", "release 8"]  # fmt: skip
    assert points[0] == CurvePoint(version=2, successes=2, episodes=4, rate=0.5, mean_reward=0.5, seconds=2.0)
    assert read_points(tmp_path) == points
    assert [step for step, _ in tracker.logged] == [2, 4]
    assert tracker.logged[0][1] == {"eval_curve/success_rate": 0.5, "eval_curve/mean_reward": 0.5}
    assert any(line.startswith("held-out v4: greedy success 2/4 (50%)") for line in said)


async def test_deferred_evals_wait_for_the_end_of_training_holding_their_versions(tmp_path: Path) -> None:
    holds, evaluated, said = FakeHolds(), [], []
    curve, _ = a_curve(tmp_path, holds, evaluated, said, defer=True)
    curve.seen(5)
    curve.ended(7)
    await asyncio.sleep(0.05)
    assert evaluated == [] and {2, 4, 6} <= holds.now  # nothing evaluated while the run trained; its versions kept
    points = await curve.close(None, None)
    assert evaluated == [2, 4, 6] and [p.version for p in points] == [2, 4, 6]
    assert holds.now == set()
    assert any(line.startswith("held-out v6: greedy success 2/4 (50%)") and "after training" in line for line in said)


async def test_the_run_ending_awaits_the_eval_in_flight(tmp_path: Path) -> None:
    gate, finished = asyncio.Event(), []

    async def run_eval(version: int) -> EvalResult:
        await gate.wait()
        finished.append(version)
        return an_eval(version, [True])

    curve = EvalCurve(
        run_eval, every=1, steps=5, episodes=1, run_dir=tmp_path, trackers=Fanout([], print), say=print,
        holds=FakeHolds(),
    )  # fmt: skip
    curve.seen(2)
    closing = asyncio.create_task(curve.close(None, None))
    await asyncio.sleep(0.05)
    assert not closing.done() and finished == []
    gate.set()
    assert [p.version for p in await asyncio.wait_for(closing, 5)] == [1, 2] and finished == [1, 2]


async def test_a_reattach_evaluates_only_what_is_missing_and_says_what_was_pruned(tmp_path: Path) -> None:
    first, said = [], []
    curve, _ = a_curve(tmp_path, FakeHolds(), first, said)
    curve.seen(4)
    await curve.close(None, None)
    assert first == [2, 4]
    # the process died; versions 6 (pruned before anyone held it) and 8 (held by the dead process) are behind
    holds, again = FakeHolds(pruned=frozenset({6}), held=frozenset({4, 8})), []
    curve, _ = a_curve(tmp_path, holds, again, said)
    assert holds.now == {6, 8}  # 4 was evaluated before: its leftover hold is released; 6 and 8 are reserved
    curve.seen(9)
    points = await curve.close(None, None)
    assert again == [8] and [p.version for p in points] == [2, 4, 8]
    assert "held-out v6: not evaluated, its weights are not in the store (pruned before it was held)" in said
    assert len((tmp_path / CURVE_FILE).read_text().splitlines()) == 3


async def test_a_reattach_to_a_run_stopped_early_releases_the_dead_clis_holds_above_its_end(tmp_path: Path) -> None:
    # the first CLI reserved every due version (2..8) and died after v2's eval; the run is stopped at v5
    holds, evaluated, said = FakeHolds(held=frozenset({4, 6, 8})), [], []
    (tmp_path / CURVE_FILE).write_text(CurvePoint.of(an_eval(2, [True])).model_dump_json() + "\n")
    curve, _ = a_curve(tmp_path, holds, evaluated, said)
    assert curve.reserved == []  # every due version was held or done already: nothing is this curve's own
    curve.seen(5)
    curve.ended(5)
    await curve.close(None, None)
    assert evaluated == [4] and holds.now == set()  # 6 and 8 will never be published: no hold is left on them


async def test_a_version_the_trainer_publishes_and_prunes_between_two_polls_is_still_evaluated(tmp_path: Path) -> None:
    holds, evaluated, said = FakeHolds(), [], []
    curve, _ = a_curve(tmp_path, holds, evaluated, said, every=1, steps=4)
    holds.prune(3)  # v1, v2 and v3 published within one poll; the prune after v3 keeps v2, v3 and what is held
    curve.seen(3)
    points = await curve.close(None, None)
    assert evaluated == [1, 2, 3] and [p.version for p in points] == [1, 2, 3]
    assert not [line for line in said if "not evaluated" in line]


async def test_a_failed_eval_is_left_out_and_released(tmp_path: Path) -> None:
    holds, evaluated, said = FakeHolds(), [], []
    curve, _ = a_curve(tmp_path, holds, evaluated, said, failing={2})
    curve.seen(4)
    points = await curve.close(None, None)
    assert evaluated == [2, 4] and [p.version for p in points] == [4] and holds.now == set()
    assert any(line.startswith("held-out v2: eval failed (RuntimeError: the stack went away)") for line in said)


async def test_the_evals_before_and_after_join_the_curve_on_its_seeds(tmp_path: Path) -> None:
    curve, tracker = a_curve(tmp_path, FakeHolds(), [], [], every=3, steps=6)
    curve.seen(6)
    before = an_eval(0, [False, False, True, False, True, True])  # 6 seeds: the curve reads its first 4
    after = an_eval(6, [True, True, True, False, False, False])
    points = await curve.close(before, after)
    assert [(p.version, p.successes, p.episodes) for p in points] == [(0, 1, 4), (3, 1, 4), (6, 3, 4)]
    assert points[0].seconds == 0.0  # a share of the eval before, not a timed eval of its own
    assert sorted(step for step, _ in tracker.logged) == [0, 3, 6]


def test_holds_keep_a_version_from_pruning_until_released(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    policies = PolicyStore(store, tmp_path / "cache")
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    policies.publish("r", 1, weights)
    policies.publish("r", 2, weights)
    assert policies.hold("r", 1) and policies.held("r") == {1}
    policies.publish("r", 3, weights)
    policies.publish("r", 4, weights)
    policies.prune("r", keep=2)
    assert policies.versions("r") == [1, 3, 4]  # 2 pruned, 1 held
    policies.release("r", 1)
    policies.release("r", 1)  # twice: nothing
    policies.prune("r", keep=2)
    assert policies.versions("r") == [3, 4] and policies.held("r") == set()
    assert not policies.hold("r", 2) and policies.held("r") == set()  # pruned already: no hold is left behind


def test_the_summary_and_the_plot_carry_the_curve() -> None:
    history = [StepRecord(step=s, time_s=10.0 * s, reward_mean=0.1 * s, trajectories=8, stale_dropped_total=0)
               for s in range(1, 5)]  # fmt: skip
    counters = TrainingCounters(completed=32, consumed=32)
    result = TrainingResult(run_id="r", version=4, counters=counters, wall_seconds=40.0, history=history)
    curve = [CurvePoint.of(an_eval(v, [True] * v + [False] * (4 - v))) for v in (0, 2, 4)]
    summary = summarise(TrainingRunConfig(), "r", result, 40.0, None, None, curve)
    data = summary.model_dump(mode="json")
    assert [(p["version"], p["successes"], p["episodes"], p["rate"]) for p in data["eval_curve"]] == [
        (0, 0, 4, 0.0),
        (2, 2, 4, 0.5),
        (4, 4, 4, 1.0),
    ]
    assert summarise(TrainingRunConfig(), "r", result, 40.0, None, None).eval_curve == []
    fig = reward_figure(summary)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    line = lines["held-out greedy success (4 seeds)"]
    assert np.asarray(line.get_xdata()).tolist() == [0, 2, 4]
    assert np.asarray(line.get_ydata()).tolist() == [0.0, 0.5, 1.0]
    assert curve_scalars(curve[1]) == {"eval_curve/success_rate": 0.5, "eval_curve/mean_reward": 0.5}


async def test_a_run_that_ends_early_gets_no_eval_during_training_at_its_last_version(tmp_path: Path) -> None:
    evaluated, said = [], []
    curve, _ = a_curve(tmp_path, FakeHolds(), evaluated, said, every=2, steps=10)
    curve.seen(3)
    curve.ended(6)  # stopped at v6: the eval after training is v6's
    after = an_eval(6, [True, True, False, False])
    points = await curve.close(None, after)
    assert evaluated == [2, 4] and [(p.version, p.seconds) for p in points] == [(2, 2.0), (4, 2.0), (6, 0.0)]


def test_the_verdict_draws_the_curve() -> None:
    history = [StepRecord(step=1, time_s=60.0, reward_mean=0.5, trajectories=8, stale_dropped_total=0)]
    result = TrainingResult(run_id="r", version=4, counters=TrainingCounters(), wall_seconds=60.0, history=history)
    curve = [CurvePoint.of(an_eval(v, [True] * (v // 2) + [False] * (4 - v // 2))) for v in (0, 2, 4)]  # 0, 1/4, 1/2
    before, after = an_eval(0, [False] * 4), an_eval(4, [True] * 4)
    line = verdict(summarise(TrainingRunConfig(), "r", result, 60.0, before, after, curve), Path("reward.png"))
    assert "held-out greedy success 0/4 (0%) -> 4/4 (100%), by step ▁▃▅ (v0..v4 on 4 seeds), mean reward" in line
    line = verdict(summarise(TrainingRunConfig(), "r", result, 60.0, before, after), Path("reward.png"))
    assert "by step" not in line
