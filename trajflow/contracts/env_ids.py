"""The kinds of env id, by prefix: one definition for the host (run configs, image layers, a user's env packing, the
workflows) and the runner inside the sandbox, which loads this file beside itself. Stdlib only, and nothing else:
the sandbox's Python has no pydantic and no trajflow package (a unit test holds it to that)."""

SHELL_PREFIX = "shell:"
"""Env ids `shell:<task>` are shell tasks (`trajflow/envs/shell.py`), hosted without GEM."""
GYM_PREFIX = "gym:"
"""Env ids `gym:<ID>` are gymnasium envs (`trajflow/envs/gym_adapter.py`), hosted without GEM."""
USER_PREFIX = "py:"
"""Env ids `py:MODULE:CLASS` are a user's own env class, imported from the image's PYTHONPATH (its layer holds the
user's source and requirements: `trajflow/sandbox/user/`, `trajflow/sandbox/user_images.py`), hosted without GEM."""
DATA_PREFIX = "data:"
"""Env ids `data:NAME` are dataset tasks (`trajflow/envs/dataset.py`): NAME.jsonl or NAME.parquet in the user env
layer."""
AGENT_PREFIX = "agent:"
"""Env ids `agent:MODULE:FUNCTION` are a user's agent program (`trajflow/envs/agent.py`), hosted without GEM."""
AGENT_CMD_PREFIX = "agent-cmd:"
"""Env ids `agent-cmd:FILE` are a user's agent program run as a command line (`trajflow/envs/agent_cmd.py`)."""
AGENT_PREFIXES = (AGENT_PREFIX, AGENT_CMD_PREFIX)
"""The agent programs' env ids."""
NO_GEM_PREFIXES = (SHELL_PREFIX, GYM_PREFIX, USER_PREFIX, DATA_PREFIX, *AGENT_PREFIXES)
"""Every env id with one of these prefixes is hosted without GEM; any other is a GEM id (`game:...`, `math:...`)."""


def is_agent(env_id: str) -> bool:
    """An agent program's env id: `agent:MODULE:FUNCTION` or `agent-cmd:FILE`."""
    return env_id.startswith(AGENT_PREFIXES)
