"""An agent's turn as the trajectory workflow reads it (`trajflow.contracts.agent`): the request the sandbox's
endpoint normalised (`trajflow.envs.agent_http.normalize_request`, the real one) becomes the decode request, and the
model's answer the action the endpoint parses back (`trajflow.envs.agent_http.parse_action`, the real one)."""

from __future__ import annotations

import json

import pytest

from trajflow.contracts.agent import AGENT_PREFIX, AgentRequest, AgentRequestError, answer_action, is_agent
from trajflow.contracts.base import ChatMessage, ToolCall, ToolFunction
from trajflow.contracts.trajectory import SamplingParams
from trajflow.envs import runner
from trajflow.envs.agent_http import normalize_request, parse_action


def observation(**body) -> str:
    request = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], **body}
    normalized, _, _ = normalize_request(json.dumps(request).encode(), call=3)
    return json.dumps(normalized, sort_keys=True)


def test_a_request_becomes_the_decode_input_with_the_tasks_sampling_and_its_max_tokens_as_a_cap():
    obs = observation(
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "what is "}, {"type": "text", "text": "2+2?"}]},
        ],
        temperature=0.1,
        max_tokens=20,
    )
    request = AgentRequest.parse(obs)
    assert request.call == 3
    task = SamplingParams(temperature=0.9, max_new_tokens=48, seed=7)
    inp = request.generate_input("wf/run", 2, "s3://ctx", task, min_policy_version=4, policy="run-1")
    assert inp.messages == [
        ChatMessage(role="system", content="be brief"),
        ChatMessage(role="user", content="what is 2+2?"),
    ]
    assert inp.user_message == "" and inp.context_uri == "s3://ctx" and inp.turn == 2
    assert inp.sampling.temperature == 0.9, "the run's behaviour policy samples, not the program's temperature"
    assert inp.sampling.max_new_tokens == 20
    assert inp.sampling.seed == task.for_turn(2).seed
    assert (inp.min_policy_version, inp.policy) == (4, "run-1")
    # a cap, never a raise above the task's budget
    big = AgentRequest.parse(observation(max_completion_tokens=4000)).generate_input("w", 0, None, task)
    assert big.sampling.max_new_tokens == 48
    assert inp.stop is None
    stops = AgentRequest.parse(observation(stop="Observation:")).generate_input("w", 0, None, task)
    assert stops.stop == ["Observation:"], "one string is a list of one, as the endpoint normalises it"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "expected up to 4 non-empty strings"),
        ({"stop": [""]}, "expected up to 4 non-empty strings"),
        ({"max_tokens": 0}, "max_tokens=0"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]}, "tool_calls[0] must"),
        ({"messages": [{"role": "function", "content": "x", "name": "f"}]}, "'function' message"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "'image_url' part"),
    ],
)
def test_a_request_the_policy_cannot_answer_is_refused_saying_why(body, says):
    with pytest.raises(AgentRequestError, match="chat request 3") as err:
        AgentRequest.parse(observation(**body))
    assert says in str(err.value)


TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]


def test_tools_tool_calls_and_tool_results_go_to_the_decode_input():
    call = {"id": "call_0_0", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
    messages = [
        {"role": "user", "content": "list it"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0_0", "content": "a.txt"},
    ]
    inp = AgentRequest.parse(observation(messages=messages, tools=TOOLS)).generate_input("w", 1, None, SamplingParams())
    assert inp.tools == TOOLS
    assert inp.messages == [
        ChatMessage(role="user", content="list it"),
        ChatMessage(
            role="assistant",
            content="",
            tool_calls=[ToolCall(id="call_0_0", function=ToolFunction(name="ls", arguments='{"path": "."}'))],
        ),
        ChatMessage(role="tool", content="a.txt", tool_call_id="call_0_0"),
    ]
    plain = AgentRequest.parse(observation()).generate_input("w", 0, None, SamplingParams())
    assert plain.tools is None and plain.messages == [ChatMessage(role="user", content="hi")]


def test_an_answer_with_tool_calls_is_read_back_as_the_program_echoes_it():
    calls = [ToolCall(id="call_2_0", function=ToolFunction(name="ls", arguments='{"path": "."}'))]
    answer = parse_action(answer_action("", "tool_calls", 10, 5, calls))
    assert answer.content is None and answer.finish_reason == "tool_calls"
    assert answer.tool_calls == [c.model_dump() for c in calls]
    # the program's next request echoes the assistant message: it reads back as the context's message
    echoed = {"role": "assistant", "content": answer.content, "tool_calls": answer.tool_calls}
    request = AgentRequest.parse(observation(messages=[{"role": "user", "content": "hi"}, echoed], tools=TOOLS))
    assert request.messages[1] == ChatMessage(role="assistant", content="", tool_calls=calls)
    assert "tool_calls" not in json.loads(answer_action("hi", "stop", 1, 1)), "a plain answer is as before"


def test_an_observation_that_is_not_a_request_is_refused():
    with pytest.raises(AgentRequestError, match="not JSON"):
        AgentRequest.parse("You guessed 5: higher")
    with pytest.raises(AgentRequestError, match="no messages"):
        AgentRequest.parse('{"call": 1}')


def test_the_answer_is_an_action_the_endpoint_reads_back():
    action = answer_action('{"not": "an answer"}', "length", 30, 7)
    answer = parse_action(action)
    assert answer.content == '{"not": "an answer"}', "a model's JSON reply stays text"
    assert answer.finish_reason == "length"
    assert answer.usage == {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37}
    assert parse_action(answer_action("hi", "eos?", 1, 1)).finish_reason == "stop"
    assert is_agent("agent:repo_agent:solve") and not is_agent("py:m:C")
    assert vars(runner)["env_ids"].AGENT_PREFIX is AGENT_PREFIX


def test_the_workflows_budget_is_the_runners():
    from trajflow.contracts.agent import DEFAULT_BUDGET_S, budget_s, call_s
    from trajflow.envs.agent import DEFAULT_BUDGET_S as RUNNER_BUDGET_S

    assert DEFAULT_BUDGET_S == RUNNER_BUDGET_S
    assert budget_s({}) == DEFAULT_BUDGET_S and budget_s({"budget_s": 5}) == 5.0
    assert budget_s({"budget_s": True}) == budget_s({"budget_s": -1}) == DEFAULT_BUDGET_S
    assert call_s({"budget_s": 5}) == 35.0
    assert call_s({"budget_s": 5, "verifier": "check:verify"}) == 40.0  # the verifier's budget after the last call
