"""An agent on the OpenAI Agents SDK (PyPI `openai-agents`), unmodified, trained by trajflow as
`agent:calc_agent:solve`: it answers an arithmetic question with two function tools, `add` and `multiply`.

The SDK is used as its documentation shows: an `Agent` with instructions and `@function_tool`s, run by
`Runner.run` (non-streaming; `task = {"stream": true}` runs it with `Runner.run_streamed` instead). It talks to its
model over OpenAI's Responses API at OPENAI_BASE_URL, which in trajflow's sandbox is the env's endpoint: every model
call the SDK makes is one turn of the trajectory. Configuration only, no patch: tracing off (it would post traces to
api.openai.com; the sandbox has no network), and a client without retries (a retried request would reach the policy
as a second turn) and with a long timeout (a request may wait in the decode queue).

`solve(task, seed)`: the question `(a + b) * c` with a, b, c from the seed. Reward 1.0 when the last integer of the
agent's final answer is the right value, else 0.0; a run that hits `max_turns` (6 model calls: two tool calls and an
answer need three) earns 0.0, and so does an answer the SDK refuses (`ModelBehaviorError`: one cut at `max_tokens`, a
call of an unknown tool, arguments that are not JSON): the policy's doing, so scored, never a crash. Info: the
answer, the expected value, the model calls and the tool calls made.
`task` is None or an object (or its JSON text) with any of `max_turns`, `max_tokens` (per call, 128) and `stream`.

Deterministic given its seed and the model's answers (trajflow restores a lost sandbox by replaying them).
"""

# The sandbox's env layer installs `openai-agents` from requirements.txt; the project's own environment need not.
# pyright: reportMissingImports=false

from __future__ import annotations

import json
import re
from typing import Any

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    ModelSettings,
    Runner,
    ToolCallItem,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

INSTRUCTIONS = (
    "You are a careful calculator. Use the tools for every operation: `add` for sums, `multiply` for products. "
    "When you have the result, answer with one sentence that ends with the number."
)
OPTIONS: dict[str, Any] = {"max_turns": 6, "max_tokens": 128, "stream": False}


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@function_tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def question(seed: int) -> tuple[str, int]:
    """The seed's question and its answer."""
    a, b, c = 2 + seed % 7, 3 + (seed // 7) % 5, 2 + (seed // 35) % 4
    return f"What is ({a} + {b}) * {c}?", (a + b) * c


async def solve(task: Any, seed: int) -> dict[str, Any]:
    options = {**OPTIONS, **_options(task)}
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(max_retries=0, timeout=3600.0), use_for_tracing=False)
    agent = Agent(
        name="calculator",
        instructions=INSTRUCTIONS,
        tools=[add, multiply],
        model="policy",
        model_settings=ModelSettings(max_tokens=options["max_tokens"]),
    )
    text, expected = question(seed)
    try:
        if options["stream"]:
            result: Any = Runner.run_streamed(agent, text, max_turns=options["max_turns"])
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, text, max_turns=options["max_turns"])
    except MaxTurnsExceeded:
        return {"reward": 0.0, "info": {"answer": None, "expected": expected, "why": "max_turns"}}
    except ModelBehaviorError as e:  # the policy's answer: cut at max_tokens, an unknown tool, arguments not JSON
        return {"reward": 0.0, "info": {"answer": None, "expected": expected, "why": str(e)[:200]}}
    answer = str(result.final_output)
    numbers = re.findall(r"-?\d+", answer)
    right = bool(numbers) and int(numbers[-1]) == expected
    tool_calls = sum(isinstance(item, ToolCallItem) for item in result.new_items)
    info = {"answer": answer[:200], "expected": expected, "model_calls": len(result.raw_responses)}
    return {"reward": 1.0 if right else 0.0, "info": {**info, "tool_calls": tool_calls}}


def _options(task: Any) -> dict[str, Any]:
    if isinstance(task, str):
        task = json.loads(task)
    if task is None:
        return {}
    if not isinstance(task, dict) or not task.keys() <= OPTIONS.keys():
        raise ValueError(f"task must be null or an object with any of {sorted(OPTIONS)}, not {task!r}")
    return task
