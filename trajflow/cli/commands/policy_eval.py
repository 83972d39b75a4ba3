"""What `trajflow eval CONFIG [--policy RUN[@VERSION]]` does: find the policy version in the store, check that the
stack serves the config's pools, evaluate (`trajflow.cli.commands.evaluate`) with progress, print the per-seed table and
the figures, and write the `EvalResult` as JSON.

A version can be evaluated while its weights are in the store: the trainer keeps only the newest few
(`trajflow.activities.trainer.CHECKPOINTS_KEPT`), so an older version of a run is gone once later steps pruned it. Every
error that the user can fix (no such run, no such version, a simulated run without weights, a stack that is not
up) is an `EvalError` whose message says what exists or what to start; the CLI prints it and exits non-zero.

Not checked: that the decode pool serves the model of this config (it serves the one it was started with).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client

from trajflow.cli.commands.evaluate import Say, evaluate, format_table
from trajflow.contracts import names
from trajflow.contracts.config import RunConfig
from trajflow.contracts.runs import EvalResult
from trajflow.contracts.training import TrainingRunConfig
from trajflow.infra.layout import RUNS, policy_latest_key
from trajflow.infra.policies import PolicyStore
from trajflow.infra.settings import Settings
from trajflow.infra.store import ObjectNotFound, ObjectStore

LISTED_RUNS = 20
"""At most this many runs are named when a run is not found."""


class EvalError(Exception):
    """A bad input or a missing stack: the message says what to fix. `code`: the exit status (2 bad input, 1 stack)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PolicySpec:
    """What `--policy` names: a run and a version, or (run "") the base model."""

    run: str = ""
    version: int | None = None
    """None: the run's newest published version."""


def parse_policy(text: str | None) -> PolicySpec:
    """`RUN`, `RUN@VERSION` (VERSION a whole number) or None (the base model); ValueError otherwise."""
    if text is None:
        return PolicySpec()
    run, at, version = text.partition("@")
    if not run or "@" in version or (at and not (version.isascii() and version.isdigit())):
        raise ValueError(f"--policy {text!r}: expected RUN or RUN@VERSION (a training run id, a version number)")
    return PolicySpec(run, int(version) if at else None)


def runs_with_policies(store: ObjectStore) -> list[str]:
    """The runs that have published a policy pointer in the store, sorted."""
    marker = "/policy/latest.json"
    found = {uri.rsplit(f"/{RUNS}/", 1)[-1][: -len(marker)] for uri in store.list(f"{RUNS}/") if uri.endswith(marker)}
    return sorted(found)


def resolve_version(store: ObjectStore, policies: PolicyStore, spec: PolicySpec) -> int:
    """The version to evaluate: the one asked for, or the run's newest; EvalError when the store lacks it."""
    if not spec.run:
        return 0
    try:
        pointer = store.get_json(store.uri_for(policy_latest_key(spec.run)))
    except ObjectNotFound:
        runs = runs_with_policies(store)
        listed = ", ".join(runs[:LISTED_RUNS]) + (
            f" (and {len(runs) - LISTED_RUNS} more)" if len(runs) > LISTED_RUNS else ""
        )
        raise EvalError(
            f"no run {spec.run!r} has published a policy in the store ({store!r}); "
            + (f"runs that have: {listed}" if runs else "no run has published one yet")
        ) from None
    if not pointer.get("weights", True):
        raise EvalError(f"run {spec.run!r} was simulated (a benchmark): it published versions without weights")
    newest = int(pointer["version"])
    version = newest if spec.version is None else spec.version
    kept = policies.versions(spec.run)
    if version != 0 and version not in kept:
        shown = ", ".join(f"v{v}" for v in kept) or "none"
        raise EvalError(
            f"run {spec.run!r} has no weights of version {version} in the store: its newest is v{newest}, the versions "
            f"still there are {shown} (the trainer keeps only the newest few; v0 is the initial model)"
        )
    return version


async def check_stack(client: Client, config: RunConfig, config_path: Path) -> None:
    """EvalError (code 1) unless a worker polls the workflow queue and each decode, env and reward queue that the
    config's tasks use."""
    from trajflow.infra.temporal import pollers

    queues = [(names.WORKFLOW_QUEUE, False)]
    for task in config.tasks:
        p = task.pools
        queues += [
            (names.decode_queue(p.decode), True),
            (names.env_queue(p.env), True),
            (names.reward_queue(p.reward), True),
        ]
    idle = [q for q, activity in dict.fromkeys(queues) if not await pollers(client, q, activity=activity)]
    if idle:
        raise EvalError(
            f"the stack is not up: no worker polls {', '.join(idle)} (start it with `trajflow up -c {config_path}`)", 1
        )


@dataclass(frozen=True)
class EvalPlan:
    """What to evaluate, checked against the config and the store (no Temporal yet)."""

    run: TrainingRunConfig
    """The config's tasks and held-out seeds (`eval.episodes` overridden by `--episodes`)."""
    spec: PolicySpec
    version: int


def plan_eval(config: RunConfig, settings: Settings, policy: str | None, episodes: int | None) -> EvalPlan:
    """Parse `--policy`, find its version in the store; EvalError (code 2) for what the user must fix."""
    from trajflow.infra.store import open_store_from

    try:
        spec = parse_policy(policy)
    except ValueError as e:
        raise EvalError(str(e)) from None
    run = config.training_run()
    if episodes is not None:
        run = run.model_copy(update={"eval": run.eval.model_copy(update={"episodes": episodes})})
    if run.eval.episodes < 1:
        raise EvalError("nothing to evaluate: [train.eval] episodes is 0 (give --episodes N)")
    store = open_store_from(settings)
    version = resolve_version(store, PolicyStore(store, settings.state_dir / "cache" / "eval"), spec)
    return EvalPlan(run, spec, version)


async def run_eval(
    plan: EvalPlan, config: RunConfig, config_path: Path, settings: Settings, samples: int, concurrency: int, say: Say
) -> EvalResult:
    """Connect, check the stack (EvalError code 1 when it is not up) and evaluate with progress."""
    from trajflow.infra.connection import TemporalConnectionError
    from trajflow.infra.temporal import connect

    try:
        client = await connect(settings)
    except (TemporalConnectionError, ValueError) as e:
        raise EvalError(f"the stack is not up: {e} (start it with `trajflow up -c {config_path}`)", 1) from None
    await check_stack(client, config, config_path)
    run, spec, version = plan.run, plan.spec, plan.version
    total = run.eval.episodes * (1 + samples)
    say(
        f"eval {spec.run or 'base'} v{version}: {run.eval.episodes} held-out seeds from {run.eval.first_seed}, "
        f"greedy + {samples} samples each: {total} trajectories"
    )
    return await evaluate(
        client,
        run,
        say,
        policy=spec.run,
        version=version,
        samples=samples,
        id_prefix=f"eval-{uuid.uuid4().hex[:6]}-{spec.run or 'base'}-v{version}",
        concurrency=concurrency,
    )


def report(result: EvalResult, json_path: Path | None) -> str:
    """The table and summary line for stdout; writes the JSON when asked."""
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(result.model_dump_json(indent=2))
    return format_table(result)
