"""Tool calls in a model's completion, and whether a model's chat template can render tools at all.

`parse_tool_calls` reads the Hermes/Qwen format: each call a `<tool_call>` block holding one JSON object
`{"name": ..., "arguments": {...}}`, closed by `</tool_call>`, anywhere in the completion. Their ids are deterministic
(`call_<turn>_<i>`), so an agent program re-run on its recorded answers asks the same next request. A block whose JSON
does not parse (or has no string `name`) is left in the text, as the model wrote it; so is an unclosed one.

`supports_tools` decides whether a tokenizer's chat template renders tools: its source mentions `tools`. That is a
heuristic (a template could mention the word and ignore it) but it tells SmolLM2's ChatML, which has none, from
Qwen's, Hermes' or Llama 3's, which do. `require_tools` raises `ToolsUnsupported` otherwise.

Not covered: other tool-call formats (Llama 3's `<|python_tag|>`, Mistral's `[TOOL_CALLS]`); tool calls in a
completion cut by `max_new_tokens` mid-block (left as text); `tool_choice` (the model decides).
"""

from __future__ import annotations

import json
import re
from typing import Any

from trajflow.contracts.base import ToolCall, ToolFunction

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class ToolsUnsupported(ValueError):
    """A request with tools (or tool calls, or tool results) for a model whose chat template has no tools."""


def supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders tools (its source mentions `tools`)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: a `tool_use` one, or any that mentions tools
        return any("tools" in str(t) for t in template.values())
    return isinstance(template, str) and "tools" in template


def require_tools(tokenizer: Any, model: str) -> None:
    """Raise ToolsUnsupported (saying which model) unless the tokenizer's chat template renders tools."""
    if not supports_tools(tokenizer):
        raise ToolsUnsupported(
            f"the model's chat template ({model}) has no tools: it cannot render a request's tools, tool calls or "
            "tool results. Use a model whose chat template renders tools (e.g. Qwen2.5's, Hermes'), or have the "
            "program read actions from the reply's text; a task whose program passes tools declares `tools = true` "
            "so that this is refused at submission"
        )


def _call(block: str, turn: int, index: int) -> ToolCall | None:
    try:
        parsed = json.loads(block)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return None
    arguments = parsed.get("arguments", {})
    if isinstance(arguments, str):  # already a JSON string (some models write it so)
        text = arguments
    else:
        text = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=f"call_{turn}_{index}", function=ToolFunction(name=parsed["name"], arguments=text))


def parse_tool_calls(text: str, turn: int) -> tuple[str, list[ToolCall]]:
    """The completion's text without its parsed tool-call blocks (stripped), and the calls in order."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in _BLOCK.finditer(text):
        call = _call(match.group(1), turn, len(calls))
        if call is None:
            continue
        calls.append(call)
        kept.append(text[position : match.start()])
        position = match.end()
    if not calls:
        return text, []
    kept.append(text[position:])
    return "".join(kept).strip(), calls
