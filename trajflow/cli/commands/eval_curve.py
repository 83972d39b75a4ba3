"""Held-out success by step while a run trains (`[train.eval] every` = N > 0): `trajflow train` and `trajflow attach`
evaluate versions N, 2N, ... (below the last step, which the eval after training covers) greedily on the first
`during_episodes` held-out seeds, one eval at a time, in the background of the live view; with `[train.eval] defer`,
after training instead (each due version held until then), once the eval after training is done.

Each due version is held in the store (`trajflow.infra.policies.PolicyStore.reserve`) from before the run starts until
its eval is done, so the trainer's pruning (it keeps the newest two versions) cannot remove it before the live view,
which polls every 2 s, sees it published (a tiny model trains a step faster than that), nor while it waits or runs; the
trajectories are pinned to it (`evaluate(..., version=v)`), so the result is that version's even when training has
moved on. Each finished eval is appended to the run directory's `eval_curve.jsonl`, logged to the trackers
(`eval_curve/success_rate`, `eval_curve/mean_reward` at step v) and said in one line. The summary's `eval_curve`
adds the evals before and after training restricted to the same seeds (`EvalCurve.close`).

Resumption: a version in `eval_curve.jsonl` is never evaluated again; `trajflow attach` evaluates every multiple of
N it has not (held by the process that died, or still among the newest two), and says which it can no longer
(pruned before anyone held them). An eval in flight when the run ends is awaited (and any still queued run) before
the summary is written. An eval that fails is said and left out of the curve (its version is released).

Not covered: the evals share the decode pool with training (docs/training.md, "Held-out success during
training", says what that costs); an eval interrupted with the process (Ctrl-C) is run again from the start by
`trajflow attach`, its first trajectories left to finish on their own.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from temporalio.client import Client

from trajflow.cli.commands.evaluate import Say, evaluate
from trajflow.contracts.runs import CurvePoint, EvalResult
from trajflow.contracts.training import TrainingRunConfig
from trajflow.infra.settings import Settings
from trajflow.observability.tracking.base import Fanout, curve_scalars

CURVE_FILE = "eval_curve.jsonl"
"""The run directory's record of the evals during training: one `CurvePoint` a line, in the order they ended."""


class Holds(Protocol):
    """A run's published versions as the curve needs them (`RunHolds`; fakes in tests)."""

    def hold(self, version: int) -> bool:
        """Keep `version` from being pruned; False when its weights are gone already."""
        ...

    def reserve(self, version: int) -> None:
        """Keep `version` from being pruned from its publication on (it may not be published yet)."""
        ...

    def release(self, version: int) -> None: ...

    def held(self) -> set[int]: ...


