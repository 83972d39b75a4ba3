"""What `trajflow rollout` and `trajflow demo` do: start trajectories through the client and report them."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable

from pydantic import ValidationError

from trajflow.client import load_trajectory, new_workflow_id, start_trajectory
from trajflow.contracts.agent import is_agent
from trajflow.contracts.config import RunConfig, TaskConfig
from trajflow.contracts.errors import explain_invalid
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import TrajectoryRequest, TrajectoryResult, TrajectoryStatus
from trajflow.infra.settings import load_settings
from trajflow.infra.temporal import connect


def _task(config: RunConfig, name: str | None) -> TaskConfig:
    if name is None:
        return config.tasks[0]
    for t in config.tasks:
        if t.name == name:
            return t
    raise ValueError(f"no task {name!r} in the config; tasks: {[t.name for t in config.tasks]}")


def request_from_config(
    config: RunConfig,
    task: str | None,
    env: str | None,
    seed: int | None,
    max_turns: int | None,
    temperature: float | None,
    request_json: str | None = None,
) -> TrajectoryRequest:
    """The config task's request with `request_json` (TrajectoryRequest fields as a JSON object) on top, then the
    single options. Raises ValueError with a message naming what to fix: an unknown task, JSON that does not parse,
    a field that does not validate."""
    t = _task(config, task)
    overrides = _request_fields(request_json) if request_json is not None else {}
    if env is not None:
        overrides["env_id"] = env
    if max_turns is not None:
        overrides["max_turns"] = max_turns
    if temperature is not None:
        sampling = overrides.get("sampling")
        given = sampling if isinstance(sampling, dict) else {}
        overrides["sampling"] = {**t.sampling.model_dump(), **given, "temperature": temperature}
    chosen_seed = seed if seed is not None else overrides.pop("seed", 0)  # --request's is any JSON value
    try:
        return t.request(chosen_seed, **overrides)  # type: ignore[arg-type]  # TrajectoryRequest validates a JSON seed
    except ValidationError as e:
        raise ValueError(explain_invalid(TrajectoryRequest, e, "fix --request or the options")) from None


def _request_fields(text: str) -> dict[str, object]:
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--request is not valid JSON: {e} — pass one JSON object, e.g. '{{\"seed\": 3}}'") from None
    if not isinstance(fields, dict):
        raise ValueError(f"--request must be a JSON object of TrajectoryRequest fields, got {type(fields).__name__}")
    return fields


def format_transcript(record: TrajectoryRecord) -> str:
    shown = _agent_request if is_agent(record.request.env_id) else str.strip
    lines = [f"[observation] {shown(record.first_observation)}"]
    for i, turn in enumerate(record.turns):
        lines.append(
            f"--- turn {i + 1} (policy v{turn.policy_version}, {turn.completion_tokens} tokens, pool "
            f"{turn.decode_pool})"
        )
        lines.append(f"[action] {turn.action.strip()}")
        lines.append(f"[observation] {shown(turn.observation)}  (env reward {turn.env_reward:g})")
    return "\n".join(lines)


def _agent_request(observation: str) -> str:
    """An agent program's chat request as a line: its call number and its last message (the whole request is
    in the record)."""
    if not observation:
        return "(the program ended)"
    try:
        request = json.loads(observation)
        last = request["messages"][-1]
        return f"chat request {request.get('call')} ({len(request['messages'])} messages), last {last['role']}: " + (
            str(last.get("content")).strip()
        )
    except (ValueError, KeyError, IndexError, TypeError):
        return observation.strip()


async def run_and_report(req: TrajectoryRequest, workflow_id: str | None, as_json: bool) -> int:
    settings = load_settings()
    client = await connect(settings)
    t0 = time.monotonic()
    handle = await start_trajectory(req, client=client, workflow_id=workflow_id)
    if not as_json:
        print(f"started {handle.id} ({req.env_id}, seed {req.seed}); waiting ...", flush=True)
    result = await handle.result()
    wall = time.monotonic() - t0
    if as_json:
        print(json.dumps({**result.model_dump(mode="json"), "wall_seconds": round(wall, 3)}, indent=2))
    else:
        if result.trajectory_uri:
            print(format_transcript(load_trajectory(result.trajectory_uri, settings)))
        reward = "none (not scored)" if result.reward is None else f"{result.reward:g}"
        print(f"\nworkflow {result.workflow_id}\nstatus   {result.status.value}\nturns    {result.turns}")
        print(f"reward   {reward}\nversion  {result.policy_version}\nrecoveries {result.env_recoveries}")
        if result.error:
            print(f"error    {result.error}")
        print(f"time     {wall:.2f}s wall ({result.seconds:.2f}s in the workflow)\nstored   {result.trajectory_uri}")
    return 0 if result.status is TrajectoryStatus.COMPLETED else 1


def _requests(config: RunConfig, n: int) -> list[TrajectoryRequest]:
    """n requests spread over the config's tasks by weight, seeds counting up from demo.first_seed."""
    total = sum(t.weight for t in config.tasks)
    out: list[TrajectoryRequest] = []
    credit = {t.name: 0.0 for t in config.tasks}
    for i in range(n):
        for t in config.tasks:
            credit[t.name] += t.weight / total
        pick = max(config.tasks, key=lambda t: credit[t.name])
        credit[pick.name] -= 1.0
        out.append(pick.request(config.demo.first_seed + i))
    return out


