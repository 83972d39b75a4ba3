"""How a trajectory's failures are classified: an `EnvFault` ends it `failed`, an `InfraFault` `infra_failed`."""

from __future__ import annotations


class EnvFault(Exception):
    """The environment rejected the episode (or a branch could not start from its parent): ends as `failed`."""


class InfraFault(Exception):
    """Sandboxes kept failing past the recovery budget, or an agent program failed: ends as `infra_failed`."""
