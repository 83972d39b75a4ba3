"""The worker image's CUDA variant (`trajflow images build --worker --cuda`), without Docker or the network: its
pinned closure and tag differ from the CPU image's and hold the nvidia wheels, the CPU image's inputs and tag are
unchanged, the CUDA wheels are fetched from the index alone with pip's local wheel directory off, and the CLI flag
says what it does."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from trajflow.sandbox.builder import wheels
from trajflow.sandbox.builder.cuda_pins import CUDA_PINS, CUDA_TORCH, cuda_closure
from trajflow.sandbox.builder.worker_image import (
    WORKER_CUDA_REPO,
    WORKER_REPO,
    worker_dockerfile,
    worker_image_tag,
    worker_requirements,
)

BASE = "trajflow-base:0123456789abcdef"
FIXED_REQS = ("a==1", "torch==2.13.0+cpu")
FIXED_HASHES = {"pip-26.3-py3-none-any.whl": "00" * 32}
FIXED_SOURCES = {"trajflow/x.py": b"x = 1\n"}
CPU_TAG_BEFORE_CUDA = "trajflow-worker:0413a06df7de1ef5"
"""`worker_image_tag` of the fixed inputs above, computed by the code before the CUDA variant was added."""


def _names(reqs: tuple[str, ...]) -> set[str]:
    return {r.split("==")[0] for r in reqs}


def test_the_cpu_image_keeps_its_inputs_and_tag() -> None:
    cpu = worker_requirements()
    assert "torch==2.13.0+cpu" in cpu
    assert not any(n.startswith(("nvidia-", "cuda-")) or n == "triton" for n in _names(cpu))
    assert worker_requirements(cuda=False) == cpu
    assert worker_image_tag(BASE, FIXED_REQS, FIXED_HASHES, FIXED_SOURCES) == CPU_TAG_BEFORE_CUDA


def test_the_cuda_closure_swaps_torch_and_adds_the_nvidia_wheels() -> None:
    cpu, cuda = worker_requirements(), worker_requirements(cuda=True)
    assert CUDA_TORCH in cuda and "torch==2.13.0+cpu" not in cuda
    assert set(cpu) - set(cuda) == {"torch==2.13.0+cpu"}
    assert set(cuda) - set(cpu) == set(CUDA_PINS)
    added = _names(tuple(CUDA_PINS))
    assert {"triton", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cublas", "cuda-toolkit"} <= added
    assert list(cuda) == sorted(cuda) and len(_names(cuda)) == len(cuda)


def test_every_cuda_pin_is_exact_and_hashed() -> None:
    for req, sha in CUDA_PINS.items():
        assert re.fullmatch(r"[a-z0-9-]+==[0-9][0-9.]*", req), req
        assert re.fullmatch(r"[0-9a-f]{64}", sha), req
    assert len(set(CUDA_PINS.values())) == len(CUDA_PINS)


def test_cuda_closure_needs_one_torch_pin() -> None:
    with pytest.raises(ValueError, match="torch"):
        cuda_closure(("a==1",))


def test_the_cuda_tag_differs_from_the_cpu_tag() -> None:
    cuda_reqs = cuda_closure(FIXED_REQS)
    cpu_tag = worker_image_tag(BASE, FIXED_REQS, FIXED_HASHES, FIXED_SOURCES)
    cuda_tag = worker_image_tag(BASE, cuda_reqs, FIXED_HASHES, FIXED_SOURCES, WORKER_CUDA_REPO)
    assert cpu_tag.startswith(f"{WORKER_REPO}:") and cuda_tag.startswith(f"{WORKER_CUDA_REPO}:")
    assert cpu_tag.partition(":")[2] != cuda_tag.partition(":")[2]
    other = {**FIXED_HASHES, "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl": "11" * 32}
    assert worker_image_tag(BASE, cuda_reqs, other, FIXED_SOURCES, WORKER_CUDA_REPO) != cuda_tag
    assert "'torch==2.13.0'" in worker_dockerfile(BASE, sorted(FIXED_HASHES), cuda_reqs)


def _fake_pip(
    monkeypatch: pytest.MonkeyPatch, wheel_bytes: dict[str, bytes]
) -> list[tuple[list[str], dict[str, str] | None]]:
    """Replace `pip wheel` by writing the named wheels into its --wheel-dir; returns the calls made."""
    calls: list[tuple[list[str], dict[str, str] | None]] = []

    def run(cmd: list[str], progress: object, what: str, env: dict[str, str] | None = None) -> None:
        calls.append((cmd, env))
        target = Path(cmd[cmd.index("--wheel-dir") + 1])
        for name, data in wheel_bytes.items():
            if any(name.startswith(r.split("==")[0].replace("-", "_") + "-") for r in cmd if "==" in r):
                (target / name).write_bytes(data)

    monkeypatch.setattr(wheels, "run_logged", run)
    return calls


def test_cpu_wheels_are_fetched_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_pip(monkeypatch, {"pip-26.3-py3-none-any.whl": b"pip", "a-1-py3-none-any.whl": b"a"})
    hashes = wheels.download_wheels(tmp_path, lambda _: None, ("a==1",), no_deps=True)
    assert sorted(hashes) == ["a-1-py3-none-any.whl", "pip-26.3-py3-none-any.whl"]
    [(cmd, env)] = calls
    assert env is None and cmd[-3:] == ["--no-deps", "a==1", wheels.PIP_REQUIREMENT]


def test_cuda_wheels_come_from_the_index_alone_and_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch_wheel = b"the cuda build"

    pins = {"torch==2.13.0": hashlib.sha256(torch_wheel).hexdigest()}
    made = {"pip-26.3-py3-none-any.whl": b"pip", "a-1-py3-none-any.whl": b"a", "torch-2.13.0-cp311.whl": torch_wheel}
    calls = _fake_pip(monkeypatch, made)
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    hashes = wheels.download_wheels(tmp_path, lambda _: None, ("a==1", "torch==2.13.0"), no_deps=True, from_index=pins)
    assert "torch-2.13.0-cp311.whl" in hashes
    (local, local_env), (index, index_env) = calls
    assert "torch==2.13.0" not in local and local_env is None
    assert index[-3:] == ["--no-deps", "torch==2.13.0", "--only-binary=:all:"]
    assert index_env is not None and "PIP_FIND_LINKS" not in index_env
    assert index_env["PIP_CONFIG_FILE"] == os.devnull


def test_a_cuda_wheel_with_another_hash_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pip(monkeypatch, {"pip-26.3-py3-none-any.whl": b"pip", "torch-2.13.0-cp311.whl": b"not the pinned one"})
    with pytest.raises(RuntimeError, match="sha256"):
        wheels.download_wheels(tmp_path, lambda _: None, ("torch==2.13.0",), from_index={"torch==2.13.0": "0" * 64})
    assert wheels.cached_wheels(tmp_path, ("torch==2.13.0",)) is None


def test_the_cli_flag_says_what_it_builds() -> None:
    from typer.testing import CliRunner

    from trajflow.cli import app

    runner = CliRunner()
    shown = runner.invoke(app, ["images", "build", "--help"], terminal_width=200)
    assert shown.exit_code == 0
    text = " ".join(shown.output.split())
    assert "--cuda" in text and "trajflow-worker-cuda:<hash>" in text and "CUDA build of torch" in text
    refused = runner.invoke(app, ["images", "build", "--cuda"])
    assert refused.exit_code == 2 and "--worker" in refused.output
