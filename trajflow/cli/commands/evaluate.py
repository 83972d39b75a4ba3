"""Held-out evaluation of one policy version, shared by `trajflow eval` and `trajflow train` (before and after).

Each held-out seed (`[train.eval]`: first_seed, first_seed + 1, ...; disjoint from the training seeds by validation;
tasks take turns over the seeds) is rolled out as an ordinary trajectory, greedily (temperature 0), and with
`samples` = k > 0, k more times at its task's sampling temperature. Every trajectory's policy is pinned to the
version evaluated (`RUN@V`, `trajflow.contracts.trajectory.split_policy`), so the decode pool generates with exactly
that version even when the run has published newer ones. A win is an episode whose last env reward is at least 1.
Reported: the greedy success rate (episodes that did not complete count as losses), the greedy mean reward (of the
scored episodes), pass@1..pass@k (Chen et al. 2021's unbiased estimator, per seed from its k samples, averaged),
and one row per seed.

Limits: trajectories run at most `concurrency` at a time (each holds a sandbox while it runs); pass@k uses n = k
samples, so pass@k itself is the plain "any of the k won" rate; a sample that was not scored counts as a loss.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from temporalio.client import Client

from trajflow.client import start_trajectory
from trajflow.contracts.runs import EpisodeEval, EvalResult
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.training import TrainingRunConfig
from trajflow.contracts.trajectory import SamplingParams, TrajectoryResult, TrajectoryStatus

Say = Callable[[str], None]

PROGRESS_EVERY_S = 10.0
"""A progress line at most this often (and at every tenth of the trajectories, and at the end)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n samples of which c passed: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", eq. 1), computed exactly with integers."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(wins: list[int], n: int) -> dict[int, float]:
    """pass@1..pass@n averaged over seeds, from each seed's number of wins among its n samples ({} when n = 0)."""
    if n == 0 or not wins:
        return {}
    return {k: statistics.fmean(pass_at_k(n, c, k) for c in wins) for k in range(1, n + 1)}


@dataclass(frozen=True)
class _Outcome:
    status: TrajectoryStatus
    reward: float | None
    win: bool


