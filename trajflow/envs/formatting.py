"""Chat formatting on our side: turns a GEM observation into the text of the next user message.

`cap_observation` cuts a huge observation to its head and tail with a marker (the env worker applies it with
`trajflow.contracts.limits.MAX_OBSERVATION_CHARS`). Pure functions only. Limits: knows GEM's conventions (an optional
`info["suffix"]` such as "Enter your next guess."), nothing about chat templates or tokenisers; those belong to the
decode side.
"""

from __future__ import annotations

from collections.abc import Mapping


def observation_message(observation: str, info: Mapping[str, object]) -> str:
    """The user message for `observation`: the observation, then `info["suffix"]` on its own line.

    The suffix is added only when it is a non-empty string not already contained in the observation.
    """
    suffix = info.get("suffix")
    if not isinstance(suffix, str) or not suffix.strip() or suffix.strip() in observation:
        return observation
    if not observation:
        return suffix.strip()
    separator = "" if observation.endswith("\n") else "\n"
    return f"{observation}{separator}{suffix.strip()}"


def cap_observation(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, keeping its head and tail, with a marker saying how much was cut.

    An agent that prints 10 MB must not make an activity result exceed Temporal's payload limit; the cut is the
    env's answer (the agent sees the marker), not an infra failure.
    """
    if len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    return (
        f"{text[:half]}\n[... trajflow cut {len(text) - 2 * half} characters of this observation ...]\n{text[-half:]}"
    )
