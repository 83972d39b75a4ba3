"""The chaos half of `trajflow bench sandbox`: one episode under a TrajectoryWorkflow's budget, and the killer.

`run_episode` plays an episode (reset, steps, close) through `EpisodeOps` under exactly the budget a
TrajectoryWorkflow gives its sandbox (`Budget`): env.reset's retry policy (`RESET_ATTEMPTS` attempts, with
Temporal's 1 s, 2 s waits), then `max_env_recoveries` fresh sandboxes with the actions done so far replayed. A
failed step is one attempt and spends a recovery; an env fault (`ENV_FATAL`: ERR_ENV, ERR_BAD_REQUEST) ends the
episode at once. `chaos_figures` counts what a run of episodes spent, and `measure_chaos` runs the bench's resets
under kills. The ops are a protocol, so the budget is tested against scripted failures.
`Killer` chooses each container of a manager with probability `fraction` when it first sees it and kills it (a
Docker kill) after a delay drawn uniformly over a typical container lifetime; a chosen container gone before its
time passes the kill on to the next one seen.

Not modelled: activity timeouts, heartbeats, or a Temporal server between the attempts.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import docker.errors
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from trajflow.contracts.trajectory import EnvResetResult, EnvStepResult, SandboxHandle, TrajectoryRequest
from trajflow.sandbox.errors import SandboxLost
from trajflow.sandbox.manager import SandboxManager
from trajflow.sandbox.pool import WarmPool
from trajflow.workflows.stubs import ENV_FATAL

if TYPE_CHECKING:
    from trajflow.lab.bench.sandboxes import Rig

Say = Callable[[str], None]
RESET_ATTEMPTS = 3
"""env.reset's RetryPolicy(maximum_attempts=3) in `trajflow.workflows.stubs.env_reset` (a unit test keeps them
equal)."""


@dataclass(frozen=True)
class Budget:
    """What a TrajectoryWorkflow gives its sandbox: env.reset's retries, then fresh sandboxes after losses."""

    reset_attempts: int = RESET_ATTEMPTS
    max_recoveries: int = TrajectoryRequest.model_fields["max_env_recoveries"].default
    first_retry_s: float = RetryPolicy().initial_interval.total_seconds()
    backoff: float = RetryPolicy().backoff_coefficient

    def retry_delay_s(self, attempt: int) -> float:
        """Temporal's wait after failed attempt `attempt` (1-based); the stub sets no intervals of its own."""
        return self.first_retry_s * self.backoff ** (attempt - 1)


@dataclass
class Episode:
    """How one episode went under the budget."""

    ok: bool = False
    failures: list[str] = field(default_factory=list)
    """Every failed activity attempt, in order, as `activity:error type` (e.g. `env.step:SandboxLost`)."""
    retries: int = 0
    """env.reset attempts after the first (Temporal's retries)."""
    recoveries: int = 0
    """Counted as TrajectoryWorkflow counts `env_recoveries` (the last one may be the one that ends it)."""
    env_fault: bool = False
    error: str | None = None
    close_errors: list[str] = field(default_factory=list)


class EpisodeOps(Protocol):
    async def reset(self, replay: list[str]) -> EnvResetResult: ...
    async def step(self, handle: SandboxHandle, action: str) -> EnvStepResult: ...
    async def close(self, handle: SandboxHandle) -> None: ...


class _EndEpisode(Exception):
    """The workflow would end the trajectory here (env fault or spent budget)."""


def error_type(err: BaseException) -> str:
    """The type Temporal reports for an activity failure: an ApplicationError's own, else the class name."""
    return (err.type or "ApplicationError") if isinstance(err, ApplicationError) else type(err).__name__


def retryable(err: BaseException) -> bool:
    """Whether env.reset's retry policy retries this failure."""
    if isinstance(err, ApplicationError):
        return not err.non_retryable and err.type not in ENV_FATAL
    return True  # any other exception fails the attempt as a retryable ApplicationError


