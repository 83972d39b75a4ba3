"""`trajflow replay --check`: replay recorded workflow histories against the current workflow code, offline, with
Temporal's `Replayer`, to catch non-deterministic changes before they meet running workflows.

Targets are history JSON files (the format `temporal workflow show -o json` and the Web UI's download write;
plus an optional `workflowId` key, else the file's stem is the id), folders of them, or workflow ids whose live
history is fetched from the server. Default: the histories shipped in trajflow/cli/replay/histories/ (refreshed
deliberately by tests/integration/test_record_histories.py; a unit test replays them in CI).

Limits: a history proves determinism only for the code paths it went through; queries and signal handlers'
return values are not checked (only the commands the workflow issues).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

HISTORIES_DIR = Path(str(resources.files("trajflow.cli.replay") / "histories"))


@dataclass(frozen=True)
class CheckResult:
    source: str
    """The file or `workflow:ID` the history came from."""
    workflow_type: str
    events: int
    error: str | None
    """None when the replay matched; the non-determinism (or other replay failure) otherwise."""


def default_workflows() -> list[type]:
    from trajflow.workers.orchestrator import WORKFLOWS

    return list(WORKFLOWS)


def history_files(targets: Sequence[str]) -> tuple[list[Path], list[str]]:
    """Split targets into history files (folders expand to their *.json) and workflow ids (anything else)."""
    files: list[Path] = []
    ids: list[str] = []
    for t in targets or [str(HISTORIES_DIR)]:
        p = Path(t)
        if p.is_dir():
            files += sorted(p.glob("*.json"))
        elif p.is_file() or t.endswith(".json"):
            files.append(p)
        else:
            ids.append(t)
    return files, ids


def load_history(path: Path) -> WorkflowHistory:
    """A history file; its workflow id is its `workflowId` key (the recorder writes one: a TrainingWorkflow names
    its children after its id, so replaying under another id fails), else the file's stem."""
    data = json.loads(path.read_text())
    workflow_id = data.pop("workflowId", None) or path.stem
    return WorkflowHistory.from_json(workflow_id, data)


def workflow_type(history: WorkflowHistory) -> str:
    first = history.events[0] if history.events else None
    return first.workflow_execution_started_event_attributes.workflow_type.name if first else "?"


async def check(
    histories: Sequence[tuple[str, WorkflowHistory]], workflows: Sequence[type] | None = None
) -> list[CheckResult]:
    """Replay each history with the given workflow classes (default: what the orchestrator runs)."""
    replayer = Replayer(workflows=list(workflows or default_workflows()), data_converter=pydantic_data_converter)
    out = []
    for source, history in histories:
        res = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        err = res.replay_failure
        failure = None if err is None else f"{type(err).__name__}: {err}"
        out.append(CheckResult(source, workflow_type(history), len(history.events), failure))
    return out


async def fetch(client: Client, workflow_id: str) -> WorkflowHistory:
    return await client.get_workflow_handle(workflow_id).fetch_history()


def format_results(results: Sequence[CheckResult]) -> str:
    lines = []
    for r in results:
        verdict = "OK" if r.error is None else f"FAILED\n    {r.error}"
        lines.append(f"{r.source}  ({r.workflow_type}, {r.events} events)  {verdict}")
    bad = sum(r.error is not None for r in results)
    lines.append(f"{len(results) - bad}/{len(results)} histories replay deterministically")
    return "\n".join(lines)


async def main(targets: Sequence[str]) -> int:
    """What the command does: 0 when every history replays, 1 when any fails, 2 when there is nothing to check."""
    files, ids = history_files(targets)
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not (files or ids):
        print(f"no history to check: {', '.join(missing) or 'no *.json found'}")
        return 2
    histories = [(str(f), await asyncio.to_thread(load_history, f)) for f in files]
    if ids:
        from trajflow.infra.settings import load_settings
        from trajflow.infra.temporal import connect

        client = await connect(load_settings())
        histories += [(f"workflow:{i}", await fetch(client, i)) for i in ids]
    results = await check(histories)
    print(format_results(results))
    return 1 if any(r.error for r in results) else 0
