"""OpenAIEngine against a real `vllm serve` (vLLM's OpenAI-compatible server, from the project's vLLM venv) serving
the tiny random Qwen2 model on CPU: tokens and per-token logprobs against a teacher-forced HF pass, sampling
parameters (temperature, max_new_tokens, EOS as a stop token), the API key, every class of error (server down,
unknown model, wrong key, a prompt over the server's context), and a whole trajectory through a decode worker
that uses the engine, with the real Temporal dev server, Docker sandboxes and reward service.

The tests run in the main venv; only the server runs from `.vllm-venv` (`make vllm-venv`; vLLM's pins clash
with the project's). Without that venv they skip, unless `TRAJFLOW_REQUIRE_VLLM=1` (CI sets it, after building
the venv), which turns the skip into a failure. One server (tests/integration/conftest.py) serves the session,
this module and `test_judge_vllm.py`: it takes one to three minutes to start on a shared 2-core CPU.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import free_port, running_stack
from tests.integration.vllm_serve import API_KEY, Server
from trajflow.contracts.config import OpenAIServerConfig
from trajflow.contracts.trajectory import SamplingParams, TrajectoryStatus
from trajflow.rl.engines.base import Engine, EngineMisconfigured, EngineRequestRejected, EngineUnavailable
from trajflow.rl.engines.openai import OpenAIEngine

pytestmark = pytest.mark.integration

VERSION = 3
"""The policy version the engine is configured to report (the served weights are the tiny model's)."""
LOGPROB_TOL = 1e-3
"""Max |server - HF| per token in float32 (vLLM's own test measures 1e-6 on this model)."""
PROMPTS = [[5, 6, 7, 8], [40, 41, 42], [100, 7, 250, 9, 12, 13], [300]]


def server_config(server: Server, **fields) -> OpenAIServerConfig:
    fields = {"base_url": server.base_url, "served_model": "tiny", "policy_version": VERSION, **fields}
    return OpenAIServerConfig(**fields)


@pytest.fixture(scope="module")
async def engine(vllm_server: Server):
    engine = OpenAIEngine(server_config(vllm_server), vllm_server.model_path, api_key=API_KEY, max_in_flight=8)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


class Teacher:
    """Teacher-forced float32 HF forward passes of the served checkpoint."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def logits(self, prompt: list[int], completion: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return self.model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()

    def logprobs(self, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
        """Each completion token's logprob under log_softmax(logits / T) (T = 1 for greedy)."""
        scaled = torch.log_softmax(self.logits(prompt, completion) / (temperature or 1.0), dim=-1)
        return scaled.gather(1, torch.tensor(completion)[:, None]).squeeze(1)


@pytest.fixture(scope="module")
def teacher(tiny_model: Path) -> Teacher:
    return Teacher(tiny_model)


def check_completion(engine: OpenAIEngine, completion, max_new_tokens: int) -> None:
    eos = {engine.tokenizer.eos_token_id}
    assert 0 < len(completion.token_ids) <= max_new_tokens
    assert len(completion.logprobs) == len(completion.token_ids)
    assert not eos & set(completion.token_ids[:-1]), "nothing may follow an EOS"
    if completion.finish_reason == "stop":
        assert completion.token_ids[-1] in eos
    else:
        assert completion.finish_reason == "length" and len(completion.token_ids) == max_new_tokens
    assert completion.text == engine.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    assert completion.policy_version == VERSION


async def test_engine_follows_the_protocol_and_reports_its_configured_version(engine: OpenAIEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.max_model_len == 512  # from the server's model list
    assert engine.available_version("") == engine.available_version("some-run") == VERSION


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
async def test_tokens_and_logprobs_match_a_teacher_forced_hf_pass(
    engine: OpenAIEngine, teacher: Teacher, temperature: float
) -> None:
    params = SamplingParams(temperature=temperature, max_new_tokens=24)
    completions = await asyncio.gather(*(engine.generate(p, params, "any-run") for p in PROMPTS))
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        check_completion(engine, completion, params.max_new_tokens)
        expected = teacher.logprobs(prompt, completion.token_ids, temperature)
        error = (torch.tensor(completion.logprobs) - expected).abs().max().item()
        assert error < LOGPROB_TOL, f"logprobs differ from HF by up to {error:.2e} at T={temperature}"
        if temperature == 0.0:
            argmax = teacher.logits(prompt, completion.token_ids).argmax(-1).tolist()
            assert completion.token_ids == argmax
    assert engine.stats()["max_in_flight"] >= len(PROMPTS)


async def test_max_new_tokens_and_eos_end_a_completion(
    vllm_server: Server, engine: OpenAIEngine, tmp_path: Path
) -> None:
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    full = await engine.generate(PROMPTS[0], greedy)
    short = await engine.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=5))
    assert (short.token_ids, short.finish_reason) == (full.token_ids[:5], "length")

    # A tokenizer whose model config names a token of that greedy continuation as an extra EOS: the engine sends
    # it as a stop token, the server stops there, and the completion keeps it ("stop").
    cut = next(i for i in range(2, len(full.token_ids)) if full.token_ids[i] not in full.token_ids[:i])
    stop_token = full.token_ids[cut]
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(vllm_server.model_path / name, tokenizer_dir / name)
    config = (vllm_server.model_path / "config.json").read_text()
    (tokenizer_dir / "config.json").write_text(
        config.replace('"eos_token_id": 2', f'"eos_token_id": [2, {stop_token}]')
    )
    stopping = OpenAIEngine(server_config(vllm_server), tokenizer_dir, api_key=API_KEY)
    try:
        await stopping.start()
        stopped = await stopping.generate(PROMPTS[0], greedy)
    finally:
        await stopping.close()
    assert (stopped.token_ids, stopped.finish_reason) == (full.token_ids[: cut + 1], "stop")
    assert stopped.logprobs == pytest.approx(full.logprobs[: cut + 1], abs=1e-5)


