"""The public face: `from trajflow import ...` gives every name of `__all__`, each documented, imported on first use;
`import trajflow` alone (what the workflows and the reward service do on the way to `trajflow.contracts`) loads
nothing of Temporal's client, pydantic or the store."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import trajflow


def test_all_is_exactly_the_exported_names() -> None:
    assert sorted(trajflow.__all__) == sorted(trajflow._EXPORTS)
    assert len(set(trajflow.__all__)) == len(trajflow.__all__)
    assert set(trajflow.__all__) <= set(dir(trajflow))


@pytest.mark.parametrize("name", trajflow.__all__)
def test_every_public_name_resolves_and_is_documented(name: str) -> None:
    value = getattr(trajflow, name)
    assert inspect.getdoc(value), f"trajflow.{name} has no docstring"
    module, attr = trajflow._EXPORTS[name]
    assert value is getattr(sys.modules[module], attr)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        trajflow.nope  # noqa: B018


def test_importing_trajflow_or_its_contracts_loads_no_client() -> None:
    code = (
        "import sys, trajflow\n"
        "first = sorted(m for m in ('temporalio', 'pydantic', 'infra', 'boto3') if m in sys.modules)\n"
        "import trajflow.contracts.trajectory\n"
        "then = sorted(m for m in ('temporalio', 'infra', 'boto3', 'trajflow.client') if m in sys.modules)\n"
        "print(first, then)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] []"


def test_the_client_examples_work_with_the_public_names() -> None:
    """The models are the ones the workflows take: a request made from the public names validates as theirs."""
    from trajflow.contracts.trajectory import TrajectoryRequest

    req = trajflow.TrajectoryRequest(env_id="game:GuessTheNumber-v0-easy", seed=3)
    assert TrajectoryRequest.model_validate(req.model_dump()) == req
    assert trajflow.load_config("tiny").model.name_or_path == "tiny"
