"""The README's third way to start a trajectory: the Temporal Web UI's *Start Workflow* form, driven by headless
chromium against the embedded stack (`trajflow up`). The form's JSON input must reach `TrajectoryWorkflow` as a
`TrajectoryRequest`, and the trajectory must run to a scored end. On failure a screenshot is saved in tmp_path."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import TrajectoryRequest, TrajectoryResult, TrajectoryStatus

pytestmark = [pytest.mark.integration, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
NAMESPACE = "default"
RESULT_TIMEOUT_S = 120.0
SUBMIT_TIMEOUT_S = 30.0
CLICK_WAIT_MS = 1500
"""How long one click on *Start Workflow* waits for the POST: the form validates with a debounce, so a click
right after filling it may do nothing and is repeated."""


async def _start_from_ui(
    page, ui_url: str, workflow_id: str, payload: str, workflow_type: str = "TrajectoryWorkflow"
) -> None:
    """Open the UI as the README says (the workflow list, then *Start Workflow*), fill the form and submit it."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    await page.goto(ui_url, wait_until="load")  # redirects to the default namespace's workflow list
    await page.get_by_role("link", name="Start Workflow").click()
    await page.wait_for_url(f"**/namespaces/{NAMESPACE}/workflows/start-workflow**", wait_until="load")

    await page.locator("#workflowId").fill(workflow_id)
    await page.locator("#taskQueue").fill("trajflow")
    await page.locator("#workflowType").fill(workflow_type)
    # CodeMirror auto-closes `{` when typed: replace the whole document with the text in one insertion instead.
    editor = page.locator(".cm-content")
    await editor.click()
    await page.keyboard.press("ControlOrMeta+a")
    await page.keyboard.insert_text(payload)
    typed = await editor.inner_text()
    assert json.loads(typed) == json.loads(payload), f"the input editor holds {typed!r}, not {payload!r}"

    start_path = f"/api/v1/namespaces/{NAMESPACE}/workflows/{workflow_id}"

    def is_start(request) -> bool:
        return request.method == "POST" and urlparse(request.url).path == start_path

    button = page.get_by_test_id("start-workflow-button")
    deadline = time.monotonic() + SUBMIT_TIMEOUT_S
    while True:
        try:
            async with page.expect_request(is_start, timeout=CLICK_WAIT_MS) as request_info:
                await button.click()
            break
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no POST {start_path} within {SUBMIT_TIMEOUT_S}s of clicking Start Workflow"
                ) from None
    response = await (await request_info.value).response()
    assert response is not None and response.status == 200, (
        f"POST {start_path} answered {response and response.status}: {response and await response.text()}"
    )
    # The UI's own confirmation: a toast linking to the new workflow's page.
    toast = page.get_by_role("link", name="Workflow started successfully")
    await toast.wait_for(timeout=15_000)
    href = await toast.get_attribute("href")
    assert href and f"/namespaces/{NAMESPACE}/workflows/{workflow_id}/" in href, href


async def _check_trajectory(cli_stack, workflow_id: str, payload: str, env_id: str, seed: int) -> None:
    client = await cli_stack.connect()
    handle = client.get_workflow_handle(workflow_id, result_type=TrajectoryResult)
    result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT_S)
    assert result.workflow_id == workflow_id
    assert result.status == TrajectoryStatus.COMPLETED, result
    assert result.turns >= 1 and result.reward is not None, result

    # What the server recorded as the workflow's start: the type, the queue and the JSON typed into the form.
    history = await handle.fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.workflow_type.name == "TrajectoryWorkflow"
    assert started.task_queue.name == "trajflow"
    assert len(started.input.payloads) == 1
    assert json.loads(started.input.payloads[0].data) == json.loads(payload)

    # ...and what the workflow made of it: the request in the trajectory record, defaults filled in.
    assert result.trajectory_uri is not None and result.trajectory_uri.startswith("file://"), result
    record = TrajectoryRecord.model_validate(json.loads(Path(result.trajectory_uri[len("file://") :]).read_text()))
    expected = TrajectoryRequest.model_validate(json.loads(payload))
    assert record.workflow_id == workflow_id
    assert (record.request.env_id, record.request.seed) == (env_id, seed), record.request
    assert record.request == expected, record.request
    assert record.status == TrajectoryStatus.COMPLETED and len(record.turns) == result.turns


