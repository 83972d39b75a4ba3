"""The typed keys of the workflows' search attributes (their names and types: `trajflow.contracts.names`), one
definition for every workflow that sets them."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import names

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
