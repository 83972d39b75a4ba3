"""The env activities around an `agent:` env's sandbox (a fake one here; `trajflow/envs/agent.py` itself is tested in
test_agent_env.py): a runner AgentError keeps its kind, an agent's request is never cut and is refused past its
limit, a replayed request that differs from the record fails as non-deterministic, and an agent env's calls get its
budget plus a margin."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from trajflow.activities.env import EnvActivities
from trajflow.contracts import names
from trajflow.contracts.agent import STEP_MARGIN_S, request_digest
from trajflow.contracts.limits import MAX_AGENT_REQUEST_CHARS, MAX_OBSERVATION_CHARS
from trajflow.contracts.trajectory import EnvResetInput, EnvStepInput, SandboxHandle
from trajflow.envs.agent import DEFAULT_BUDGET_S
from trajflow.sandbox.agents import check_replayed
from trajflow.sandbox.errors import AgentDiverged, EnvError
from trajflow.sandbox.leases import LeaseBook

AGENT = "agent:solver:solve"
WORKER_STEP_TIMEOUT_S = 60.0


def request(call: int, text: str = "hi") -> str:
    """An agent observation as the runner writes it (JSON, keys sorted)."""
    body = {"call": call, "messages": [{"role": "user", "content": text}], "stream": False}
    return json.dumps(body, sort_keys=True)


def step_out(observation: str, info: dict[str, Any] | None = None, done: bool = False) -> dict[str, Any]:
    return {"observation": observation, "reward": 1.0 if done else 0.0, "terminated": done, "truncated": False,
            "info": info or {}}  # fmt: skip


@dataclass
class FakeBox:
    """A sandbox that answers from a script (an exception in it is raised; a reset's string is its observation) and
    records each call's timeout."""

    reset_out: Any
    steps: list[Any] = field(default_factory=list)
    id: str = "sb1"
    container_id: str = "c1"
    timeouts: list[tuple[str, float | None]] = field(default_factory=list)

    def reset(self, env_id: str, seed: int, env_kwargs: dict[str, Any], timeout_s: float | None = None) -> Any:
        self.timeouts.append(("reset", timeout_s))
        out = self._answer(self.reset_out)
        return {"observation": out, "info": {"call": 1}} if isinstance(out, str) else out

    def step(self, action: str, timeout_s: float | None = None) -> Any:
        self.timeouts.append(("step", timeout_s))
        return self._answer(self.steps.pop(0))

    @staticmethod
    def _answer(out: Any) -> Any:
        if isinstance(out, BaseException):
            raise out
        return out


class FakeManager:
    def __init__(self, box: FakeBox) -> None:
        self.box, self.image, self.leases, self.closed = box, "runtime:x", LeaseBook(), []

    def start(self, env_id: str, image: str) -> FakeBox:
        self.leases.add(self.box.id)
        return self.box

    def get(self, sandbox_id: str) -> FakeBox:
        return self.box

    def close(self, sandbox_id: str) -> None:
        self.closed.append(sandbox_id)


def activities(box: FakeBox) -> tuple[EnvActivities, FakeManager]:
    manager = FakeManager(box)
    return EnvActivities(manager, "default", "w1", WORKER_STEP_TIMEOUT_S), manager  # type: ignore[arg-type]


async def reset(box: FakeBox, env_id: str = AGENT, **fields: Any) -> Any:
    acts, _ = activities(box)
    return await ActivityEnvironment().run(
        acts.reset, EnvResetInput(trajectory_id="t", env_id=env_id, seed=1, **fields)
    )


def handle(env_id: str = AGENT, step_timeout_s: float = WORKER_STEP_TIMEOUT_S) -> SandboxHandle:
    return SandboxHandle(sandbox_id="sb1", container_id="c1", host_queue="q", worker_id="w1", image="i",
                         step_timeout_s=step_timeout_s, env_id=env_id)  # fmt: skip


@pytest.mark.parametrize("kind", ["crashed", "hung", "malformed_request", "bad_result"])
async def test_a_runner_agent_error_keeps_its_kind(kind: str) -> None:
    runner_says = "the agent program exited with status 1 without a result; the end of its stderr:\nBoom"
    box = FakeBox(request(1), steps=[EnvError("AgentError", runner_says, kind)])
    acts, _ = activities(box)
    with pytest.raises(ApplicationError) as e:
        await ActivityEnvironment().run(acts.step, EnvStepInput(handle=handle(), action="answer"))
    assert e.value.type == names.ERR_AGENT and e.value.non_retryable
    assert e.value.message == f"agent {kind}: {runner_says}"
    assert e.value.details == ({"agent_kind": kind},)


async def test_an_agent_error_at_reset_closes_the_sandbox_and_keeps_its_kind() -> None:
    box = FakeBox(EnvError("AgentError", "the agent program made no request within budget_s=5 s", "hung"))
    acts, manager = activities(box)
    with pytest.raises(ApplicationError) as e:
        await ActivityEnvironment().run(acts.reset, EnvResetInput(trajectory_id="t", env_id=AGENT, seed=1))
    assert (e.value.type, e.value.details) == (names.ERR_AGENT, ({"agent_kind": "hung"},))
    assert e.value.message.startswith("agent hung: the agent program made no request")
    assert manager.closed == ["sb1"]


async def test_other_env_errors_stay_env_errors() -> None:
    box = FakeBox(request(1), steps=[EnvError("EnvError", "env code raised")])
    acts, _ = activities(box)
    with pytest.raises(ApplicationError) as e:
        await ActivityEnvironment().run(acts.step, EnvStepInput(handle=handle(), action="a"))
    assert e.value.type == names.ERR_ENV and e.value.details == ()


async def test_an_agent_request_is_never_cut_nor_given_the_info_suffix() -> None:
    big = request(1, "x" * (3 * MAX_OBSERVATION_CHARS))
    result = await reset(FakeBox({"observation": big, "info": {"call": 1, "agent_seconds": 0.5, "suffix": "hint"}}))
    assert result.observation == big and json.loads(result.observation)["call"] == 1
    capped = await reset(FakeBox({"observation": big, "info": {}}), env_id="py:dice:Dice")
    assert len(capped.observation) < len(big)
    assert "trajflow cut" in capped.observation


async def test_an_agent_request_over_the_limit_fails_as_malformed() -> None:
    huge = "x" * (MAX_AGENT_REQUEST_CHARS + 1)
    box = FakeBox(request(1), steps=[step_out(huge)])
    acts, _ = activities(box)
    with pytest.raises(ApplicationError) as e:
        await ActivityEnvironment().run(acts.step, EnvStepInput(handle=handle(), action="a"))
    assert e.value.type == names.ERR_AGENT and e.value.non_retryable
    assert e.value.details == ({"agent_kind": "malformed_request"},)
    assert e.value.message.startswith(f"agent request too large: {MAX_AGENT_REQUEST_CHARS + 1:,} chars > ")


async def test_replayed_requests_equal_to_the_record_restore_the_sandbox() -> None:
    box = FakeBox(request(1), steps=[step_out(request(2), {"agent_seconds": 0.1}), step_out(request(3))])
    digests = [request_digest(request(2)), request_digest(request(3))]
    out = await reset(box, replay_actions=["a1", "a2"], expect_digests=digests)
    assert (out.replayed, out.observation, out.done) == (2, request(3), False)


async def test_a_replayed_request_that_differs_fails_as_non_deterministic() -> None:
    box = FakeBox(request(1), steps=[step_out(request(2)), step_out(request(3, "something else"))])
    acts, manager = activities(box)
    inp = EnvResetInput(
        trajectory_id="t",
        env_id=AGENT,
        seed=1,
        replay_actions=["a1", "a2"],
        expect_digests=[request_digest(request(2)), request_digest(request(3, "hi there"))],
    )
    with pytest.raises(ApplicationError) as e:
        await ActivityEnvironment().run(acts.reset, inp)
    assert e.value.type == names.ERR_AGENT_NONDETERMINISTIC and e.value.non_retryable
    assert "call 3 (after replayed answer 2)" in e.value.message
    assert "differs from the recorded request (sha256 " in e.value.message
    assert "now: " in e.value.message and "something else" in e.value.message
    assert manager.closed == ["sb1"]


def test_a_divergence_shows_the_start_of_the_new_request() -> None:
    with pytest.raises(AgentDiverged) as e:
        check_replayed(4, request_digest("same " + "a" * 500), "same " + "b" * 500)
    assert "call 5 (after replayed answer 4)" in str(e.value)
    assert "'same " + "b" * 195 + "'..." in str(e.value) and "b" * 196 not in str(e.value)
    with pytest.raises(AgentDiverged, match="now: its end"):
        check_replayed(1, request_digest("abc"), "")  # the program ended where it asked before
    check_replayed(1, request_digest("abc"), "abc")


def test_expect_digests_has_one_per_replayed_action_or_none() -> None:
    with pytest.raises(ValueError, match="expect_digests has 1 digests for 2 replay_actions"):
        EnvResetInput(trajectory_id="t", env_id=AGENT, seed=1, replay_actions=["a", "b"], expect_digests=["o"])


async def test_an_agent_env_gets_its_budget_plus_a_margin_for_every_call() -> None:
    box = FakeBox(request(1), steps=[step_out(request(2))])
    out = await reset(box, env_kwargs={"budget_s": 120}, replay_actions=["a1"])
    assert out.handle.step_timeout_s == 120 + STEP_MARGIN_S and out.handle.env_id == AGENT
    assert box.timeouts == [("reset", 150.0), ("step", 150.0)]
    default = await reset(FakeBox(request(1)))
    assert default.handle.step_timeout_s == DEFAULT_BUDGET_S + STEP_MARGIN_S
    small = await reset(FakeBox(request(1)), env_kwargs={"budget_s": 5})  # never below the worker's own timeout
    assert small.handle.step_timeout_s == WORKER_STEP_TIMEOUT_S

    stepped = FakeBox(request(1), steps=[step_out(request(2))])
    acts, _ = activities(stepped)
    await ActivityEnvironment().run(acts.step, EnvStepInput(handle=handle(step_timeout_s=150.0), action="a"))
    assert stepped.timeouts == [("step", 150.0)]


async def test_other_envs_keep_the_worker_timeout_and_the_manager_s_own() -> None:
    box = FakeBox({"observation": "roll", "info": {}}, steps=[step_out("ok")])
    out = await reset(box, env_id="py:dice:Dice", env_kwargs={"budget_s": 900}, replay_actions=["a"])
    assert out.handle.step_timeout_s == WORKER_STEP_TIMEOUT_S and out.handle.env_id == "py:dice:Dice"
    assert box.timeouts == [("reset", None), ("step", None)]
    old = FakeBox(request(1), steps=[step_out("ok")])
    acts, _ = activities(old)
    await ActivityEnvironment().run(acts.step, EnvStepInput(handle=handle(env_id=""), action="a"))  # an old handle
    assert old.timeouts == [("step", None)]


def test_a_handle_from_an_older_history_decodes_without_env_id() -> None:
    old = {"sandbox_id": "s", "container_id": "c", "host_queue": "q", "worker_id": "w", "image": "i"}
    assert SandboxHandle.model_validate(old).env_id == ""
