"""The typed keys of the workflows' search attributes (their names and types: `trajflow.contracts.names`), one
definition for every workflow that sets them, and the attributes a trajectory starts with."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributeUpdate

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import names
    from trajflow.contracts.trajectory import TrajectoryRequest

SA_ENV = SearchAttributeKey.for_keyword(names.SA_ENV)
SA_RUN = SearchAttributeKey.for_keyword(names.SA_RUN)
SA_STATUS = SearchAttributeKey.for_keyword(names.SA_STATUS)
SA_REWARD = SearchAttributeKey.for_float(names.SA_REWARD)
SA_VERSION = SearchAttributeKey.for_int(names.SA_POLICY_VERSION)
SA_ENV_FAILURES = SearchAttributeKey.for_int(names.SA_ENV_FAILURES)
SA_TURNS = SearchAttributeKey.for_int(names.SA_TURNS)
SA_TASK = SearchAttributeKey.for_keyword(names.SA_TASK)
SA_REPLAY_OF = SearchAttributeKey.for_keyword(names.SA_REPLAY_OF)
SA_BRANCH_OF = SearchAttributeKey.for_keyword(names.SA_BRANCH_OF)
SA_BRANCH_TURN = SearchAttributeKey.for_float(names.SA_BRANCH_TURN)


def start_attributes(req: TrajectoryRequest) -> list[SearchAttributeUpdate]:
    """What a trajectory sets when it starts (and a branch again once it has its parent's request)."""
    updates: list[SearchAttributeUpdate] = [
        SA_ENV.value_set(req.env_id),
        SA_RUN.value_set(req.run_id),
        SA_STATUS.value_set("running"),
        SA_TURNS.value_set(0),
        SA_ENV_FAILURES.value_set(0),
    ]
    if req.task:
        updates.append(SA_TASK.value_set(req.task))
    if req.replay_of:
        updates.append(SA_REPLAY_OF.value_set(req.replay_of))
    if req.branch_of:
        turn = float(req.branch_turn)  # a Double: `trajflow.contracts.names.SA_BRANCH_TURN`
        updates += [SA_BRANCH_OF.value_set(req.branch_of), SA_BRANCH_TURN.value_set(turn)]
    return updates
