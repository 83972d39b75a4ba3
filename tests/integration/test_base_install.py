"""A plain `pip install trajflow`, as a user gets it: the wheel built from this checkout, installed without extras into
a fresh venv, with the base dependencies at the lock's versions (requirements/base.txt, hash-checked; `pip check`
then proves the lock holds everything the wheel asks for). There torch, transformers and the Docker SDK are not
installed, yet the CLI answers, the orchestrator worker imports, the reward service serves, and the public client runs a
trajectory on the running stack (`cli_stack`, whose workers run in the project's venv) to its end.

Not covered: the extras' installs (`make setup` installs requirements/all.txt whole), and the base venv's orchestrator
and reward service serving that trajectory (the orchestrator is imported here, the reward service answers HTTP).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, free_port, wait_healthy

pytestmark = pytest.mark.integration

HEAVY = ("torch", "transformers", "tokenizers", "docker", "peft", "accelerate")
"""What the extras add and a base install must not have."""

RUN_ONE = """
import asyncio, json
from trajflow import SamplingParams, TrajectoryRequest, load_trajectory, run_trajectory

request = TrajectoryRequest(
    env_id="game:GuessTheNumber-v0-easy", seed=21, max_turns=4, sampling=SamplingParams(max_new_tokens=16)
)
result = asyncio.run(run_trajectory(request))
record = load_trajectory(result.trajectory_uri)
print(json.dumps({"result": result.model_dump(mode="json"), "recorded_turns": len(record.turns)}))
"""


def _run(
    argv: list[str | Path], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run `argv` without this checkout on PYTHONPATH (pytest's own may have it), failing with its output."""
    env = {k: v for k, v in (os.environ if env is None else env).items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def base_venv(trajflow_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's directory; its python sees only the installed wheel (run it with cwd outside ROOT)."""
    work = tmp_path_factory.mktemp("base-install")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", venv], work)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps"]
    _run([*pip, "--require-hashes", "-r", ROOT / "requirements" / "base.txt"], work)
    _run([*pip, trajflow_wheel], work)
    _run([venv / "bin" / "python", "-m", "pip", "check"], work)
    return venv


def test_base_install_has_no_heavy_packages_and_its_roles_start(base_venv: Path) -> None:
    python = base_venv / "bin" / "python"
    find = f"import importlib.util as u; print([n for n in {HEAVY!r} if u.find_spec(n)])"
    assert _run([python, "-c", find], base_venv).stdout.strip() == "[]"
    failed = subprocess.run([python, "-c", "import torch"], cwd=base_venv, capture_output=True, text=True)
    assert failed.returncode != 0 and "No module named 'torch'" in failed.stderr
    installed = _run([python, "-c", "import trajflow; print(trajflow.__file__)"], base_venv).stdout
    assert installed.startswith(str(base_venv)), installed  # the wheel, not this checkout

    assert "rollout" in _run([base_venv / "bin" / "trajflow", "--help"], base_venv).stdout
    assert "orchestrator" in _run([base_venv / "bin" / "trajflow", "worker", "--help"], base_venv).stdout
    _run([python, "-c", "import trajflow.workers.orchestrator, trajflow.client, trajflow.rewards.service"], base_venv)
    port = free_port()
    service = subprocess.Popen(
        [python, "-m", "trajflow.rewards.service", "--host", "127.0.0.1", "--port", str(port)],
        cwd=base_venv, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(service, url, 30, "the base install's reward service")
        assert "env_outcome" in httpx.get(f"{url}/reward-fns", timeout=5).json()
    finally:
        service.terminate()
        service.wait(timeout=10)


def test_base_install_runs_a_trajectory_through_the_public_client(base_venv: Path, cli_stack) -> None:
    out = _run([base_venv / "bin" / "python", "-c", RUN_ONE], base_venv, env=cli_stack.env).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    result = seen["result"]
    assert result["status"] == "completed", result
    assert result["turns"] >= 1 and result["reward"] is not None
    assert seen["recorded_turns"] == result["turns"]
    assert result["trajectory_uri"].startswith("file://" + str(cli_stack.state_dir))

    # and the CLI of the base install drives the same stack
    rollout = [base_venv / "bin" / "trajflow", "rollout", "-c", cli_stack.config, "--seed", "22", "--json"]
    assert json.loads(_run(rollout, base_venv, env=cli_stack.env).stdout)["status"] == "completed"
