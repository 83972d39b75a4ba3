"""BatchRolloutWorkflow: batch-level env interaction, the baseline that trajectory-level asynchrony beats.

All B episodes advance in lockstep, as a synchronous rollout loop does: reset every env; then per round, one
LLM turn for every live episode (barrier), one env step for every live episode (barrier); until every episode
has ended; then close, score and save all of them. It calls the same activities, by name, as B
TrajectoryWorkflows would (so the two modes do the same work), and differs only in the barriers.

Benchmark only. Not covered: sandbox recovery (any failed activity fails the whole batch); `trajectory.save`
keys its record by the calling workflow, so the B records of one batch overwrite each other in the store (the
bench does not train on them).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts.scoring import ScoreInput
    from trajflow.contracts.trajectory import (
        EnvResetInput,
        GenerateResult,
        SandboxHandle,
        SaveTrajectoryInput,
        TrajectoryRequest,
        TrajectoryStatus,
        TurnSummary,
    )
    from trajflow.lab.bench.contracts import BATCH_ROLLOUT_WORKFLOW, BatchRolloutInput, BatchRolloutResult

from trajflow.workflows import stubs


@dataclass
class _Episode:
    id: str
    req: TrajectoryRequest
    handle: SandboxHandle | None = None
    first_observation: str = ""
    observation: str = ""
    context_uri: str | None = None
    turns: list[TurnSummary] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    info: dict = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return not self.done and len(self.turns) < self.req.max_turns


@workflow.defn(name=BATCH_ROLLOUT_WORKFLOW)
class BatchRolloutWorkflow:
    @workflow.run
    async def run(self, inp: BatchRolloutInput) -> BatchRolloutResult:
        started = workflow.time()
        wid = workflow.info().workflow_id
        ids = inp.episode_ids or [f"{wid}-e{i:04d}" for i in range(len(inp.requests))]
        eps = [_Episode(i, r) for i, r in zip(ids, inp.requests, strict=True)]
        rounds = 0
        try:
            await asyncio.gather(*(self._reset(e) for e in eps))
            while live := [e for e in eps if e.live]:
                rounds += 1
                gens = await asyncio.gather(*(self._generate(e) for e in live))
                await asyncio.gather(*(self._step(e, g) for e, g in zip(live, gens, strict=True)))
        finally:
            await asyncio.gather(*(stubs.env_close(e.handle) for e in eps if e.handle), return_exceptions=True)
        rewards = await asyncio.gather(*(self._score(e) for e in eps))
        await asyncio.gather(*(self._save(e, r) for e, r in zip(eps, rewards, strict=True)))
        return BatchRolloutResult(
            episodes=len(eps),
            completed=sum(r is not None for r in rewards),
            rounds=rounds,
            turns=[len(e.turns) for e in eps],
            rewards=list(rewards),
            seconds=workflow.time() - started,
        )

    async def _reset(self, e: _Episode) -> None:
        res = await stubs.env_reset(
            e.req.pools.env,
            EnvResetInput(trajectory_id=e.id, env_id=e.req.env_id, seed=e.req.seed, env_kwargs=e.req.env_kwargs),
        )
        e.handle, e.first_observation, e.observation = res.handle, res.observation, res.observation

    async def _generate(self, e: _Episode) -> GenerateResult:
        req = e.req
        return await stubs.llm_generate(
            req.pools.decode,
            req.generate_input(f"{e.id}/{workflow.info().run_id}", len(e.turns), e.context_uri, e.observation),
        )

    async def _step(self, e: _Episode, gen: GenerateResult) -> None:
        assert e.handle is not None
        e.context_uri = gen.context_uri
        step = await stubs.env_step(e.handle, gen.text, timedelta(seconds=e.handle.step_timeout_s))
        e.observation = step.observation
        e.done, e.truncated, e.info = step.terminated or step.truncated, step.truncated, dict(step.info)
        e.turns.append(TurnSummary.of(gen, step))

    async def _score(self, e: _Episode) -> float | None:
        if not e.turns:
            return None
        res = await stubs.reward_score(
            e.req.pools.reward,
            ScoreInput(
                request=e.req.score_request(
                    [t.action for t in e.turns],
                    [t.env_reward for t in e.turns],
                    e.done and not e.truncated,
                    e.truncated or not e.done,
                    e.info,
                ),
            ),
        )
        return res.reward

    async def _save(self, e: _Episode, reward: float | None) -> None:
        await stubs.trajectory_save(
            e.req.pools.reward,
            SaveTrajectoryInput(
                workflow_id=e.id,
                request=e.req,
                status=TrajectoryStatus.COMPLETED if reward is not None else TrajectoryStatus.FAILED,
                context_uri=e.context_uri,
                first_observation=e.first_observation,
                turns=e.turns,
                reward=reward,
                env_recoveries=0,
            ),
        )
