"""Agent programs that misbehave, each in one way, for tests/integration/test_agent_trajectory.py: packed as an
`agent:` env's env_path (stdlib only) and run in the real sandbox. `ask` is the well-behaved one they build on."""

import json
import os
import sys
import time
import urllib.error
import urllib.request


def post(body: dict) -> dict:
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def say(messages: list) -> str:
    return post({"model": "policy", "messages": messages, "max_tokens": 16})["choices"][0]["message"]["content"]


def ask(task, seed):
    """Two calls, the second extending the first; reward 1 when the second answer is "yes"."""
    messages = [{"role": "user", "content": f"question {seed}: {task}"}]
    messages += [{"role": "assistant", "content": say(messages)}, {"role": "user", "content": "sure?"}]
    return {"reward": 1.0 if say(messages).strip() == "yes" else 0.0, "info": {"calls": 2}}


def crash(task, seed):
    say([{"role": "user", "content": "first"}])
    print("the agent broke here", file=sys.stderr)
    raise RuntimeError("boom")


def hang(task, seed):
    say([{"role": "user", "content": "first"}])
    time.sleep(3600)


def malformed(task, seed):
    try:
        post({"model": "policy", "messages": "not a list"})
    except urllib.error.HTTPError as e:
        print(e.read().decode(), file=sys.stderr)
        raise


def silent(task, seed):
    return 1.0


def restless(task, seed):
    """Asks something new on every run: it cannot be restored by replaying its record."""
    messages = [{"role": "user", "content": f"the time is {time.time_ns()}"}]
    messages += [{"role": "assistant", "content": say(messages)}, {"role": "user", "content": "again"}]
    say(messages)
    return 0.0


def react(task, seed):
    """One call with a stop sequence, as a ReAct loop makes it: reward 1 when the answer ends before it."""
    body = {"model": "policy", "messages": [{"role": "user", "content": "act"}], "stop": ["Observation:"]}
    answer = post(body)["choices"][0]
    return 1.0 if (answer["message"]["content"], answer["finish_reason"]) == ("Action: ls\n", "stop") else 0.0


def _post_to(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def ask_messages(task, seed):
    """`ask` over Anthropic's Messages API (as Claude Code speaks it), with a system prompt."""
    url = os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages"
    messages = [{"role": "user", "content": f"question {seed}: {task}"}]
    first = _post_to(url, {"model": "m", "max_tokens": 16, "system": "Answer.", "messages": messages})
    messages += [{"role": "assistant", "content": first["content"]}, {"role": "user", "content": "sure?"}]
    second = _post_to(url, {"model": "m", "max_tokens": 16, "system": "Answer.", "messages": messages})
    said = "".join(block.get("text", "") for block in second["content"])
    return {"reward": 1.0 if said.strip() == "yes" else 0.0, "info": {"calls": 2}}


def ask_responses(task, seed):
    """`ask` over OpenAI's Responses API (as the Codex CLI speaks it), with instructions."""
    url = os.environ["OPENAI_BASE_URL"] + "/responses"
    items = [{"role": "user", "content": f"question {seed}: {task}"}]
    first = _post_to(url, {"model": "m", "instructions": "Answer.", "input": items, "max_output_tokens": 16})
    items += [*first["output"], {"role": "user", "content": "sure?"}]
    second = _post_to(url, {"model": "m", "instructions": "Answer.", "input": items, "max_output_tokens": 16})
    said = "".join(p["text"] for item in second["output"] if item["type"] == "message" for p in item["content"])
    return {"reward": 1.0 if said.strip() == "yes" else 0.0, "info": {"calls": 2}}
