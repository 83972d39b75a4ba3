"""trajflow.lab.bench.sandboxes's pure parts: percentiles, the TrajectoryWorkflow's reset budget replayed against
scripted failures, the removal of the bench's throwaway images, and the --json / report shape from made-up figures."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import docker.errors
import pytest
from temporalio.exceptions import ApplicationError

from trajflow.contracts import names
from trajflow.contracts.trajectory import EnvResetInput, EnvResetResult, EnvStepResult, SandboxHandle, TrajectoryRequest
from trajflow.lab.bench.sandboxes import Plan, quick_plan
from trajflow.lab.bench.sandboxes_builds import remove_images
from trajflow.lab.bench.sandboxes_chaos import Budget, Episode, chaos_figures, run_episode
from trajflow.lab.bench.sandboxes_report import Figures, percentile, render, summarize

ISSUE_KEYS = {
    "warm_reset_ms",
    "cold_reset_ms",
    "layer_build_s",
    "cached_build_s",
    "steps_per_s",
    "reset_success_rate",
}


def lost() -> ApplicationError:
    return ApplicationError("sandbox x lost", type=names.ERR_SANDBOX_LOST, non_retryable=True)


def start_failed() -> ApplicationError:
    return ApplicationError("cannot start", type=names.ERR_SANDBOX_START)


def env_fault() -> ApplicationError:
    return ApplicationError("UnknownEnv: nope", type=names.ERR_ENV, non_retryable=True)


class ScriptedOps:
    """EpisodeOps whose n-th reset / step raises the n-th scripted exception (None or past the end: succeeds)."""

    def __init__(self, resets: list[Exception | None] = [], steps: list[Exception | None] = []) -> None:  # noqa: B006
        self.resets, self.steps = list(resets), list(steps)
        self.reset_calls: list[list[str]] = []
        self.step_calls: list[tuple[str, str]] = []
        self.opened: list[str] = []
        self.closed: list[str] = []

    async def reset(self, replay: list[str]) -> EnvResetResult:
        n = len(self.reset_calls)
        self.reset_calls.append(replay)
        if n < len(self.resets) and self.resets[n] is not None:
            raise self.resets[n]  # type: ignore[misc]
        handle = SandboxHandle(sandbox_id=f"s{n}", container_id="c", host_queue="q", worker_id="w", image="i")
        self.opened.append(handle.sandbox_id)
        return EnvResetResult(handle=handle, observation="obs")

    async def step(self, handle: SandboxHandle, action: str) -> EnvStepResult:
        n = len(self.step_calls)
        self.step_calls.append((handle.sandbox_id, action))
        if n < len(self.steps) and self.steps[n] is not None:
            raise self.steps[n]  # type: ignore[misc]
        return EnvStepResult(observation="out", reward=0.0, terminated=False, truncated=False)

    async def close(self, handle: SandboxHandle) -> None:
        self.closed.append(handle.sandbox_id)


def play(ops: ScriptedOps, actions: list[str]) -> tuple[Episode, list[float]]:
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    ep = asyncio.run(run_episode(ops, actions, Budget(), sleep))
    assert sorted(ops.closed) == sorted(ops.opened), "every sandbox opened is closed exactly once"
    return ep, sleeps


def test_percentile_interpolates_between_ranks() -> None:
    xs = [float(x) for x in range(1, 101)]
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile(list(reversed(xs)), 0) == 1.0 and percentile(xs, 100) == 100.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_the_budget_is_the_trajectory_workflows(monkeypatch: pytest.MonkeyPatch) -> None:
    from trajflow.workflows import stubs

    seen: dict[str, object] = {}

    async def execute_activity(name: str, arg: object, **options: object) -> None:
        seen.update(options, name=name)

    monkeypatch.setattr(stubs.workflow, "execute_activity", execute_activity)
    asyncio.run(stubs.env_reset("p", EnvResetInput(trajectory_id="t", env_id="e", seed=0)))
    policy, budget = seen["retry_policy"], Budget()
    assert seen["name"] == names.ENV_RESET
    assert policy.maximum_attempts == budget.reset_attempts == 3  # type: ignore[attr-defined]
    assert policy.initial_interval.total_seconds() == budget.first_retry_s  # type: ignore[attr-defined]
    assert policy.backoff_coefficient == budget.backoff  # type: ignore[attr-defined]
    assert set(policy.non_retryable_error_types) == {names.ERR_ENV, names.ERR_BAD_REQUEST, names.ERR_PAYLOADS_TOO_LARGE}  # type: ignore[attr-defined]
    assert budget.max_recoveries == TrajectoryRequest.model_fields["max_env_recoveries"].default == 2


def test_an_episode_without_failures_uses_no_budget() -> None:
    ops = ScriptedOps()
    ep, sleeps = play(ops, ["a", "b"])
    assert ep.ok and ep.failures == [] and ep.retries == ep.recoveries == 0 and sleeps == []
    assert ops.step_calls == [("s0", "a"), ("s0", "b")]


def test_a_start_error_is_retried_by_the_activity_policy_with_temporals_intervals() -> None:
    ops = ScriptedOps(resets=[start_failed(), start_failed()])
    ep, sleeps = play(ops, ["a"])
    assert ep.ok and ep.retries == 2 and ep.recoveries == 0 and sleeps == [1.0, 2.0]
    assert ep.failures == ["env.reset:SandboxStartError"] * 2


def test_a_reset_failing_past_its_retries_spends_a_recovery_then_succeeds() -> None:
    ops = ScriptedOps(resets=[start_failed()] * 3)
    ep, sleeps = play(ops, ["a"])
    assert ep.ok and ep.retries == 2 and ep.recoveries == 1 and sleeps == [1.0, 2.0]
    assert len(ops.reset_calls) == 4


def test_a_lost_sandbox_is_not_retried_and_three_losses_spend_the_budget() -> None:
    ops = ScriptedOps(resets=[lost(), lost(), lost()])
    ep, sleeps = play(ops, ["a"])
    assert not ep.ok and not ep.env_fault and ep.retries == 0 and ep.recoveries == 3 and sleeps == []
    assert len(ops.reset_calls) == 3 and ops.step_calls == []
    assert ep.error is not None and "budget of 2 recoveries is spent" in ep.error


def test_two_losses_are_within_the_budget() -> None:
    ops = ScriptedOps(resets=[lost(), None], steps=[None, lost()])
    ep, _ = play(ops, ["a", "b"])
    assert ep.ok and ep.recoveries == 2
    assert ep.failures == ["env.reset:SandboxLost", "env.step:SandboxLost"]


def test_a_step_loss_reopens_a_fresh_sandbox_that_replays_the_actions_done() -> None:
    ops = ScriptedOps(steps=[None, lost()])
    ep, _ = play(ops, ["a", "b"])
    assert ep.ok and ep.recoveries == 1 and ep.retries == 0
    assert ops.reset_calls == [[], ["a"]]
    assert ops.step_calls == [("s0", "a"), ("s0", "b"), ("s1", "b")]
    assert ops.closed == ["s0", "s1"]


def test_losses_at_step_and_reset_share_one_budget() -> None:
    ops = ScriptedOps(resets=[None, lost(), None], steps=[lost(), lost()])
    ep, _ = play(ops, ["a"])
    assert not ep.ok and ep.recoveries == 3
    assert ep.failures == ["env.step:SandboxLost", "env.reset:SandboxLost", "env.step:SandboxLost"]


def test_an_env_fault_ends_the_episode_without_retry_or_recovery() -> None:
    ops = ScriptedOps(resets=[env_fault()])
    ep, sleeps = play(ops, ["a"])
    assert not ep.ok and ep.env_fault and ep.retries == ep.recoveries == 0 and sleeps == []
    assert len(ops.reset_calls) == 1


def test_any_other_exception_is_a_retryable_attempt() -> None:
    ep, sleeps = play(ScriptedOps(resets=[RuntimeError("docker hiccup")]), ["a"])
    assert ep.ok and ep.retries == 1 and sleeps == [1.0] and ep.failures == ["env.reset:RuntimeError"]


def test_chaos_figures_count_episodes() -> None:
    eps = [
        Episode(ok=True),
        Episode(ok=True, failures=["env.step:SandboxLost"], recoveries=1),
        Episode(ok=False, failures=["env.reset:SandboxLost"] * 3, recoveries=3, error="spent"),
        Episode(ok=True, failures=["env.reset:SandboxStartError"], retries=1),
    ]
    f = chaos_figures(eps)
    assert f["resets"] == 4 and f["first_attempt_failures"] == 3 and f["final_failures"] == 1
    assert f["retries"] == 1 and f["recoveries"] == 4 and f["failed_attempts"] == 5
    types = {"env.step:SandboxLost": 1, "env.reset:SandboxLost": 3, "env.reset:SandboxStartError": 1}
    assert f["failure_types"] == types
    assert f["success_rate"] == 0.75 and f["errors"] == ["spent"] and f["env_faults"] == 0


def test_the_full_plan_meets_the_issue_and_quick_skips_only_the_cold_base() -> None:
    full, quick = Plan(), quick_plan()
    assert full.warm_samples >= 100 and full.cold_samples >= 30 and full.chaos_resets >= 500
    assert full.kill_fraction == 0.1 and full.cold_layers == ("base", "runtime", "task") and not full.quick
    assert quick.quick and quick.cold_layers == ("runtime", "task") and quick.chaos_resets < full.chaos_resets
    assert Plan().step_action == "echo hi" and Plan(env_id="game:GuessTheNumber-v0-easy").step_action == "\\boxed{5}"


class FakeDocker:
    """Images by id -> parent id; `images.get` by tag; removal refuses an image with a child still there."""

    def __init__(self, parents: dict[str, str], tags: dict[str, str]) -> None:
        self.parents, self.tags, self.removed = parents, tags, []
        self.images = SimpleNamespace(get=self._get)
        self.api = SimpleNamespace(images=self._list, remove_image=self._remove)

    def _get(self, tag: str) -> SimpleNamespace:
        if tag not in self.tags:
            raise docker.errors.ImageNotFound(tag)
        return SimpleNamespace(id=self.tags[tag])

    def _list(self, all: bool) -> list[dict[str, str]]:
        assert all
        return [{"Id": i, "ParentId": p} for i, p in self.parents.items() if i not in self.removed]

    def _remove(self, image_id: str, force: bool, noprune: bool) -> None:
        assert noprune, "pruning could reach past the bench's own images"
        children = [c for c, p in self.parents.items() if p == image_id and c not in self.removed]
        assert not children, f"{image_id} removed before its children {children}"
        self.removed.append(image_id)


def test_remove_images_removes_the_bench_images_and_their_intermediates_only() -> None:
    parents = {
        "base": "",  # the user's cached layers, and someone else's image on them
        "runtime": "base",
        "theirs": "base",
        "copy": "base",  # the bench's relabelled base, its build's intermediates, its runtime and task
        "step1": "copy",
        "step2": "step1",
        "stage": "copy",
        "bench-runtime": "step2",
        "bench-task": "bench-runtime",
    }
    tags = {"trajflow-bench-base:n-copy": "copy", "trajflow-bench-runtime:n": "bench-runtime"}
    client = FakeDocker(parents, tags)
    removed = remove_images(client, [*tags, "trajflow-bench-task:x-n"])  # type: ignore[arg-type]
    assert removed == 6
    assert set(client.removed) == {"copy", "step1", "step2", "stage", "bench-runtime", "bench-task"}


def figures(success_rate: float = 1.0, warm_p: float = 20.0) -> Figures:
    chaos = chaos_figures([Episode(ok=True)] * 3 + ([Episode(ok=False, error="spent")] if success_rate < 1 else []))
    chaos.update(
        kill_fraction=0.1, containers=40, kill_targets=5, kills=4, kills_missed=1, kills_pending_at_end=0,
        median_lifetime_s=0.4, warm_hits=10, cold_starts=30, discarded_dead=1, refill_failures=0, concurrency=4,
    )  # fmt: skip
    return Figures(
        plan=quick_plan(),
        owner="bench-x",
        image="trajflow-task:roman-numerals-abc",
        pool_size=4,
        cached={"cached_build_s": 0.01, "cached_build_detail_s": {"ensure_runtime_image": 0.01, "image_for_env": 0.0}},
        warm_ms=[warm_p, warm_p + 1, warm_p + 10],
        warm_hits=3,
        cold_ms=[400.0, 500.0],
        steps={
            "steps_per_s": 200.0,
            "concurrency": 4,
            "seconds": 3.0,
            "total": 600,
            "per_sandbox": [150] * 4,
            "action": "echo hi",
            "errors": [],
        },  # fmt: skip
        chaos=chaos,
        builds={
            "layer_build_s": {"base": None, "runtime": 80.0, "task": 0.5},
            "wheel_download_s": 8.0,
            "layer_build_notes": {"base": "not built cold in --quick"},
            "bench_images_removed": 15,
        },
        machine={"cpus": 2.0, "loadavg_1m_start": 1.0, "loadavg_1m_end": 2.0},
        leftover_containers=0,
        wall_s=100.0,
    )


def test_the_summary_has_the_issue_keys_and_the_report_the_targets() -> None:
    s = json.loads(json.dumps(summarize(figures())))
    assert ISSUE_KEYS <= set(s)
    assert set(s["warm_reset_ms"]) == set(s["cold_reset_ms"]) == {"p50", "p99"}
    assert s["warm_reset_ms"]["p50"] <= s["warm_reset_ms"]["p99"]
    assert set(s["layer_build_s"]) == {"base", "runtime", "task"} and s["layer_build_s"]["base"] is None
    assert isinstance(s["cached_build_s"], float) and isinstance(s["steps_per_s"], float)
    assert s["reset_success_rate"] == 1.0 and s["env"] == "shell:roman-numerals" and s["quick"] is True
    assert s["warm_hits"] == 3 and s["resets"] == 3 and s["kills"] == 4
    assert all(t["met"] for t in s["targets"].values())
    text = render(s)
    assert "shell:roman-numerals" in text and "--quick" in text and "NOT met" not in text
    assert "≤ 50 ms" in text and "≥ 99.99%" in text and "4 of 40 containers killed" in text


def test_missed_targets_say_so() -> None:
    s = summarize(figures(success_rate=0.5, warm_p=60.0))
    assert not s["targets"]["warm_reset_ms.p50"]["met"] and s["targets"]["warm_reset_ms.p99"]["met"]
    assert not s["targets"]["reset_success_rate"]["met"]
    assert render(s).count("NOT met") == 2
