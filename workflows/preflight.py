"""What a training run checks before it admits anything: every decode pool of its tasks serves an engine that follows
training (loads each version the trainer publishes).

A frozen policy (`engine = "openai"`: a remote server's fixed weights) answers every request with the same version,
so a run on its pool would train one step and then wait for ever for trajectories of the next version. The run is
refused instead, at its start, with the pool, the engine and the reason (`InvalidWorkflowInput`, not retried): from
the CLI (which also refuses such a config before it starts anything), a client or the Temporal UI alike.

Limits: one decode worker of each pool answers (`llm.describe`); a pool whose replicas mix engines is not checked
replica by replica. The check waits for a decode worker, as the run's first turns would.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import names
    from trajflow.contracts.engines import EngineInfo
    from trajflow.contracts.training import TrainingRunConfig

from trajflow.workflows import stubs

PATCH_ENGINE_CHECK = "training-checks-decode-engines"
"""The check, behind `workflow.patched`: a run started before it replays as it ran."""


async def check_engines(cfg: TrainingRunConfig) -> None:
    """Raise a non-retryable `InvalidWorkflowInput` naming the first decode pool whose engine is frozen."""
    pools = sorted({task.pools.decode for task in cfg.tasks})
    infos = await asyncio.gather(*(stubs.llm_describe(pool) for pool in pools))
    for info in infos:
        if (refusal := frozen_refusal(info)) is not None:
            raise ApplicationError(refusal, type=names.ERR_INVALID_INPUT, non_retryable=True)


def frozen_refusal(info: EngineInfo) -> str | None:
    """Why a training run cannot decode on the pool `info` describes, or None."""
    if info.follows_training:
        return None
    return (
        f"decode pool {info.pool!r} serves a frozen policy ({info.name!r}, fixed at v{info.version}, worker "
        f"{info.worker_id}): it never loads the versions this run's trainer publishes, so the run would train one "
        'step and then wait for ever. Train on a pool whose engine follows training ([model] engine = "hf" or '
        '"vllm"); a frozen engine ("openai") serves evaluation and rollouts'
    )
