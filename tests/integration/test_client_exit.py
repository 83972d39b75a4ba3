"""A program on the public API exits cleanly after its last Temporal call.

The SDK core's threads hand each call's result to the event loop under the GIL, and one of them can still want the GIL
back when the main thread, holding the result, reaches interpreter finalisation: CPython then aborts the finished
program ("Fatal Python error: PyGILState_Release", rc 134; temporalio/sdk-python#300). `trajflow.infra.temporal.connect`
registers an exit hook that lets those threads through first. The race needs a busy CPU to show often: on a 2-core
AMD EPYC under two busy processes, 8 of 100 runs of this script aborted without the hook (0 of 100 with it), so 20
runs here would pass the old code about one time in five.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = """\
import asyncio
import trajflow

async def main():
    client = await trajflow.connect(trajflow.load_settings())
    await client.count_workflows()

asyncio.run(main())
"""
RUNS = 20


def test_a_client_script_exits_0_every_time_on_a_busy_cpu(temporal_env, tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TRAJFLOW_TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        runs = [
            subprocess.run(
                [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
            )
            for _ in range(RUNS)
        ]
    finally:
        for p in busy:
            p.kill()
            p.wait()
    bad = [(r.returncode, r.stderr[-600:]) for r in runs if r.returncode != 0 or "Fatal Python error" in r.stderr]
    assert not bad, f"{len(bad)} of {RUNS} runs did not exit cleanly; the first: {bad[0]}"