async def run_episode(
    ops: EpisodeOps,
    actions: Sequence[str],
    budget: Budget = Budget(),
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Episode:
    """One episode as TrajectoryWorkflow runs it (`_open_sandbox`, `_step_with_recovery`,
    `_infra_failure_or_raise`): reset with retries; a failed step (one attempt) or a reset that failed past its
    retries spends a recovery, then a fresh sandbox replays the actions done so far. Always closes what it opened."""
    ep = Episode()
    done: list[str] = []
    handle: SandboxHandle | None = None
    try:
        handle = await _open(ops, done, budget, ep, sleep)
        for action in actions:
            while True:
                try:
                    step = await ops.step(handle, action)
                    break
                except Exception as e:
                    ep.failures.append(f"env.step:{error_type(e)}")
                    _spend(ep, e, budget, "env.step")
                    await _close(ops, handle, ep)
                    handle = None
                    handle = await _open(ops, done, budget, ep, sleep)
            done.append(action)
            if step.terminated or step.truncated:
                break
        ep.ok = True
    except _EndEpisode:
        pass
    finally:
        if handle is not None:
            await _close(ops, handle, ep)
    return ep


async def _open(
    ops: EpisodeOps, done: list[str], budget: Budget, ep: Episode, sleep: Callable[[float], Awaitable[None]]
) -> SandboxHandle:
    while True:
        attempt = 1
        while True:
            try:
                return (await ops.reset(list(done))).handle
            except Exception as e:
                ep.failures.append(f"env.reset:{error_type(e)}")
                if not retryable(e) or attempt >= budget.reset_attempts:
                    _spend(ep, e, budget, "env.reset")
                    break
                await sleep(budget.retry_delay_s(attempt))
                ep.retries += 1
                attempt += 1


def _spend(ep: Episode, err: Exception, budget: Budget, what: str) -> None:
    """`_infra_failure_or_raise`: an env fault ends the episode; an infra failure spends one recovery."""
    kind = error_type(err)
    if kind in ENV_FATAL:
        ep.env_fault, ep.error = True, f"{what}: {kind}: {err}"
        raise _EndEpisode from err
    ep.recoveries += 1
    if ep.recoveries > budget.max_recoveries:
        ep.error = f"{what} failed and the budget of {budget.max_recoveries} recoveries is spent: {kind}: {err}"
        raise _EndEpisode from err


async def _close(ops: EpisodeOps, handle: SandboxHandle, ep: Episode) -> None:
    try:
        await ops.close(handle)
    except Exception as e:
        ep.close_errors.append(f"{error_type(e)}: {e}")


def chaos_figures(episodes: Sequence[Episode]) -> dict[str, Any]:
    """The counts the report shows for the resets under kills."""
    failed = [ep for ep in episodes if not ep.ok]
    return {
        "resets": len(episodes),
        "first_attempt_failures": sum(1 for ep in episodes if ep.failures),
        "failed_attempts": sum(len(ep.failures) for ep in episodes),
        "failure_types": dict(Counter(kind for ep in episodes for kind in ep.failures)),
        "retries": sum(ep.retries for ep in episodes),
        "recoveries": sum(ep.recoveries for ep in episodes),
        "final_failures": len(failed),
        "env_faults": sum(1 for ep in episodes if ep.env_fault),
        "close_errors": sum(len(ep.close_errors) for ep in episodes),
        "errors": [ep.error for ep in failed[:5]],
        "success_rate": (len(episodes) - len(failed)) / len(episodes) if episodes else 0.0,
    }


# --- the killer -----------------------------------------------------------------------------------------------


class Killer:
    """Kills a random `fraction` of a manager's sandboxes: each is chosen (or not) when first seen (those waiting
    in a full pool at the start included) and killed after a delay drawn uniformly over a typical lifetime (the
    median of the last 50 containers seen to go; `first_span_s` until 5 have), so kills land in every part of a
    sandbox's life (starting, idle in the pool, mid-reset, mid-episode) in proportion to its length. A chosen
    container that is gone before its time passes the kill on to the next one seen, so that `fraction` of the
    containers are killed, not merely chosen."""

    def __init__(self, manager: SandboxManager, fraction: float, first_span_s: float, seed: int) -> None:
        self.manager = manager
        self.fraction, self.first_span_s = fraction, first_span_s
        self.rng = random.Random(seed)
        self.targeted = self.kills = self.missed = 0
        """Chosen; killed; chosen but gone (closed, or dead already) when its time came."""
        self._owed = 0
        self.lifetimes: deque[float] = deque(maxlen=50)
        self._born: dict[str, float] = {}
        self._seen: set[str] = set()
        self._due: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-killer", daemon=True)

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def pending(self) -> int:
        return len(self._due)

    @property
    def containers(self) -> int:
        return len(self._seen)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            now = time.monotonic()
            alive = set(self.manager.sandbox_ids())
            for sandbox_id in [s for s in self._born if s not in alive]:
                self.lifetimes.append(now - self._born.pop(sandbox_id))
            for sandbox_id in alive - self._seen:
                self._seen.add(sandbox_id)
                self._born[sandbox_id] = now
                chosen = self.rng.random() < self.fraction
                if not chosen and self._owed:
                    chosen, self._owed = True, self._owed - 1
                if chosen:
                    self.targeted += 1
                    span = statistics.median(self.lifetimes) if len(self.lifetimes) >= 5 else self.first_span_s
                    self._due[sandbox_id] = now + self.rng.uniform(0, span)
            for sandbox_id, at in list(self._due.items()):
                if at <= now:
                    del self._due[sandbox_id]
                    self._kill(sandbox_id)

    def _kill(self, sandbox_id: str) -> None:
        try:
            container_id = self.manager.get(sandbox_id).container_id
            self.manager.client.api.kill(container_id)
        except (SandboxLost, docker.errors.APIError):  # closed, removed or dead already: nothing to kill
            self.missed += 1
            self._owed += 1
            return
        self.kills += 1


async def measure_chaos(rig: Rig, say: Say) -> dict[str, Any]:
    """Episodes (reset, 1 or 2 steps, close) through the activities, `pool_size` at a time, while the killer
    kills a fraction of the containers; each episode with a TrajectoryWorkflow's budget."""
    plan = rig.plan
    pool = WarmPool(rig.manager, rig.pool_size)
    ops = rig.ops(pool)
    episodes: list[Episode] = []
    todo = iter(range(plan.chaos_resets))
    every = max(1, plan.chaos_resets // 10)

    async def worker() -> None:
        for i in todo:
            episodes.append(await run_episode(ops, [plan.step_action] * (1 + i % 2)))
            if len(episodes) % every == 0 and len(episodes) < plan.chaos_resets:
                lost = sum(1 for ep in episodes if not ep.ok)
                say(f"  resets under kills: {len(episodes)}/{plan.chaos_resets}, {killer.kills} kills, {lost} failed")

    try:
        say(f"resets under kills: filling a warm pool of {rig.pool_size}")
        await asyncio.to_thread(rig.fill, pool)
        with Killer(rig.manager, plan.kill_fraction, plan.kill_span_s, plan.seed) as killer:
            async with asyncio.TaskGroup() as tg:
                for _ in range(rig.pool_size):
                    tg.create_task(worker())
    finally:
        pool.close()
    figures = chaos_figures(episodes)
    figures.update(
        kill_fraction=plan.kill_fraction,
        containers=killer.containers,
        kill_targets=killer.targeted,
        kills=killer.kills,
        kills_missed=killer.missed,
        kills_pending_at_end=killer.pending,
        median_lifetime_s=statistics.median(killer.lifetimes) if killer.lifetimes else None,
        warm_hits=pool.stats.warm_hits,
        cold_starts=pool.stats.cold_starts,
        discarded_dead=pool.stats.discarded_dead,
        refill_failures=pool.stats.refill_failures,
        concurrency=rig.pool_size,
    )
    say(
        f"resets under kills: {figures['resets']} resets, {killer.kills} kills, {figures['first_attempt_failures']} "
        f"hit a failure, {figures['final_failures']} failed past the budget -> {figures['success_rate']:.2%}"
    )
    return figures
