"""Experiment tracking (`trajflow/observability/tracking/`): what a step and an eval log, each backend written and
read back with
its own reader (TensorBoard's event accumulator, W&B's offline run file, MLflow's client on its SQLite store), a failing
backend dropped without ending the run, a missing package named before the run, and the live sparkline."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from trajflow.cli.commands.train import StepLog, sparkline
from trajflow.contracts.runs import EvalResult
from trajflow.contracts.tracking import MlflowConfig, TrackingConfig, WandbConfig
from trajflow.contracts.training import StepRecord
from trajflow.observability.tracking.base import Fanout, eval_scalars, open_trackers, step_scalars

CONFIG = {"model": {"name_or_path": "tiny"}, "train": {"steps": 2, "trainer": {"lr": 1e-4}}, "tasks": [{"name": "g"}]}


def steps() -> list[StepRecord]:
    return [
        StepRecord(
            step=1,
            time_s=10.0,
            reward_mean=-0.1,
            trajectories=8,
            stale_dropped_total=0,
            staleness={0: 8},
            metrics={"loss": 0.5, "clip_frac": 0.0, "entropy": 2.0},
            train_s=3.0,
        ),
        StepRecord(
            step=2,
            time_s=14.0,
            reward_mean=0.3,
            trajectories=8,
            stale_dropped_total=1,
            staleness={0: 2, 1: 6},
            metrics={"loss": 0.25, "clip_frac": 0.1, "entropy": 1.5},
            train_s=2.0,
        ),
    ]


def evaluation(version: int, success: float) -> EvalResult:
    return EvalResult(version=version, episodes=4, scored=4, not_completed=0, success_rate=success, mean_reward=success,
                      seconds=1.0, pass_at_k={1: success, 2: min(1.0, 2 * success)})  # fmt: skip


def test_a_step_logs_reward_staleness_the_trainers_metrics_and_throughput() -> None:
    first, second = steps()
    values = step_scalars(second, first)
    assert values["rollout/reward_mean"] == 0.3
    assert values["rollout/staleness_mean"] == 0.75 and values["rollout/staleness_max"] == 1.0
    assert values["train/loss"] == 0.25 and values["train/clip_frac"] == 0.1 and values["train/entropy"] == 1.5
    assert values["train/step_seconds"] == 2.0
    assert values["time/trajectories_per_s"] == 2.0  # 8 trajectories in the 4 s since step 1
    assert step_scalars(first, None)["time/trajectories_per_s"] == 0.8
    assert eval_scalars(evaluation(2, 0.5)) == {
        "eval/success_rate": 0.5, "eval/mean_reward": 0.5, "eval/pass_at_1": 0.5, "eval/pass_at_2": 1.0,
    }  # fmt: skip


def log_a_run(trackers: Fanout) -> None:
    trackers.config(CONFIG)
    trackers.scalars(0, eval_scalars(evaluation(0, 0.0)))
    log = StepLog(trackers)
    first, second = steps()
    log.log(first)
    log.log(second)
    log.log(first)  # seen twice (a live poll, then the result's history): logged once
    trackers.scalars(2, eval_scalars(evaluation(2, 0.5)))
    trackers.close()


def test_tensorboard_event_files_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trackers = open_trackers(TrackingConfig(), tmp_path, "run-a", print)
    assert trackers.names == ["tensorboard"]
    log_a_run(trackers)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    rewards = [(e.step, round(e.value, 6)) for e in events.Scalars("rollout/reward_mean")]
    assert rewards == [(1, -0.1), (2, 0.3)]
    assert [(e.step, e.value) for e in events.Scalars("eval/success_rate")] == [(0, 0.0), (2, 0.5)]
    assert [round(e.value, 6) for e in events.Scalars("train/loss")] == [0.5, 0.25]
    assert "config" in " ".join(events.Tags()["tensors"])  # the resolved config, as text


def record_kinds(path: Path) -> list[str]:
    """The kinds of the records of an offline W&B run file so far (a record still being written: not yet)."""
    try:
        return [r.WhichOneof("record_type") for r in wandb_records(path)]
    except Exception:  # a record cut short by the writer
        return []


def wandb_records(path: Path) -> list:
    """The records of an offline W&B run file (what `wandb sync` uploads): after a 7-byte header, LevelDB's log
    format (32 KiB blocks of chunks: crc32c, length, type), each record a `wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if left < 7 or (kind == 0 and length == 0):  # the block's zero padding
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()  # type: ignore[attr-defined]
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_writes_the_run_under_the_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = TrackingConfig(tensorboard=False, wandb=WandbConfig(project="p"))
    trackers = open_trackers(config, tmp_path, "run-b", print)
    log_a_run(trackers)
    assert trackers.names == ["wandb"], "it did not fail"
    (run,) = (tmp_path / "wandb").glob("offline-run-*-run-b/run-run-b.wandb")
    # W&B's service may still be writing the file when `finish` returns: read it once its exit record is there
    deadline = time.monotonic() + 60
    while (kinds := record_kinds(run))[-1:] != ["exit"]:
        assert time.monotonic() < deadline, f"the run file never got its exit record: {kinds}"
        time.sleep(0.5)
    rows, config_keys = [], set()
    for record in wandb_records(run):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "config":
            config_keys |= {item.key for item in record.config.update}
    rewards = [(r["version"], round(r["rollout/reward_mean"], 6)) for r in rows if "rollout/reward_mean" in r]
    assert rewards == [(1, -0.1), (2, 0.3)], (kinds, rows)
    assert [(r["version"], r["eval/success_rate"]) for r in rows if "eval/success_rate" in r] == [(0, 0.0), (2, 0.5)]
    assert {"model", "train", "tasks"} <= config_keys


def test_mlflow_logs_params_and_metrics_by_step(tmp_path: Path) -> None:
    import mlflow

    trackers = open_trackers(
        TrackingConfig(tensorboard=False, mlflow=MlflowConfig(experiment="e")), tmp_path, "run-c", print
    )
    log_a_run(trackers)
    assert trackers.names == ["mlflow"], "it did not fail"
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("e")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run-c" and run.info.status == "FINISHED"
    assert run.data.params["train.trainer.lr"] == "0.0001" and run.data.params["tasks.0.name"] == "g"
    history = client.get_metric_history(run.info.run_id, "rollout/reward_mean")
    assert [(m.step, round(m.value, 6)) for m in history] == [(1, -0.1), (2, 0.3)]


def test_a_failing_backend_is_dropped_and_the_others_go_on(tmp_path: Path) -> None:
    class Broken:
        def config(self, config) -> None:
            raise OSError("disk full")

        def scalars(self, step, values) -> None:
            raise AssertionError("never called once dropped")

        def close(self) -> None: ...

    class Kept:
        def __init__(self) -> None:
            self.steps: list[int] = []

        def config(self, config) -> None: ...

        def scalars(self, step, values) -> None:
            self.steps.append(step)

        def close(self) -> None: ...

    said: list[str] = []
    kept = Kept()
    trackers = Fanout([("broken", Broken()), ("kept", kept)], said.append)
    log_a_run(trackers)
    assert trackers.names == ["kept"] and kept.steps == [0, 1, 2, 2]
    assert said == ["tracking: broken failed (OSError: disk full); it logs nothing more"]


def test_a_backend_without_its_package_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(RuntimeError, match=r"names wandb, but the `wandb` package is not installed.*\[tracking\]"):
        open_trackers(TrackingConfig(wandb=WandbConfig()), tmp_path, "r", print)


def test_the_sparkline_scales_between_its_own_min_and_max() -> None:
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([0.2, 0.2]) == "▄▄"
    assert sparkline([]) == ""
    assert len(sparkline([float(i) for i in range(50)])) == 24