async def run_batch(config: RunConfig, n: int | None, say: Callable[[str], None]) -> dict[str, object]:
    """Run n trajectories concurrently and print a summary; returns the summary as a dict."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    settings = load_settings()
    client = await connect(settings)
    reqs = _requests(config, n or config.demo.trajectories)
    t0 = time.monotonic()
    handles = [await start_trajectory(r, client=client, workflow_id=new_workflow_id(r)) for r in reqs]
    say(f"started {len(handles)} trajectories; watch them in the Temporal Web UI (workflow type TrajectoryWorkflow)")
    results: list[TrajectoryResult | BaseException] = []
    with Progress(console=Console(stderr=True)) as bar:
        job = bar.add_task("trajectories", total=len(handles))
        for fut in asyncio.as_completed([h.result() for h in handles]):
            try:
                results.append(await fut)
            except Exception as e:
                results.append(e)
            bar.advance(job)
    wall = time.monotonic() - t0
    done = [r for r in results if isinstance(r, TrajectoryResult)]
    statuses = Counter(r.status.value for r in done)
    rewards = [r.reward for r in done if r.reward is not None]
    summary: dict[str, object] = {
        "trajectories": len(reqs),
        "status": dict(statuses),
        "lost": len(results) - len(done),
        "mean_reward": statistics.fmean(rewards) if rewards else None,
        # GEM games give 1.0 for a win; less than that (but above 0) is partial credit at the turn limit.
        "wins": sum(1 for x in rewards if x >= 1.0),
        "positive_reward": sum(1 for x in rewards if x > 0),
        "mean_turns": statistics.fmean(r.turns for r in done) if done else None,
        "env_recoveries": sum(r.env_recoveries for r in done),
        "wall_seconds": round(wall, 2),
        "trajectories_per_s": round(len(done) / wall, 3) if wall > 0 else None,
        "tasks": dict(Counter(r.env_id for r in reqs)),
    }
    table = Table(title="trajflow demo")
    for col in ("workflow", "status", "turns", "reward", "seconds"):
        table.add_column(col)
    for r in done:
        reward = "-" if r.reward is None else f"{r.reward:g}"
        table.add_row(r.workflow_id, r.status.value, str(r.turns), reward, f"{r.seconds:.1f}")
    console = Console()
    console.print(table)
    console.print_json(json.dumps(summary))
    return summary
