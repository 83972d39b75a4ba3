"""TrajectoryWorkflow: one multi-turn agent episode, durable end to end.

reset a sandbox on the env pool -> per turn: LLM step on the decode pool, env step on the sandbox's own host
queue -> score on the reward pool -> save the trajectory to the store -> report. A lost sandbox (container
death, hung step, dead env host) is replaced by a fresh one restored by replaying the recorded actions, within
a budget; past it the trajectory ends as infra-failed and is never scored. History holds one turn's text and
store references, so it grows O(turns). Each episode is one OpenTelemetry trace (`trajflow.observability.spans`): a root
`trajectory` span and a span per activity call. A branch (`branch_of`) starts from its parent's turns
(`trajflow.workflows.branching`).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, CancelledError

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import metrics, names
    from trajflow.contracts.agent import (
        AgentRequest,
        AgentRequestError,
        answer_action,
        call_s,
        is_agent,
        request_digest,
    )
    from trajflow.contracts.branches import branch_request
    from trajflow.contracts.engines import CONTEXT_FULL, no_room
    from trajflow.contracts.scoring import ScoreInput
    from trajflow.contracts.trajectory import (
        EnvResetInput,
        EnvStepResult,
        GenerateInput,
        SandboxHandle,
        SaveTrajectoryInput,
        TrajectoryProgress,
        TrajectoryRequest,
        TrajectoryResult,
        TrajectoryStatus,
        TurnSummary,
    )
    from trajflow.observability import spans
    from trajflow.observability.metrics import record

from trajflow.workflows import attributes as keys
from trajflow.workflows import branching, ending, stubs
from trajflow.workflows.faults import EnvFault, InfraFault
from trajflow.workflows.inputs import NO_INPUT, decode_input

AGENT_FAULTS = (names.ERR_AGENT, names.ERR_AGENT_NONDETERMINISTIC)
"""An agent program's failures (crashed, hung, malformed request, bad result; asking other than its record on a
restore): infra, at once (a fresh sandbox would run the same program into the same failure)."""


@workflow.defn(name=names.TRAJECTORY_WORKFLOW)
class TrajectoryWorkflow:
    @workflow.init
    def __init__(self, raw: RawValue = NO_INPUT) -> None:
        # a TrajectoryRequest, decoded here so that bad input fails the workflow, not its task (workflows/inputs.py)
        self.req = decode_input(raw, TrajectoryRequest)
        self.handle: SandboxHandle | None = None
        self.actions: list[str] = []
        self.turns: list[TurnSummary] = []
        self.first_observation = ""
        self.observation = ""
        self.context_uri: str | None = None
        self.recoveries = 0
        self.failure_type: str | None = None
        """The type of the env failure being recovered from (for the recoveries metric)."""
        self.timings = {"llm_s": 0.0, "env_s": 0.0, "reward_s": 0.0}
        self.agent = is_agent(self.req.env_id)
        """An agent program's episode: each observation is its chat request, each action the model's answer."""
        self.branch_from: str | None = None
        """A branch's parent observation at its branch turn, until the restored sandbox has shown it."""
        self.context_full = False
        """The last prompt filled the context budget (`TrajectoryRequest.max_context_tokens`): the episode ended."""
        self.context_tokens = 0

    @workflow.run
    async def run(self, raw: RawValue = NO_INPUT) -> TrajectoryResult:
        req = self.req
        root = spans.span(
            "trajectory",
            workflow_id=workflow.info().workflow_id,
            run=req.run_id or None,
            task=req.task or req.env_id,
            env=req.env_id,
            seed=req.seed,
            group=req.group or None,
            replay_of=req.replay_of or None,
        )
        with root as span:
            result = await self._episode()
            spans.note(
                span,
                status=result.status.value,
                reward=result.reward,
                turns=result.turns,
                policy_version=result.policy_version,
                env_recoveries=result.env_recoveries,
            )
            return result

    async def _episode(self) -> TrajectoryResult:
        req = self.req
        started = workflow.time()
        self._upsert(*keys.start_attributes(self.req))
        status, error = TrajectoryStatus.COMPLETED, None
        last: EnvStepResult | None = None
        try:
            if req.branch_of:
                req = await self._start_branch()
            await self._open_sandbox()
            done = False
            while not done and len(self.turns) < req.max_turns:
                step = await self._turn()
                if step is None:  # the next prompt filled the context budget: the episode ends here, truncated
                    break
                last, done = step, step.terminated or step.truncated
            if self.context_full and last is None:
                status, error = TrajectoryStatus.FAILED, no_room(self.context_tokens, req.max_context_tokens)
        except EnvFault as e:
            status, error = TrajectoryStatus.FAILED, str(e)
        except AgentRequestError as e:  # a request the policy cannot answer as asked (e.g. non-text parts)
            status, error = TrajectoryStatus.FAILED, f"agent request: {e}"
        except InfraFault as e:
            status, error = TrajectoryStatus.INFRA_FAILED, str(e)
        except ActivityError as e:  # the decode pool failed past its retries, or the trajectory was cancelled
            if isinstance(e.cause, CancelledError):
                raise asyncio.CancelledError("llm.generate cancelled") from e
            bad = stubs.error_type(e) in stubs.FATAL
            status = TrajectoryStatus.FAILED if bad else TrajectoryStatus.INFRA_FAILED
            error = f"llm.generate: {stubs.describe(e)}"
        finally:
            await self._close_sandbox()

        reward, details = None, {}
        if status is TrajectoryStatus.COMPLETED:
            reward, details, status, error = await self._score([t.env_reward for t in self.turns], last)
        seconds = workflow.time() - started
        with spans.span("trajectory.save"):
            saved = await stubs.trajectory_save(
                req.pools.reward,
                SaveTrajectoryInput(
                    workflow_id=workflow.info().workflow_id,
                    request=req,
                    status=status,
                    context_uri=self.context_uri,
                    first_observation=self.first_observation,
                    turns=self.turns,
                    reward=reward,
                    reward_details=details,
                    env_recoveries=self.recoveries,
                    error=error,
                    timings={**self.timings, "total_s": seconds},
                    context_full=self.context_full,
                ),
            )
        result = TrajectoryResult(
            workflow_id=workflow.info().workflow_id,
            status=status,
            turns=len(self.turns),
            reward=reward,
            trajectory_uri=saved.trajectory_uri,
            policy_version=min((t.policy_version for t in self.turns), default=None),
            env_recoveries=self.recoveries,
            error=error,
            seconds=seconds,
            # a win as eval counts one (trajflow/cli/commands/evaluate.py): completed, the last env reward at least 1
            won=status is TrajectoryStatus.COMPLETED and bool(self.turns) and self.turns[-1].env_reward >= 1.0,
        )
        ending.record_end(self.req, result)
        await ending.report(self.req, result)
        return result

    @workflow.query(name=names.QUERY_PROGRESS)
    def progress(self) -> TrajectoryProgress:
        """Where the episode is: turn, sandbox, last observation."""
        return TrajectoryProgress(
            env_id=self.req.env_id,
            max_turns=self.req.max_turns,
            turn=len(self.turns),
            sandbox=self.handle.sandbox_id if self.handle else None,
            host_queue=self.handle.host_queue if self.handle else None,
            env_recoveries=self.recoveries,
            last_observation=self.observation[-2000:],
        )

    async def _turn(self) -> EnvStepResult | None:
        """One LLM step and one env step; None when the prompt left no room in the context budget (no env step)."""
        req = self.req
        t0 = workflow.time()
        turn = len(self.turns)
        with spans.span("llm.generate", turn=turn) as span:
            gen = await stubs.llm_generate(req.pools.decode, self._generate_input(turn))
            spans.note(
                span,
                policy_version=gen.policy_version,
                prompt_tokens=gen.prompt_tokens,
                completion_tokens=gen.completion_tokens,
                finish_reason=gen.finish_reason,
                worker=gen.worker_id,
            )
        t1 = workflow.time()
        self.timings["llm_s"] += t1 - t0
        if gen.finish_reason == CONTEXT_FULL:
            self.context_full, self.context_tokens = True, gen.prompt_tokens
            return None
        self.context_uri = gen.context_uri
        action = gen.text
        if self.agent:  # the answer the program's endpoint returns, with its finish reason and token counts
            action = answer_action(
                gen.text, gen.finish_reason, gen.prompt_tokens, gen.completion_tokens, gen.tool_calls
            )
        with spans.span("env.step", turn=turn) as span:
            step = await self._step_with_recovery(action)
            if self.agent:  # the program's own time between this answer and its next request (or its end)
                spans.note(span, agent_seconds=step.info.get("agent_seconds"), agent_call=step.info.get("call"))
        self.timings["env_s"] += workflow.time() - t1
        self.actions.append(action)
        self.observation = step.observation
        # an answer with tool calls is recorded whole, and any agent's answer as sent, so a replay (`--env-only`) or a
        # branch sends the program the same answer (calls, finish reason, token counts)
        self.turns.append(TurnSummary.of(gen, step, action if gen.tool_calls else None, action if self.agent else ""))
        # kept current turn by turn, so a visibility query (or the UI's list) sees where a running episode is
        version = min(t.policy_version for t in self.turns)
        self._upsert(keys.SA_TURNS.value_set(len(self.turns)), keys.SA_VERSION.value_set(version))
        return step

    def _generate_input(self, turn: int) -> GenerateInput:
        """The LLM step of `turn`: the observation on top of the context, or an agent's request (its messages)."""
        req = self.req
        trajectory_id = f"{workflow.info().workflow_id}/{workflow.info().run_id}"
        if not self.agent:
            return req.generate_input(trajectory_id, turn, self.context_uri, self.observation)
        return AgentRequest.parse(self.observation).generate_input(
            trajectory_id,
            turn,
            self.context_uri,
            req.sampling,
            min_policy_version=req.min_policy_version,
            policy=req.policy,
            max_context_tokens=req.max_context_tokens,
        )

    async def _start_branch(self) -> TrajectoryRequest:
        """A branch: the parent's turns 1..k-1 become this episode's, then the sandbox is restored by replaying them."""
        prefix = await branching.load_prefix(self.req)
        self.req = branch_request(self.req, prefix.request)
        self.agent = is_agent(self.req.env_id)
        self.actions, self.turns = list(prefix.actions), list(prefix.turns)
        self.first_observation, self.observation = prefix.first_observation, prefix.observation
        self.context_uri, self.branch_from = prefix.context_uri, prefix.observation
        self._upsert(*keys.start_attributes(self.req), keys.SA_TURNS.value_set(len(self.turns)))
        return self.req

    async def _open_sandbox(self) -> None:
        """Reset a sandbox on the shared env queue; after a loss, replay the recorded actions into it."""
        while True:
            try:
                with spans.span("env.reset", replayed_actions=len(self.actions)) as span:
                    res = await stubs.env_reset(
                        self.req.pools.env,
                        EnvResetInput(
                            trajectory_id=workflow.info().workflow_id,
                            env_id=self.req.env_id,
                            seed=self.req.seed,
                            env_kwargs=self.req.env_kwargs,
                            env_package=self.req.env_package,
                            replay_actions=self.actions,
                            # an agent program re-run in a fresh sandbox must ask what it asked before
                            expect_digests=[request_digest(t.observation) for t in self.turns] if self.agent else [],
                        ),
                        self._reset_extra(),
                    )
                    spans.note(span, sandbox=res.handle.sandbox_id)
            except ActivityError as e:
                self._infra_failure_or_raise(e, "env.reset")
                continue
            self.handle = res.handle
            if self.branch_from is not None:  # a branch's sandbox restored: the parent's state, or it ends
                expected, self.branch_from = self.branch_from, None
                branching.check_restored(self.req, res, expected)
            if self.failure_type is not None:  # a fresh sandbox after a failure: the episode goes on
                record(workflow.metric_meter(), metrics.ENV_RECOVERIES, 1, type=self.failure_type)
                self.failure_type = None
            if not self.actions:
                self.first_observation = res.observation
                self.observation = res.observation
                if self.agent and not res.observation:  # its program ended before asking the model anything
                    raise InfraFault("the agent program ended without a chat request: there is no turn to train")
            return

    def _reset_extra(self) -> timedelta:
        """An agent program may work up to its budget before each request it makes on the way to its state."""
        if not self.agent:
            return timedelta(0)
        return timedelta(seconds=call_s(self.req.env_kwargs) * (1 + len(self.actions)))

    async def _step_with_recovery(self, action: str) -> EnvStepResult:
        while True:
            assert self.handle is not None
            try:
                return await stubs.env_step(self.handle, action, timedelta(seconds=self.handle.step_timeout_s))
            except ActivityError as e:
                self._infra_failure_or_raise(e, "env.step")
                workflow.logger.warning("sandbox %s lost (%s); restoring", self.handle.sandbox_id, stubs.describe(e))
                await self._close_sandbox()
                await self._open_sandbox()

    def _infra_failure_or_raise(self, err: ActivityError, what: str) -> None:
        """Classify a failed env activity: env faults end the episode; infra faults spend the budget; a
        cancellation of this trajectory (e.g. a redundant sample no longer needed) ends it, never "recovers"."""
        if isinstance(err.cause, CancelledError):
            raise asyncio.CancelledError(f"{what} cancelled") from err
        kind = stubs.error_type(err) or type(err.cause).__name__
        record(workflow.metric_meter(), metrics.ENV_FAILURES, 1, type=kind)
        if stubs.is_env_fault(err):
            raise EnvFault(f"{what}: {stubs.describe(err)}") from err
        if kind in AGENT_FAULTS:
            raise InfraFault(f"{what}: {stubs.describe(err)}") from err
        self.recoveries += 1
        self.failure_type = kind
        self._upsert(keys.SA_ENV_FAILURES.value_set(self.recoveries))
        if self.recoveries > self.req.max_env_recoveries:
            raise InfraFault(
                f"{what} failed and the budget of {self.req.max_env_recoveries} sandbox recoveries is spent: "
                f"{stubs.describe(err)}"
            ) from err

    async def _close_sandbox(self) -> None:
        handle, self.handle = self.handle, None
        if handle is None:
            return
        try:
            # Shielded so that cancelling the trajectory still closes its sandbox.
            with spans.span("env.close", sandbox=handle.sandbox_id):
                await asyncio.shield(asyncio.ensure_future(stubs.env_close(handle)))
        except ActivityError as e:
            # The reaper removes what a dead host left behind; a failed close must not fail the episode.
            workflow.logger.warning("closing sandbox %s failed: %s", handle.sandbox_id, stubs.describe(e))

    async def _score(
        self, env_rewards: list[float], last: EnvStepResult | None
    ) -> tuple[float | None, dict, TrajectoryStatus, str | None]:
        assert last is not None, "a completed trajectory has at least one turn (max_turns >= 1)"
        t0 = workflow.time()
        try:
            with spans.span("reward.score", reward_fn=self.req.reward_fn):
                res = await stubs.reward_score(
                    self.req.pools.reward,
                    ScoreInput(
                        request=self.req.score_request(
                            self.actions,
                            env_rewards,
                            last.terminated,
                            last.truncated or not last.terminated,
                            last.info,
                            observations=[self.first_observation, *(t.observation for t in self.turns)],
                        ),
                    ),
                )
        except ActivityError as e:
            kind = stubs.error_type(e)
            status = TrajectoryStatus.FAILED if kind in stubs.REWARD_FATAL else TrajectoryStatus.INFRA_FAILED
            return None, {}, status, f"reward.score: {stubs.describe(e)}"
        finally:
            self.timings["reward_s"] += workflow.time() - t0
        return res.reward, dict(res.details), TrajectoryStatus.COMPLETED, None

    def _upsert(self, *updates) -> None:
        workflow.upsert_search_attributes(list(updates))
