"""How many bytes the training workflow's state takes at steady state: the continue-as-new input, the `progress`
query's result and the `state` query's result, for a config (docs/capacity.md). Temporal refuses a payload over
2 MB; every run's must stay under LIMIT (512 KiB, issue 25).

A direct run's state (`groups_per_shard` 0) is built by the workflow's own rules (`trajflow.workflows.bookkeeping.Book`:
new_group, new_member, report, take_batch, finish_step), not by hand: HISTORY_KEPT steps are trained, each with a
realistic trainer result (21 metrics at full float precision, per-task stats in a run of two tasks), then admission
fills the pipeline and half of each open group's members complete with the ids and store URIs real trajectories
have. With `training`, a step is in flight too (its B refs are in the state; admission then holds α·B/n open groups
instead of (α + 1)·B/n).

    python -m trajflow.lab.bench.state_size --batch 256 --group 8 --alpha 1 [--json FILE]
    python -m trajflow.lab.bench.state_size --batch 65536 --group 16 --alpha 2 --groups-per-shard 64

With `--groups-per-shard N` the run is sharded and its state is built by `trajflow.workflows.fanin.ShardBook`
(trajflow.lab.bench.sharded_state).

Byte counts are those of pydantic's JSON (what the data converter writes) and do not depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import uuid
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.training import (
    TrainingRunConfig,
    TrainingStart,
    TrainingState,
    TrainStepInput,
    TrainStepResult,
)
from trajflow.contracts.trajectory import TrajectoryReport, TrajectoryStatus
from trajflow.infra.layout import trajectory_record_key
from trajflow.workflows.bookkeeping import HISTORY_KEPT, Book
from trajflow.workflows.queries import progress

LIMIT = 512 * 1024
"""The budget issue 25 sets for the state, the continue-as-new input and every query result (Temporal's hard
limit is 2 MB a payload)."""
STORE = "s3://trajflow/store/"
"""The prefix of a trajectory's URI in the stack's object store."""
TRAINER_METRICS = (
    *("loss", "grad_norm", "updates", "tokens", "sequences", "autocast_bf16", "seconds"),
    *("kl_rollout_trainer", "kl_rollout_trainer_k3", "ratio_mean", "ratio_max", "ratio_min"),
    *("logprob_abs_diff_mean", "logprob_abs_diff_max", "clip_frac", "is_weight_mean", "kl_ref", "entropy"),
    *("publish_s", "checkpoint_s", "load_s"),
)
"""21 metrics a trainer step returns (trajflow.rl.updates, trajflow.rl.losses, and three timings)."""
EVAL_FIRST_SEED = 1_000_000_000
"""Held-out seeds past every training seed of the widest run measured (B = 65,536 for 2·HISTORY_KEPT steps)."""


@dataclass(frozen=True)
class StateSize:
    """Bytes of one steady state's payloads."""

    batch_size: int
    group_size: int
    alpha: int
    redundancy: int
    training: bool
    """A step is in flight (its refs are in the state)."""
    open_groups: int
    """Groups admitted and not yet taken by a step (running, or complete and waiting)."""
    history: int
    continue_as_new: int
    """`TrainingStart(run=..., resume=state)` as JSON."""
    progress: int
    """The `progress` query's result as JSON."""
    state: int
    """The `state` query's result as JSON."""
    groups_per_shard: int = 0
    """0: a direct run (`trajflow.workflows.bookkeeping.Book`); N: a sharded run's shards of N groups
    (`trajflow.lab.bench.sharded_state`)."""
    layout: str = "direct"
    """A sharded run's order of group reports (`sharded_state.LAYOUTS`)."""
    ranges: int = 0
    """A sharded run's ranges of group indices in the state (open, ready, the step's groups, live shards)."""
    shards: int = 0
    """A sharded run's live shards."""

    @property
    def largest(self) -> int:
        return max(self.continue_as_new, self.progress, self.state)


