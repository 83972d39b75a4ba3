"""`trajflow bench sandbox` end to end on the real Docker engine, with small N: the JSON has the issue's keys and
sane values, and the bench leaves no container and no throwaway image behind.

The runtime image comes from the session's cache (tests/conftest.py), so nothing is rebuilt; only the task layer
is built cold here (seconds), on a relabelled copy of the runtime.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import docker
import pytest

from trajflow.infra.settings import Settings
from trajflow.lab.bench.sandboxes import main, quick_plan
from trajflow.sandbox import labels

pytestmark = pytest.mark.integration


def _bench_images(client: docker.DockerClient) -> set[str]:
    return {tag for image in client.images.list() for tag in image.tags if tag.startswith("trajflow-bench-")}


def test_quick_bench_measures_everything_and_leaves_nothing_behind(
    docker_client, runtime_image: str, cache_dir: Path, tmp_path: Path, capsys
) -> None:
    # A short state dir (sandbox sockets live under it) sharing the session's image cache.
    state = Path(tempfile.mkdtemp(prefix="tf-bench-"))
    (state / "cache").mkdir()
    (state / "cache" / "images").symlink_to(cache_dir / "images")
    images_before = _bench_images(docker_client)
    plan = quick_plan(
        warm_samples=4, cold_samples=3, concurrency=2, step_seconds=1.0, chaos_resets=12, kill_fraction=0.25,
        cold_layers=("task",),
    )  # fmt: skip
    out = tmp_path / "bench.json"
    started = time.monotonic()
    try:
        code = main(plan, out, Settings(state_dir=state, sandbox_warm_pool=2))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    took = time.monotonic() - started
    report = capsys.readouterr().out
    assert code == 0, report

    s = json.loads(out.read_text())
    assert {"warm_reset_ms", "cold_reset_ms", "layer_build_s", "cached_build_s", "steps_per_s"} <= set(s)
    for figure in ("warm_reset_ms", "cold_reset_ms"):
        assert set(s[figure]) == {"p50", "p99"} and 0 < s[figure]["p50"] <= s[figure]["p99"]
    assert s["warm_hits"] == 4, "every warm sample is a warm hit"
    builds = s["layer_build_s"]
    assert builds["task"] > 0 and builds["base"] is None and builds["runtime"] is None
    assert s["bench_images_removed"] >= 2  # the relabelled runtime and the task layer, at least
    assert 0 < s["cached_build_s"] < 10 and s["steps_per_s"] > 0 and s["steps"]["errors"] == []
    assert 0.0 <= s["reset_success_rate"] <= 1.0
    chaos = s["chaos"]
    assert chaos["resets"] == 12 and chaos["env_faults"] == 0, chaos
    assert chaos["kills"] + chaos["kills_missed"] + chaos["kills_pending_at_end"] == chaos["kill_targets"]
    assert s["env"] == "shell:roman-numerals" and s["quick"] is True and s["leftover_containers"] == 0
    assert "shell:roman-numerals" in report and "reset success" in report

    owned = docker_client.containers.list(all=True, filters={"label": f"{labels.OWNER}={s['owner']}"})
    assert owned == [], "every container the bench started is gone"
    assert _bench_images(docker_client) <= images_before, "the throwaway images are gone"
    assert took < 90, f"the small bench took {took:.0f} s"