async def test_a_server_that_is_down_is_unavailable_with_a_clear_error(tiny_model: Path) -> None:
    down = OpenAIServerConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", served_model="tiny", startup_wait_s=0)
    engine = OpenAIEngine(down, tiny_model)
    try:
        with pytest.raises(EngineUnavailable, match=r"GET http://127\.0\.0\.1:\d+/v1/models: ConnectError"):
            await engine.start()
        with pytest.raises(EngineUnavailable, match="ConnectError") as raised:
            await engine.generate([5, 6], SamplingParams())
        assert raised.value.retryable
    finally:
        await engine.close()


async def test_unknown_model_and_wrong_key_are_misconfigurations(vllm_server: Server) -> None:
    unknown = OpenAIEngine(server_config(vllm_server, served_model="smollm2"), vllm_server.model_path, api_key=API_KEY)
    wrong_key = OpenAIEngine(server_config(vllm_server), vllm_server.model_path, api_key="not-the-key")
    try:
        with pytest.raises(EngineMisconfigured, match=r"serves \['tiny'\], not 'smollm2'"):
            await unknown.start()
        with pytest.raises(EngineMisconfigured, match="answered 401") as raised:
            await wrong_key.start()
        assert not raised.value.retryable
    finally:
        await unknown.close()
        await wrong_key.close()


async def test_a_prompt_over_the_servers_context_is_rejected(engine: OpenAIEngine) -> None:
    with pytest.raises(EngineRequestRejected, match="maximum context length is 512") as raised:
        await engine.generate([5] * 600, SamplingParams(max_new_tokens=4))
    assert not raised.value.retryable


async def test_a_decode_worker_with_the_engine_runs_a_trajectory(
    temporal_env, reward_service, store, sandbox_manager, engine: OpenAIEngine
):
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as stack:
        result = await stack.run(stack.request(seed=11, max_turns=3))
        # A system prompt longer than the server's context (its max_model_len, the engine's positions): the first
        # prompt leaves no room in the context budget, which is the trajectory's fault, so it fails at once (not
        # retried, not infra-failed), naming the budget, before the server is asked (its own refusal of such a
        # request is test_a_prompt_over_the_servers_context_is_rejected's).
        too_long = await stack.run(stack.request(seed=12, system_prompt="guess " * 600))
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert result.policy_version == VERSION
    from trajflow.contracts.records import TrajectoryRecord

    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    ctx = record.context
    assert ctx is not None and ctx.turn_versions == [VERSION] * result.turns
    assert len(ctx.token_ids) == len(ctx.logprobs) == len(ctx.loss_mask)
    assert sum(ctx.loss_mask) == sum(t.completion_tokens for t in record.turns) > 0
    assert all(lp < 0.0 for lp, m in zip(ctx.logprobs, ctx.loss_mask, strict=True) if m)

    assert engine.max_positions == 512  # the server's max_model_len, read by start()
    assert too_long.status is TrajectoryStatus.FAILED and too_long.reward is None
    assert "leaves no room in the context budget (the model's positions)" in (too_long.error or "")