def config(
    batch_size: int,
    group_size: int,
    alpha: int,
    redundancy: int = 0,
    check: bool = True,
    groups_per_shard: int | None = 0,
) -> TrainingRunConfig:
    """A run of two tasks (so step records carry per-task stats), direct (`groups_per_shard` 0) or in shards of
    `groups_per_shard` groups. With `check`, the config check must accept it; without, a direct batch past today's
    limits is measured too (on paper: such a run is refused)."""
    tasks = [TaskConfig(name="countdown"), TaskConfig(name="gsm8k-math")]
    shape = {"batch_size": batch_size, "group_size": group_size, "alpha": alpha, "redundancy": redundancy}
    run = {"steps": 2 * HISTORY_KEPT, "groups_per_shard": groups_per_shard, "eval": {"first_seed": EVAL_FIRST_SEED}}
    if check:
        return TrainingRunConfig.model_validate({**run, **shape, "tasks": tasks})
    if batch_size < group_size or batch_size % group_size:
        raise ValueError(f"batch_size ({batch_size}) must be a multiple of group_size ({group_size})")
    # the same run with one group a step passes every other check; then the batch is widened, unchecked
    one_group = {**run, **shape, "batch_size": group_size, "tasks": tasks}
    return TrainingRunConfig.model_validate(one_group).model_copy(update={"batch_size": batch_size})


def history(cfg: TrainingRunConfig, run_id: str = "grpo-countdown-0412") -> TrainingState:
    """The state of a run of `cfg` after HISTORY_KEPT steps, between two steps, its pipeline empty."""
    s = TrainingState(run_id=run_id, started_at=0.0)
    book = Book(cfg, s)
    for _ in range(HISTORY_KEPT):
        _train(book)
    return s


