"""Whether a submission's tasks that pass tools (`tools = true`) can run on its model: the model's chat template must
render tools (`trajflow.rl.tool_calls.supports_tools`). The tokenizer is read as the workers resolve
`[model] name_or_path` (`trajflow.rl.models.resolve_model`: `smollm2` is converted once if it is not cached yet)."""

from __future__ import annotations

from collections.abc import Callable

from trajflow.contracts.config import RunConfig
from trajflow.contracts.tasks import TaskConfig
from trajflow.infra.settings import load_settings


def tools_refusal(config: RunConfig, tasks: list[TaskConfig], say: Callable[[str], None]) -> str | None:
    """Why `tasks` cannot run on the config's model (the first task that passes tools, named), or None."""
    names = [t.name for t in tasks if t.tools]
    if not names:
        return None
    from transformers import AutoTokenizer

    from trajflow.rl.models import resolve_model, use_chat_template
    from trajflow.rl.tool_calls import supports_tools

    name = config.model.name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(name, load_settings().cache_dir / "models", say))
    except ValueError as e:
        return str(e)
    use_chat_template(tokenizer, config.model.chat_template)
    if supports_tools(tokenizer):
        return None
    return (
        f"task {names[0]!r} passes tools (tools = true) but the model's chat template ({name}) has none: it cannot "
        "render tools, tool calls or tool results. Use a model whose chat template renders tools ([model] "
        'name_or_path, e.g. a local Qwen2.5 checkpoint, or [model] chat_template = "hermes-tools"), or have the '
        "program read actions from the reply's text and drop `tools = true`"
    )
