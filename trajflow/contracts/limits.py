"""The size caps on what crosses Temporal, as constrained field types, and the one payload limit they serve.

Temporal's server rejects any single payload over `limit.blobSize.error` (2 MiB by default; it warns at 512 KiB),
and the Python SDK then fails the activity (`PayloadsTooLarge`, retryable) or keeps failing the workflow task,
i.e. retries forever. So user-facing inputs are capped here, where validation names the field and its limit,
observations are cut by the env worker (`MAX_OBSERVATION_CHARS`, with a visible marker), and the workflow stubs
refuse to schedule an activity whose input is over `MAX_PAYLOAD_BYTES` (`trajflow.workflows.stubs`).

Limits: the caps are chosen for a 2 MiB server limit; a cluster configured lower needs smaller ones. They bound
one request, not a run: a TrajectoryRequest at its caps is ~0.3 MB, and its history stays O(turns).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, PlainValidator

MAX_PAYLOAD_BYTES = 2_000_000
"""What one activity input may weigh once encoded (a little under Temporal's default 2 MiB blob limit)."""
MAX_OBSERVATION_CHARS = 16_000
"""An env observation longer than this (an agent that printed 10 MB) is cut to its head and tail, with a marker
saying how much was cut: that is the env's answer, not an infra failure (`trajflow.envs.formatting.cap_observation`)."""
MAX_AGENT_REQUEST_CHARS = 512_000
"""An `agent:` (or `agent-cmd:`) env's observation is its program's whole chat request as JSON and is never cut (cut
JSON does not parse); one longer than this fails the episode (`AgentError`, kind malformed_request). Temporal's payload
limit is 2 MB, and the request's text is escaped once more inside the activity result's JSON: a request of quotes and
backslashes doubles there, so half the limit, less room for the rest of the result, keeps every request under it."""
MAX_SYSTEM_PROMPT_CHARS = 32_000
"""System prompts ride in every `llm.generate` input: 200 turns at the cap add ~6 MB to a history (limit 50 MB)."""
MAX_ID_CHARS = 1000
"""Run ids, policies, groups and report targets are workflow ids: Temporal's default `limit.maxIDLength`."""
MAX_NAME_CHARS = 100
"""Task names, reward function names and pool names (pools become task-queue names)."""
MAX_ENV_ID_CHARS = 200
MAX_ENV_KWARGS = 64
MAX_ENV_KWARG_CHARS = 4096

_ENV_ID = re.compile(r"[a-z][a-z0-9_-]*:\S+")
ENV_ID_HELP = (
    "expected <kind>:<name>, e.g. game:GuessTheNumber-v0-easy, rg:basic_arithmetic, shell:roman-numerals, "
    "py:MODULE:CLASS, agent:MODULE:FUNCTION, agent-cmd:FILE, data:NAME or gym:FrozenLake-v1 "
    "(GEM's ids: python -c 'from gem.envs.registration import ENV_REGISTRY; print(sorted(ENV_REGISTRY))'; "
    "shell tasks: the directories of trajflow/envs/shell_tasks; py: a user's env class, its source in env_path; "
    "agent: a user's agent program, its source in env_path; agent-cmd: the same run as a command line, FILE an "
    "executable in env_path, its arguments env_kwargs.args; data: a JSONL or Parquet file in env_path; "
    "gym: a gymnasium id with a text interface, see trajflow/envs/gym_text.py)"
)


def _env_id(value: str) -> str:
    if not _ENV_ID.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not an env id: {ENV_ID_HELP}")
    return value


EnvId = Annotated[str, Field(min_length=3, max_length=MAX_ENV_ID_CHARS), AfterValidator(_env_id)]
"""A GEM env id (`game:...`, `rg:...`), `shell:<task>`, `py:MODULE:CLASS`, `agent:MODULE:FUNCTION`, `agent-cmd:FILE`,
`data:NAME` or `gym:<gymnasium id>`;
checked for form here, for existence by the env worker."""
EnvPackage = Annotated[str, Field(max_length=MAX_ID_CHARS)]
"""A user env's or dataset's package: an object-store URI (`trajflow.sandbox.user.packages`), or empty."""
SystemPrompt = Annotated[str, Field(max_length=MAX_SYSTEM_PROMPT_CHARS)]
WorkflowIdRef = Annotated[str, Field(max_length=MAX_ID_CHARS)]
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
ContextBudget = Annotated[int, Field(ge=2, le=2**20)] | None
"""Tokens of prompt plus completion one turn may hold (`TrajectoryRequest.max_context_tokens`); None: the model's."""
PoolName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
"""Letters, digits, `_`, `.` and `-`: a pool name becomes part of task-queue names."""


def _env_kwarg(value: object) -> object:
    # one check with one message, instead of one error per member of a str | int | float | bool | None union
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        if len(value) > MAX_ENV_KWARG_CHARS:
            raise ValueError(
                f"a string of {len(value)} characters; an env kwarg may hold at most {MAX_ENV_KWARG_CHARS}"
            )
        return value
    raise ValueError(f"an env kwarg is a string, number, boolean or null, not {type(value).__name__}")


EnvKwargValue = Annotated[
    str | int | float | bool | None, PlainValidator(_env_kwarg, json_schema_input_type=str | int | float | bool | None)
]
EnvKwargs = Annotated[
    dict[Annotated[str, Field(max_length=MAX_NAME_CHARS)], EnvKwargValue], Field(max_length=MAX_ENV_KWARGS)
]