class _Progress:
    """Counts finished trajectories and says so at every tenth, at most every PROGRESS_EVERY_S, and at the end."""

    def __init__(self, label: str, total: int, say: Say) -> None:
        self.label, self.total, self.say = label, total, say
        self.done, self.wins = 0, 0
        self.started = self.last = time.monotonic()
        self.step = max(1, total // 10)

    def tick(self, win: bool) -> None:
        self.done += 1
        self.wins += win
        now = time.monotonic()
        if self.done == self.total or self.done % self.step == 0 or now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            self.say(
                f"eval {self.label}: {self.done}/{self.total} trajectories done, {self.wins} won "
                f"({now - self.started:.0f}s)"
            )


async def evaluate(
    client: Client,
    run: TrainingRunConfig,
    say: Say,
    *,
    policy: str = "",
    version: int = 0,
    samples: int = 0,
    id_prefix: str | None = None,
    concurrency: int = 64,
) -> EvalResult:
    """Evaluate `policy` (a training run id; "" the base model) pinned at `version` (0: the initial model) on the
    held-out seeds of `run.eval`; see the module docstring. Workflow ids are `<id_prefix>-<i>` for the greedy
    episode of seed i and `<id_prefix>-<i>-k<j>` for its samples (default prefix `<run or base>-eval-v<version>`)."""
    if samples < 0 or concurrency < 1:
        raise ValueError(f"samples must be >= 0 and concurrency >= 1; got {samples}, {concurrency}")
    n = run.eval.episodes
    prefix = id_prefix or f"{policy or 'base'}-eval-v{version}"
    label = f"{policy or 'base'} v{version}"
    pinned = f"{policy}@{version}" if policy else ""
    started = time.monotonic()
    progress = _Progress(label, n * (1 + samples), say)
    gate = asyncio.Semaphore(concurrency)

    async def one(task: TaskConfig, seed: int, sampling: SamplingParams, workflow_id: str) -> _Outcome:
        req = task.request(seed, sampling=sampling, policy=pinned, min_policy_version=version, group=prefix)
        async with gate:
            handle = await start_trajectory(req, client=client, workflow_id=workflow_id)
            outcome = _outcome(await handle.result())
        progress.tick(outcome.win)
        return outcome

    jobs = []
    for i in range(n):
        task = run.tasks[i % len(run.tasks)]
        greedy = task.sampling.model_copy(update={"temperature": 0.0})
        seed = run.eval.first_seed + i
        jobs.append(one(task, seed, greedy, f"{prefix}-{i}"))
        jobs += [one(task, seed, task.sampling, f"{prefix}-{i}-k{j}") for j in range(samples)]
    outcomes = await asyncio.gather(*jobs)
    rows = []
    for i in range(n):
        greedy, *sampled = outcomes[i * (1 + samples) : (i + 1) * (1 + samples)]
        rows.append(
            EpisodeEval(
                seed=run.eval.first_seed + i,
                task=run.tasks[i % len(run.tasks)].name,
                greedy_status=greedy.status,
                greedy_reward=greedy.reward,
                greedy_win=greedy.win,
                sample_wins=sum(s.win for s in sampled),
                sample_rewards=[s.reward for s in sampled],
            )
        )
    result = summarise_eval(
        rows, policy, version, samples, run.tasks[0].sampling.temperature, time.monotonic() - started
    )
    say(summary_line(result))
    return result


def _outcome(res: TrajectoryResult) -> _Outcome:
    """The episode's status, reward (None: not scored) and win (the trajectory's own `won`: last env reward >= 1)."""
    if res.status is not TrajectoryStatus.COMPLETED:
        return _Outcome(res.status, None, False)
    return _Outcome(res.status, res.reward or 0.0, res.won)


def summarise_eval(
    rows: list[EpisodeEval], policy: str, version: int, samples: int, temperature: float | None, seconds: float
) -> EvalResult:
    """The figures of an evaluation from its per-seed rows."""
    n = len(rows)
    rewards = [r.greedy_reward for r in rows if r.greedy_reward is not None]
    return EvalResult(
        version=version,
        episodes=n,
        scored=len(rewards),
        not_completed=n - len(rewards),
        success_rate=sum(r.greedy_win for r in rows) / n if n else 0.0,
        mean_reward=statistics.fmean(rewards) if rewards else 0.0,
        seconds=round(seconds, 1),
        policy=policy,
        samples=samples,
        temperature=temperature if samples else None,
        pass_at_k=mean_pass_at_k([r.sample_wins for r in rows], samples),
        per_episode=rows,
    )


def shown_ks(samples: int) -> list[int]:
    """The k of pass@k a summary prints: 1, 2, 4, ... and `samples` itself."""
    ks = [k for k in (2**i for i in range(samples.bit_length())) if k < samples]
    return [*ks, samples] if samples else []


def greedy_success(result: EvalResult) -> str:
    """`3/8 (38%)`: greedy wins over episodes (the success rate is wins / episodes, so it gives the count back)."""
    return f"{round(result.success_rate * result.episodes)}/{result.episodes} ({result.success_rate:.0%})"


def summary_line(result: EvalResult) -> str:
    """`eval RUN vV: success 3/8 (38%), mean reward 0.412, pass@1 0.30 pass@4 0.62 (41s)`."""
    passes = "".join(f", pass@{k} {result.pass_at_k[k]:.2f}" for k in shown_ks(result.samples))
    return (
        f"eval {result.policy or 'base'} v{result.version}: success {greedy_success(result)}, "
        f"mean reward {result.mean_reward:.3f}{passes} ({result.seconds:.0f}s)"
    )


def format_table(result: EvalResult) -> str:
    """One line per seed (seed, task, greedy status, reward and win, sample wins), then the summary line."""
    head = ("SEED", "TASK", "GREEDY", "REWARD", "WIN", *(("SAMPLE WINS",) if result.samples else ()))
    table: list[tuple[str, ...]] = [head]
    for r in result.per_episode:
        reward = "-" if r.greedy_reward is None else f"{r.greedy_reward:.3f}"
        row = (str(r.seed), r.task, str(r.greedy_status), reward, "yes" if r.greedy_win else "no")
        table.append((*row, *((f"{r.sample_wins}/{result.samples}",) if result.samples else ())))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
    return "\n".join([*lines, summary_line(result)])
