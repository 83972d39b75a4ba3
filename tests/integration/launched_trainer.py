"""The trainer worker as a user launches it on several processes: `accelerate launch --multi_gpu --num_processes N
-m trajflow worker trainer` (torchrun under the hood; gloo on this GPU-less machine), with its own state dir,
against a given Temporal server and store. Its output (every rank's log) goes to one file the tests read: which
ranks joined in which launch attempt with which pid, and which step orders each rank received."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import ROOT, free_port, wait_for

JOINED = re.compile(r"rank (\d+) of (\d+) joined \(\w+, launch attempt (\d+), pid (\d+)\)")


@dataclass
class LaunchedTrainer:
    state_dir: Path
    pool: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def start(
        self, temporal_address: str, store_url: str, models: Path, processes: int = 2, config: Path | None = None
    ) -> None:
        """Launch `processes` ranks serving `config` (None: trajflow/configs/tiny.toml)."""
        (self.state_dir / "cache").mkdir(parents=True, exist_ok=True)
        link = self.state_dir / "cache" / "models"
        if not link.exists():
            link.symlink_to(models)  # the session's model cache: nothing is built twice
        self.env = {
            **os.environ,
            "TRAJFLOW_STATE_DIR": str(self.state_dir),
            "TRAJFLOW_TEMPORAL_ADDRESS": temporal_address,
            "TRAJFLOW_STORE_URL": store_url,
            "PYTHONPATH": str(ROOT),
        }
        argv = [
            str(Path(sys.executable).parent / "accelerate"),
            "launch",
            "--multi_gpu",  # accelerate's torchrun path; the trainer picks gloo where there is no CUDA
            "--num_processes", str(processes),
            "--num_machines", "1",
            "--mixed_precision", "no",
            "--dynamo_backend", "no",
            "--main_process_port", str(free_port()),
            "--max_restarts", "3",
            "-m", "trajflow", "worker", "trainer",
            "--pool", self.pool,
            "--config", str(config or ROOT / "trajflow" / "configs" / "tiny.toml"),
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def ranks(self, attempt: int) -> dict[int, int]:
        """rank -> pid of the ranks that joined in launch attempt `attempt`."""
        return {int(m[1]): int(m[4]) for m in JOINED.finditer(self.text()) if int(m[3]) == attempt}

    def wait_polling(self, attempt: int = 0, processes: int = 2, timeout_s: float = 180) -> dict[int, int]:
        """Wait until every rank of `attempt` joined and rank 0 polls its queue; rank -> pid."""

        def ready() -> dict[int, int] | None:
            assert self.proc is not None and self.proc.poll() is None, f"the launcher exited:\n{self.text()[-4000:]}"
            ranks = self.ranks(attempt)
            polls = self.text().count(f"polling trajflow-trainer-{self.pool}")
            return ranks if len(ranks) == processes and polls > attempt else None

        return wait_for(ready, timeout_s, 0.1, f"trainer ranks of launch attempt {attempt}")

    def stop(self) -> int | None:
        """Stop as an operator would: SIGTERM to rank 0 of the newest launch attempt (its Temporal worker stops and
        it releases the other ranks; all exit 0, and so does the launcher); SIGTERM to the launcher after 30 s
        (it ends every rank), SIGKILL after 30 s more. The launcher's exit code."""
        if self.proc is None:
            return None
        attempts = [int(m[3]) for m in JOINED.finditer(self.text())]
        leader = self.ranks(max(attempts)).get(0) if attempts else None
        for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                break
            if leader is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(leader, sig)
                leader = None
            else:
                self.proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        return self.proc.wait(timeout=10)