# env_id and seed are spelled out, not derived from the payload, so `{}` also pins the README's defaults.
@pytest.mark.parametrize(
    ("payload", "env_id", "seed"),
    [
        ("{}", "game:GuessTheNumber-v0-easy", 0),
        ('{"env_id": "game:GuessTheNumber-v0-hard", "seed": 7}', "game:GuessTheNumber-v0-hard", 7),
    ],
    ids=["defaults", "hard-seed-7"],
)
async def test_start_trajectory_from_web_ui(cli_stack, tmp_path: Path, payload: str, env_id: str, seed: int) -> None:
    from playwright.async_api import async_playwright

    workflow_id = f"ui-test-{uuid.uuid4().hex[:12]}"
    started = False
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            try:
                await _start_from_ui(page, cli_stack.ui_url, workflow_id, payload)
                started = True
                await _check_trajectory(cli_stack, workflow_id, payload, env_id, seed)
            except Exception as exc:
                shots = await _screenshots(page, cli_stack.ui_url, workflow_id, started, tmp_path)
                raise AssertionError(f"starting {workflow_id} from the Web UI failed: {exc}\n{shots}") from exc
        finally:
            await browser.close()


async def _screenshots(page, ui_url: str, workflow_id: str, started: bool, tmp_path: Path) -> str:
    """Best effort: the page as the failure left it and, once started, the workflow's page (status, input, result;
    the bare workflow URL redirects to the latest run's timeline)."""
    lines: list[str] = []
    targets: list[tuple[str, str | None]] = [("page", None)]
    if started:
        targets.append(("workflow", f"{ui_url}/namespaces/{NAMESPACE}/workflows/{workflow_id}"))
    for name, url in targets:
        path = tmp_path / f"temporal-ui-{name}.png"
        try:
            if url is not None:
                await page.goto(url, wait_until="load", timeout=15_000)
                # The single-page app renders after `load`: wait for the run's heading (the workflow id).
                await page.wait_for_url(f"**/workflows/{workflow_id}/*/timeline", timeout=15_000)
                await page.get_by_role("heading", name=workflow_id).wait_for(timeout=15_000)
            await page.screenshot(path=str(path), full_page=True, timeout=15_000)
            lines.append(f"screenshot ({name}): {path}")
        except Exception as exc:
            lines.append(f"no {name} screenshot: {exc!r}")
    return "\n".join(lines)


async def test_start_training_run_from_web_ui(cli_stack, tmp_path: Path) -> None:
    """A TrainingWorkflow started from the form: one real optimizer step of the tiny model on one group."""
    from playwright.async_api import async_playwright

    from trajflow.contracts.training import TrainingResult

    run_id = f"ui-run-{uuid.uuid4().hex[:8]}"
    payload = '{"run": {"steps": 1, "batch_size": 4, "group_size": 4, "tasks": [{"max_turns": 1}]}}'
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            try:
                await _start_from_ui(page, cli_stack.ui_url, run_id, payload, workflow_type="TrainingWorkflow")
            except Exception as exc:
                shots = await _screenshots(page, cli_stack.ui_url, run_id, False, tmp_path)
                raise AssertionError(f"starting {run_id} from the Web UI failed: {exc}\n{shots}") from exc
        finally:
            await browser.close()
    client = await cli_stack.connect()
    result = await asyncio.wait_for(client.get_workflow_handle(run_id, result_type=TrainingResult).result(), 300)
    assert result.run_id == run_id and result.version == 1
    assert result.counters.consumed == 4 and len(result.history) == 1
    assert "loss" in result.history[0].metrics  # a real step, not a simulated one


async def test_bad_input_from_web_ui_fails_the_workflow_saying_what_to_fix(cli_stack, tmp_path: Path) -> None:
    """A wrong-typed field typed into the form: the workflow fails at once, non-retryably, with a message naming the
    field (before, its workflow task failed and was retried forever, the workflow Running)."""
    from playwright.async_api import async_playwright
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import ApplicationError

    workflow_id = f"ui-bad-{uuid.uuid4().hex[:12]}"
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            try:
                await _start_from_ui(page, cli_stack.ui_url, workflow_id, '{"seed": "abc", "max_turns": 2}')
            except Exception as exc:
                shots = await _screenshots(page, cli_stack.ui_url, workflow_id, False, tmp_path)
                raise AssertionError(f"starting {workflow_id} from the Web UI failed: {exc}\n{shots}") from exc
        finally:
            await browser.close()
    client = await cli_stack.connect()
    handle = client.get_workflow_handle(workflow_id)
    with pytest.raises(WorkflowFailureError) as info:
        await asyncio.wait_for(handle.result(), 60)
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidWorkflowInput" and cause.non_retryable
    assert cause.message == (
        "TrajectoryRequest: seed: Input should be a valid integer, unable to parse string as an integer (got 'abc') "
        "— fix the workflow input"
    )
    history = await handle.fetch_history()
    assert not [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
