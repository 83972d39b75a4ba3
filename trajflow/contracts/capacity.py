"""Temporal's limits on one workflow execution, and whether a training run's numbers fit them (docs/capacity.md).

A direct run (`groups_per_shard = 0`) is the parent of every trajectory it starts; a sharded run is the parent of
shard workflows, each the parent of its groups' trajectories. `limit_problems` says, for either, which limit a
config could pass and what to change; `TrainSettings` refuses such a config at load with that reason.
"""

from __future__ import annotations

MAX_CHILDREN_IN_FLIGHT = 2_000
"""Temporal's limit on the pending child workflows of one execution (`limit.numPendingChildExecutions.error`): in a
direct run every trajectory is a child of its training workflow, in a sharded run of its shard, so a config whose
children in flight could pass it is refused (docs/capacity.md)."""
MAX_SIGNALS_PER_RUN = 10_000
"""Temporal's limit on the signals one workflow run receives (`limit.maxSignalsPerExecution`)."""
REPORTS_BEFORE_CONTINUE = MAX_SIGNALS_PER_RUN // 2
"""The training workflow continues as new once one run of it has received this many reports (trajectory, group and
shard reports: all its signals but an operator's few). Its history length alone does not bound them: every report
is an event, but with `history_events_before_continue` up to 40,000 the reports of a sharded run, batched into few
workflow tasks, could pass Temporal's limit on a run's signals first. Half the limit: reports still arrive while the
run prepares to continue."""
SHARD_EVENTS_PER_MEMBER = 6
"""History events a shard spends on one trajectory: its start (initiated, started), its close, its report signal, and
the workflow tasks around them (an upper bound used to refuse shards too large for one history)."""
MAX_HISTORY_EVENTS = 51_200
"""Temporal's limit on the events of one workflow history (`limit.historyCount.error`)."""


DIRECT_MAX_IN_FLIGHT = 512
"""The most trajectories in flight a direct run may keep: beyond, its training workflow's state (one entry a
trajectory) could pass the 512 KiB that `tests/unit/test_state_size.py` holds every run to (docs/capacity.md)."""
AUTO_GROUPS_PER_SHARD = 64
"""The shard size of a run that leaves `groups_per_shard` unset and needs shards (fewer when groups are large)."""


def effective_groups_per_shard(
    setting: int | None, in_flight: int, group_size: int, redundancy: int, max_group_restarts: int
) -> int:
    """`groups_per_shard` as a run uses it: the setting, or when unset, 0 (direct) up to `DIRECT_MAX_IN_FLIGHT`
    trajectories in flight and shards of `AUTO_GROUPS_PER_SHARD` groups beyond (fewer if their members, or the
    members a shard may start in its life, would pass one of Temporal's limits)."""
    if setting is not None:
        return setting
    if in_flight <= DIRECT_MAX_IN_FLIGHT:
        return 0
    running = group_size + redundancy
    life = running + max_group_restarts
    fits = min(
        MAX_CHILDREN_IN_FLIGHT // running,
        MAX_SIGNALS_PER_RUN // life,
        MAX_HISTORY_EVENTS // (life * SHARD_EVENTS_PER_MEMBER),
    )
    return max(1, min(AUTO_GROUPS_PER_SHARD, fits))


def groups_in_flight(alpha: int, batch_size: int, group_size: int) -> int:
    """(α + 1)·B/n: the groups admission keeps open or waiting to be trained on."""
    return (alpha + 1) * (batch_size // group_size)


def shard_size(groups_per_shard: int, groups: int) -> int:
    """The groups of a full shard: `groups_per_shard`, or all `groups` in flight when that is smaller. Admission starts
    full shards only, but at the end of a run, for a probe and in sync mode
    (`trajflow.workflows.fanin.ShardBook.shard_due`)."""
    return min(groups_per_shard, groups)


def shards_in_flight(groups: int, size: int) -> int:
    """Full shards of `size` to hold `groups` in flight, one partial shard and a probe's."""
    return -(-groups // max(1, size)) + 2


def limit_problems(
    *, alpha: int, batch_size: int, group_size: int, redundancy: int, max_group_restarts: int, groups_per_shard: int
) -> list[str]:
    """Why a run of these numbers would pass one of Temporal's limits on one workflow execution (empty: it fits)."""
    groups = groups_in_flight(alpha, batch_size, group_size)
    if not groups_per_shard:
        in_flight = groups * (group_size + redundancy)
        if in_flight <= DIRECT_MAX_IN_FLIGHT:
            return []
        return [
            f"up to {in_flight} trajectories in flight ((alpha + 1) * batch_size / group_size groups of group_size "
            f"+ redundancy) in a direct run (groups_per_shard = 0), over its limit of {DIRECT_MAX_IN_FLIGHT}: every "
            "trajectory is a child of the training workflow and an entry of its state. Leave groups_per_shard unset "
            "(shards are used past that limit) or set it (e.g. 64), or lower batch_size, alpha or redundancy"
        ]
    problems = []
    size = shard_size(groups_per_shard, groups)
    shards = shards_in_flight(groups, size)
    if shards > MAX_CHILDREN_IN_FLIGHT:
        problems.append(
            f"up to {shards} shard workflows in flight ((alpha + 1) * batch_size / group_size = {groups} groups in "
            f"shards of {size}), over Temporal's limit of {MAX_CHILDREN_IN_FLIGHT} pending children of the training "
            "workflow. Raise groups_per_shard"
        )
    running = groups_per_shard * (group_size + redundancy)
    if running > MAX_CHILDREN_IN_FLIGHT:
        problems.append(
            f"a shard of {groups_per_shard} groups runs up to {running} trajectories at once (groups_per_shard * "
            f"(group_size + redundancy)), over Temporal's limit of {MAX_CHILDREN_IN_FLIGHT} pending children of one "
            "workflow. Lower groups_per_shard"
        )
    # in its life a shard also starts its groups' replacements; it never continues as new
    members = groups_per_shard * (group_size + redundancy + max_group_restarts)
    if members > MAX_SIGNALS_PER_RUN or members * SHARD_EVENTS_PER_MEMBER > MAX_HISTORY_EVENTS:
        problems.append(
            f"a shard of {groups_per_shard} groups may start {members} trajectories in its life (groups_per_shard * "
            f"(group_size + redundancy + max_group_restarts)): about {members * SHARD_EVENTS_PER_MEMBER} history "
            f"events and {members} signals, over Temporal's limits of {MAX_HISTORY_EVENTS} events and "
            f"{MAX_SIGNALS_PER_RUN} signals. Lower groups_per_shard"
        )
    return problems
