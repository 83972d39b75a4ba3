"""A tool-using agent program for tests/integration/test_agent_tools.py (stdlib only): it passes a `read_file` tool,
runs the tool call the model answers with on its own tiny file table, sends the result back as a `tool` message
and is rewarded 1 when the model's final answer is the file's text."""

import json
import os
import urllib.request

FILES = {"a.txt": "hello"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


def chat(messages: list) -> dict:
    body = {"model": "policy", "messages": messages, "tools": TOOLS, "max_tokens": 128}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["choices"][0]


def solve(task, seed):
    messages = [{"role": "user", "content": "What does a.txt say?"}]
    choice = chat(messages)
    calls = choice["message"].get("tool_calls") or []
    if choice["finish_reason"] != "tool_calls" or not calls:
        return {"reward": 0.0, "info": {"why": "no tool call"}}
    messages.append(choice["message"])  # echoed as the endpoint gave it: content null, its tool calls
    for call in calls:
        path = json.loads(call["function"]["arguments"]).get("path")
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": FILES.get(path, "no such file")})
    final = chat(messages)
    return {"reward": 1.0 if (final["message"]["content"] or "").strip() == "hello" else 0.0, "info": {"calls": 2}}