def steady_state(cfg: TrainingRunConfig, after: TrainingState, training: bool = False) -> TrainingState:
    """`after` (a `history`) with its pipeline full: a step in flight if `training`, and as many groups as admission
    allows open, half of each one's n members completed (see the module docstring)."""
    s = after.model_copy(deep=True)
    book = Book(cfg, s)
    if training:
        for _ in range(book.groups_per_step()):
            _fill(book, _admit(book), cfg.group_size)
        assert book.take_batch() is not None, "a full batch of groups was reported"
    for _ in range(book.groups_to_admit()):
        _fill(book, _admit(book), cfg.group_size // 2)
    return s


def sizes(cfg: TrainingRunConfig) -> list[StateSize]:
    """The bytes of `cfg`'s steady states, admitting and training, as the continue-as-new input and the two queries
    carry them."""
    past = history(cfg)
    rows = []
    for training in (False, True):
        s = steady_state(cfg, past, training)
        rows.append(measure(cfg, s, training, open_groups=len(s.groups)))
    return rows


def measure(
    cfg: TrainingRunConfig,
    s: TrainingState,
    training: bool,
    open_groups: int,
    *,
    groups_per_shard: int = 0,
    layout: str = "direct",
    ranges: int = 0,
    shards: int = 0,
) -> StateSize:
    """The bytes of state `s`'s payloads: the continue-as-new input and the two query results (the keywords: a
    sharded state's own fields of `StateSize`)."""
    # built unchecked: a config past today's limits (measured on paper) would be refused
    start = TrainingStart.model_construct(run=cfg, resume=s)
    return StateSize(
        batch_size=cfg.batch_size,
        group_size=cfg.group_size,
        alpha=cfg.alpha,
        redundancy=cfg.redundancy,
        training=training,
        open_groups=open_groups,
        history=len(s.history),
        continue_as_new=len(start.model_dump_json()),
        progress=len(progress(cfg, s, elapsed_s=12.5 * s.version).model_dump_json()),
        state=len(s.model_dump_json()),
        groups_per_shard=groups_per_shard,
        layout=layout,
        ranges=ranges,
        shards=shards,
    )


def _train(book: Book) -> None:
    """One step: a batch of groups admitted, reported and trained on; the redundant members' cancellations sent
    (the admission loop sends them as they are queued)."""
    for _ in range(book.groups_per_step()):
        _fill(book, _admit(book), book.cfg.group_size)
    step = book.take_batch()
    assert step is not None, "a full batch of groups was reported"
    book.finish_step(step, trainer_result(step), time_s=12.5 * (book.s.version + 1))
    book.to_cancel.clear()


def _admit(book: Book) -> str:
    """Admit one group and start its n + r members; its name."""
    group = book.new_group()
    for _ in range(book.cfg.group_size + book.cfg.redundancy):
        book.new_member(group)
        book.member_started()
    return group.group


def _fill(book: Book, name: str, completed: int) -> None:
    """The group's first `completed` running members report completed, one of every α + 1 a version behind."""
    group = book.s.groups[name]
    for i, wid in enumerate(list(group.running[:completed])):
        version = max(0, book.s.version - i % (book.cfg.alpha + 1))
        crc = zlib.crc32(wid.encode())
        uri = STORE + trajectory_record_key(wid, str(uuid.UUID(int=crc * 2**96 + crc)))  # run ids are uuids
        reward = crc / 2**32  # a float at full precision, the same in every process
        book.report(
            TrajectoryReport(
                workflow_id=wid,
                trajectory_uri=uri,
                group=name,
                policy_version=version,
                reward=reward,
                status=TrajectoryStatus.COMPLETED,
                error=None,
                won=reward > 0.5,
            )
        )


def trainer_result(step: TrainStepInput) -> TrainStepResult:
    """A trainer's result for `step`: TRAINER_METRICS at full float precision, the new weights' URI."""
    metrics = {name: 1.0 / (7 + i + step.version) for i, name in enumerate(TRAINER_METRICS)}
    uri = f"{STORE}policies/{step.run_id}/v{step.version + 1:06d}/manifest.json"
    return TrainStepResult(version=step.version + 1, weights_uri=uri, metrics=metrics, seconds=8.123456789)


def table(rows: list[StateSize]) -> str:
    """The rows as a markdown table (KiB). Mode: direct, or the shard size and layout of a sharded run."""
    head = "| B | n | α | r | mode | step in flight | open groups | ranges | continue-as-new | progress | state |\n"
    head += "|---:|---:|---:|---:|:---|:---:|---:|---:|---:|---:|---:|\n"
    kib = lambda n: f"{n / 1024:,.1f} KiB"  # noqa: E731
    mode = lambda r: f"shards of {r.groups_per_shard}, {r.layout}" if r.groups_per_shard else "direct"  # noqa: E731
    return head + "".join(
        f"| {r.batch_size:,} | {r.group_size} | {r.alpha} | {r.redundancy} | {mode(r)} | "
        f"{'yes' if r.training else 'no'} | {r.open_groups:,} | {f'{r.ranges:,}' if r.groups_per_shard else '–'} | "
        f"{kib(r.continue_as_new)} | {kib(r.progress)} | {kib(r.state)} |\n"
        for r in rows
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trajflow.lab.bench.state_size",
        description=" ".join((__doc__ or "").split("\n\n")[0].split()),
        epilog="Byte counts of pydantic's JSON (what the data converter sends): they do not depend on the machine.",
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[256], help="batch sizes B (default 256)")
    parser.add_argument("--group", type=int, default=8, help="group size n (default 8)")
    parser.add_argument("--alpha", type=int, default=1, help="staleness bound α (default 1)")
    parser.add_argument("--redundancy", type=int, default=0, help="redundant samples per group r (default 0)")
    parser.add_argument(
        "--groups-per-shard",
        type=int,
        default=0,
        metavar="N",
        help="0 (default): a direct run, its state built by workflows.bookkeeping.Book (a batch past the direct "
        "limit is measured on paper, unchecked); N > 0: a sharded run in shards of N groups, its state built by "
        "workflows.fanin.ShardBook in the typical and the worst layout of group reports "
        "(trajflow.lab.bench.sharded_state); the config must pass the config check",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    try:
        if args.groups_per_shard:
            cfgs = [
                config(b, args.group, args.alpha, args.redundancy, groups_per_shard=args.groups_per_shard)
                for b in args.batch
            ]
        else:
            cfgs = [config(b, args.group, args.alpha, args.redundancy, check=False) for b in args.batch]
    except ValueError as e:  # pydantic's ValidationError is one
        parser.error(str(e))
    if args.groups_per_shard:
        from trajflow.lab.bench import sharded_state  # it builds on this module

        rows = [row for c in cfgs for row in sharded_state.sizes(c)]
    else:
        rows = [row for c in cfgs for row in sizes(c)]
    print(table(rows), end="")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
