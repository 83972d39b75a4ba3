"""`trajflow images build|list|prune` on the real Docker engine, with the session's image cache (nothing rebuilt).

The stale layers here are made by the test: tiny images `FROM` the current runtime, tagged
`trajflow-task:zz-test-<random>`, and removed afterwards. A real prune is scoped to them (`prune TAG`): the
engine is shared, and layers that look stale from this checkout may be another checkout's current ones.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from typer.testing import CliRunner, Result

from trajflow.cli import app
from trajflow.sandbox.images import image_exists

pytestmark = pytest.mark.integration

ImagesCli = Callable[..., Result]


@pytest.fixture()
def images_cli(cache_dir: Path, runtime_image: str, tmp_path: Path) -> ImagesCli:
    """Runs `trajflow images ...` in a state dir whose image cache is the session's (so `runtime_image` is current)."""
    (tmp_path / "state" / "cache").mkdir(parents=True)
    (tmp_path / "state" / "cache" / "images").symlink_to(cache_dir / "images")
    env = {"TRAJFLOW_STATE_DIR": str(tmp_path / "state")}

    def run(*args: str, code: int = 0) -> Result:
        result = CliRunner().invoke(app, ["images", *args], env=env)
        assert result.exit_code == code, (args, result.output)
        return result

    return run


@pytest.fixture()
def stale_layer(docker_client: docker.DockerClient, runtime_image: str) -> Iterator[str]:
    """A task-layer tag no source hashes to, on an image of its own (the label makes its id unique)."""
    tag = f"trajflow-task:zz-test-{uuid.uuid4().hex[:12]}"
    dockerfile = f"FROM {runtime_image}\nLABEL trajflow.test={tag}\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    try:
        yield tag
    finally:
        for container in docker_client.containers.list(all=True, filters={"ancestor": tag}):
            container.remove(force=True)
        if image_exists(docker_client, tag):
            docker_client.images.remove(tag, force=True)


def _listing(images_cli: ImagesCli) -> dict[str, dict]:
    return {info["tag"]: info for info in json.loads(images_cli("list", "--json").stdout)}


def test_list_shows_the_current_runtime_and_a_stale_layer(
    images_cli: ImagesCli, runtime_image: str, stale_layer: str
) -> None:
    listing = _listing(images_cli)
    assert listing[runtime_image]["layer"] == "runtime" and listing[runtime_image]["current"]
    assert listing[stale_layer]["layer"] == "task" and not listing[stale_layer]["current"]
    assert not listing[stale_layer]["in_use"] and listing[stale_layer]["size_mb"] > 0
    rows = {line.split()[1]: line.split() for line in images_cli("list").stdout.splitlines()[1:]}
    assert rows[runtime_image][0] == "runtime" and "current" in rows[runtime_image]
    assert rows[stale_layer][0] == "task" and "stale" in rows[stale_layer]


def test_prune_removes_a_stale_layer_and_keeps_every_current_one(
    images_cli: ImagesCli, docker_client: docker.DockerClient, stale_layer: str
) -> None:
    current = [tag for tag, info in _listing(images_cli).items() if info["current"]]
    assert current

    out = images_cli("prune", "--dry-run").stdout
    assert f"would remove {stale_layer}\n" in out
    assert image_exists(docker_client, stale_layer)
    assert not any(tag in out for tag in current)

    out = images_cli("prune", stale_layer).stdout
    assert f"removed {stale_layer}\n" in out and "removed 1 stale layer(s)" in out
    assert not image_exists(docker_client, stale_layer)
    assert all(image_exists(docker_client, tag) for tag in current)

    out = images_cli("prune", current[0]).stdout
    assert f"left {current[0]}: not a stale trajflow layer" in out and "removed 0 stale layer(s)" in out
    assert image_exists(docker_client, current[0])


def test_prune_keeps_a_stale_layer_that_a_stopped_container_uses(
    images_cli: ImagesCli, docker_client: docker.DockerClient, stale_layer: str
) -> None:
    docker_client.containers.create(stale_layer, command=["true"], labels={"trajflow.test": stale_layer})
    assert _listing(images_cli)[stale_layer]["in_use"]
    out = images_cli("prune", stale_layer).stdout
    assert f"kept {stale_layer}: a container uses it" in out and "removed 0 stale layer(s)" in out
    assert image_exists(docker_client, stale_layer)


def test_build_finds_cached_layers_and_refuses_unknown_tasks(images_cli: ImagesCli, runtime_image: str) -> None:
    rows = {line.split()[0]: line.split() for line in images_cli("build", "--task", "slugify").stdout.splitlines()}
    assert set(rows) == {"base", "runtime", "task:slugify"}
    assert rows["runtime"][1:] == [runtime_image, "cached"]
    assert rows["task:slugify"][1].startswith("trajflow-task:slugify-")
    assert "no shell task 'no-such-task'" in images_cli("build", "--task", "no-such-task", code=2).output