class RunHolds:
    """`Holds` of one run in the store of `settings`."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        from trajflow.infra.policies import PolicyStore
        from trajflow.infra.store import open_store_from

        self.policies = PolicyStore(open_store_from(settings), settings.state_dir / "cache" / "eval")
        self.run_id = run_id

    def hold(self, version: int) -> bool:
        return self.policies.hold(self.run_id, version)

    def reserve(self, version: int) -> None:
        self.policies.reserve(self.run_id, version)

    def release(self, version: int) -> None:
        self.policies.release(self.run_id, version)

    def held(self) -> set[int]:
        return self.policies.held(self.run_id)


def due(every: int, steps: int, newest: int) -> list[int]:
    """The versions to evaluate during training once `newest` is published: the multiples of `every` up to it,
    below `steps` (the last version is the eval after training's)."""
    if every <= 0:
        return []
    return list(range(every, min(newest, steps - 1) + 1, every))


def read_points(run_dir: Path) -> list[CurvePoint]:
    """The evals during training recorded in `run_dir` (none when there is no record)."""
    path = run_dir / CURVE_FILE
    if not path.is_file():
        return []
    return [CurvePoint.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


class EvalCurve:
    """The evals during one run: `seen(v)` for every finished step (any order, repeats welcome), `close()` at the
    end. `run_eval(v)` evaluates version v on the curve's seeds."""

    def __init__(
        self,
        run_eval: Callable[[int], Awaitable[EvalResult]],
        *,
        every: int,
        steps: int,
        episodes: int,
        run_dir: Path,
        trackers: Fanout,
        say: Say,
        holds: Holds,
        defer: bool = False,
    ) -> None:
        self.run_eval, self.every, self.steps, self.episodes = run_eval, every, steps, episodes
        self.deferred = defer
        """Queue the due versions while the run trains and evaluate them in `close` (after the eval after training)."""
        self._hold_back = defer
        self.run_dir, self.trackers, self.say, self.holds = run_dir, trackers, say, holds
        self.done = {p.version: p for p in read_points(run_dir)}
        self.queued: list[int] = []
        self.passed: set[int] = set(self.done)
        """Versions queued, evaluated, failed or found pruned: each is considered once."""
        self.task: asyncio.Task[None] | None = None
        held = holds.held()
        for version in held & set(self.done):  # evaluated by a process that died before releasing it
            holds.release(version)
        due_all = range(every, steps, every) if every > 0 else range(0)
        self.reserved = [v for v in due_all if v not in self.done and v not in held]
        """Due versions this curve held ahead of their publication (`close` releases those the run never reached;
        a hold it found, a dead process's, is left to its eval, or released by `close` when the run ends below it)."""
        for version in self.reserved:
            holds.reserve(version)

    def seen(self, version: int) -> None:
        """Version `version` is published: hold and queue every due version not yet considered."""
        for v in due(self.every, self.steps, version):
            if v in self.passed:
                continue
            self.passed.add(v)
            if not self.holds.hold(v):
                self.say(f"held-out v{v}: not evaluated, its weights are not in the store (pruned before it was held)")
                continue
            self.queued.append(v)
        self._start()

    def _start(self) -> None:
        if self.queued and not self._hold_back and (self.task is None or self.task.done()):
            self.task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        while self.queued:
            version = self.queued.pop(0)
            try:
                result = await self.run_eval(version)
            except Exception as e:  # one eval lost is a gap in the curve, never the run's end
                self.say(f"held-out v{version}: eval failed ({type(e).__name__}: {str(e)[:200]}); left out")
                self.holds.release(version)
                continue
            self.holds.release(version)  # not in `finally`: a cancelled eval keeps its hold for `trajflow attach`
            point = CurvePoint.of(result)
            self.done[version] = point
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with (self.run_dir / CURVE_FILE).open("a") as f:
                f.write(point.model_dump_json() + "\n")
            self.trackers.scalars(version, curve_scalars(point))
            when = "after" if self.deferred else "during"
            self.say(
                f"held-out v{version}: greedy success {point.successes}/{point.episodes} ({point.rate:.0%}), "
                f"mean reward {point.mean_reward:.3f} ({point.seconds:.0f}s, {when} training)"
            )

    def ended(self, version: int) -> None:
        """The run ended at `version` (its last step, or earlier when stopped): what is due below it is queued, and
        nothing at it, which the eval after training covers."""
        self.steps = min(self.steps, version)
        self.seen(version)

    def release_unreached(self) -> None:
        """Release the versions held ahead that the run never reached (it ended or was stopped before them, or never
        started)."""
        for version in self.reserved:
            if version not in self.passed:
                self.holds.release(version)

    async def close(self, before: EvalResult | None, after: EvalResult | None) -> list[CurvePoint]:
        """Await the eval in flight and those queued; the curve: every eval during training and, on the same seeds,
        the evals before and after (logged to the trackers here) where no eval during training took that version,
        in version order. Deferred evals run here."""
        self._hold_back = False
        self._start()
        while self.task is not None and not self.task.done():
            await self.task
        self.release_unreached()
        # the run ended at `steps`: nothing above it will be published, so a hold there keeps nothing, whoever wrote
        # it (a CLI that reserved its due versions ahead and died before the run ended, as `attach` follows)
        for version in self.holds.held():
            if version >= self.steps and version not in self.passed:
                self.holds.release(version)
        points = dict(self.done)
        for result in (before, after):
            if result is not None and result.version not in points and len(result.per_episode) >= self.episodes:
                point = CurvePoint.of(result, self.episodes)
                points[point.version] = point
                self.trackers.scalars(point.version, curve_scalars(point))
        return [points[v] for v in sorted(points)]


def start_curve(
    client: Client,
    settings: Settings,
    run: TrainingRunConfig,
    run_id: str,
    run_dir: Path,
    trackers: Fanout,
    say: Say,
) -> EvalCurve | None:
    """The curve of run `run_id` when `[train.eval] every` asks for one (None otherwise)."""
    if run.eval.every == 0 or run.eval.episodes == 0:
        return None
    episodes = run.eval.curve_episodes()
    subset = run.model_copy(update={"eval": run.eval.model_copy(update={"episodes": episodes})})

    async def run_eval(version: int) -> EvalResult:
        # a fresh id per attempt: a trajectory of an eval interrupted by a process that died may still run
        prefix = f"{run_id}-curve-v{version}-{uuid.uuid4().hex[:6]}"
        return await evaluate(client, subset, _quiet, policy=run_id, version=version, id_prefix=prefix)

    when = "after training (defer)" if run.eval.defer else "during training"
    say(f"held-out evals {when}: every {run.eval.every} versions, {episodes} greedy episodes each")
    return EvalCurve(
        run_eval,
        every=run.eval.every,
        steps=run.steps,
        episodes=episodes,
        run_dir=run_dir,
        trackers=trackers,
        say=say,
        holds=RunHolds(settings, run_id),
        defer=run.eval.defer,
    )


def _quiet(_line: str) -> None:
    """The evals during training say one line each (`EvalCurve`), not the eval's progress lines."""
