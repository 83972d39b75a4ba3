"""`trajflow up`'s start-up checks say why a process exited: the end of its log is in the error (a test's state dir,
with the logs, is removed before anyone reads the failure)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trajflow.infra.processes import log_tail, start_detached
from trajflow.infra.stack import _wait_http


def test_a_process_that_exits_during_start_up_is_reported_with_the_end_of_its_log(tmp_path: Path) -> None:
    code = "import sys; print('\\n'.join(f'line {i}' for i in range(100))); sys.exit('cannot start: no docker')"
    rec = start_detached("env", [sys.executable, "-c", code], tmp_path)
    with pytest.raises(RuntimeError) as failure:
        _wait_http("http://127.0.0.1:9/healthz", rec, timeout_s=60)  # exits long before
    message = str(failure.value)
    assert message.startswith(f"env exited; the end of {rec.log}:") and "cannot start: no docker" in message
    assert "line 99" in message and "line 50" not in message  # the last 40 lines only
    assert log_tail(rec, 1) == "cannot start: no docker"
