"""`python -m trajflow.lab.bench.gpu_check --json OUT` (or `trajflow bench gpu`): the HF engine and the trainer on a
GPU, through the project's own `trajflow/rl/` code, with SmolLM2-135M's architecture and random weights.

Meant for a machine that has a GPU but none of trajflow's services: it imports torch, transformers, accelerate,
safetensors and `rl`/`contracts` (pydantic) only: no temporalio, docker or boto3, no tokenizer files and no
weights (throughput and step time do not depend on the weights' values). SmolLM2's configuration is written
below (from the converted checkpoint's config.json, `trajflow.rl.models.ensure_smollm2`); the tokenizer is a word-level
one built here with one token per id, so every id the model can emit decodes.

It measures, on `--device` (default auto: the GPU when one is visible):
- decode: `trajflow.rl.engines.hf.HFEngine` generating `--new-tokens` tokens for a batch of 1, 16 and 64 random
  160-token prompts (sampled at T = 0.7, as the default job), in the dtype `trajflow.rl.engines.load.decode_precision`
  picks for the device; tokens/s = generated tokens / the engine's busy time;
- train: `trajflow.rl.trainer.PolicyTrainer` steps of the default config's shape (trajflow/configs/default.toml [train]:
  a batch of 16 episodes, micro_batch 8, train_last_layers 8, ppo_clip, autocast auto) on samples shaped like the
  default job's (`trajflow.lab.bench.torch_work`); the first step is a warm-up and is not counted.

`--quick` shrinks the model (2 blocks, hidden 64), the batches and the steps: a smoke test that the path runs
(the unit test runs it on the CPU), not a measurement. Python 3.11+ with torch, transformers, accelerate,
safetensors, tokenizers and pydantic; on a machine without pydantic, install its wheels first
(docs/stack.md, "GPU check").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}
"""SmolLM2-135M-Instruct's architecture (the converted checkpoint's config.json, weights aside)."""
QUICK = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip

DEFAULT_TRAIN = {"batch": 32, "micro_batch": 8, "train_last_layers": 8}
"""trajflow/configs/default.toml [train]: batch_size, trainer.micro_batch, trainer.train_last_layers (loss ppo_clip)."""


def build_random_model(out: Path, quick: bool) -> Path:
    """Write SmolLM2's architecture (or the quick one) with random weights (seed 0) and a word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    values = {**SMOLLM2_135M, **(QUICK if quick else {})}
    config = LlamaConfig(**{k: v for k, v in values.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
        eos_token=f"t{config.eos_token_id}",
        pad_token=f"t{config.pad_token_id}",
        unk_token="t0",
    )
    tokenizer.save_pretrained(out)
    return out


def check_decode(path: Path, device: str, batches: list[int], new_tokens: int) -> dict[str, Any]:
    import torch

    from trajflow.contracts.config import ModelConfig
    from trajflow.lab.bench.torch_work import decode_round, prompts
    from trajflow.rl.engines.hf import HFEngine
    from trajflow.rl.engines.load import decode_precision

    precision = decode_precision(ModelConfig(name_or_path=str(path)), device)

    async def run() -> list[dict[str, Any]]:
        engine = HFEngine(
            path, max_batch=max(batches), batch_wait_ms=20, device=device, dtype=getattr(torch, precision.dtype)
        )
        await engine.start()
        vocab, eos = int(engine.model.config.vocab_size), set(engine._eos)
        try:
            await decode_round(engine, prompts(2, vocab, seed=99, avoid=eos), 8)  # warm-up: kernels, allocator
            rows = []
            for n in batches:
                torch.manual_seed(n)
                r = await decode_round(engine, prompts(n, vocab, seed=n, avoid=eos), new_tokens)
                rows.append({"batch": n, "new_tokens": new_tokens, "tokens": r.tokens, "seconds": r.seconds,
                             "tokens_per_s": r.tokens_per_s})  # fmt: skip
            return rows
        finally:
            await engine.close()

    return {"dtype": precision.dtype, "dtype_reason": precision.reason, "batches": asyncio.run(run())}


def check_train(path: Path, device: str, batch: int, micro_batch: int, last_layers: int, steps: int) -> dict[str, Any]:
    from trajflow.contracts.training import TrainerConfig
    from trajflow.lab.bench.torch_work import episode_samples, median, time_steps
    from trajflow.rl.trainer import PolicyTrainer

    config = TrainerConfig(lr=5e-5, micro_batch=micro_batch, train_last_layers=last_layers, autocast="auto")
    trainer = PolicyTrainer(path, config, device=device)
    samples = episode_samples(batch, int(trainer.unwrapped_model.config.vocab_size))
    metrics: dict[str, float] = {}

    def step() -> None:
        metrics.update(trainer.train_step(samples))

    time_steps(step, samples, 1)  # warm-up
    timed = time_steps(step, samples, steps)
    seconds = [t.seconds for t in timed]
    return {
        "device": str(trainer.accelerator.device),
        "autocast": trainer.autocast.dtype,
        "autocast_reason": trainer.autocast.reason,
        "batch": batch,
        "micro_batch": micro_batch,
        "train_last_layers": last_layers,
        "tokens_per_step": timed[0].tokens,
        "step_s": seconds,
        "median_step_s": median(seconds),
        "loss_finite": all(v == v for v in metrics.values()),  # NaN != NaN
    }


def run(device: str, quick: bool, new_tokens: int | None = None, steps: int | None = None) -> dict[str, Any]:
    import torch

    from trajflow.rl import devices

    resolved = devices.resolve_device(device)
    devices.use_device(resolved)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trajflow-gpu-check-") as tmp:
        path = build_random_model(Path(tmp) / "smollm2-135m-random", quick)
        batches = [1, 4] if quick else [1, 16, 64]
        decode = check_decode(path, resolved, batches, new_tokens or (8 if quick else 128))
        shape = {"batch": 4, "micro_batch": 2, "train_last_layers": 1} if quick else DEFAULT_TRAIN
        train = check_train(path, resolved, shape["batch"], shape["micro_batch"], shape["train_last_layers"],
                            steps or (1 if quick else 5))  # fmt: skip
    return {
        "device": devices.describe(resolved),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "model": "SmolLM2-135M architecture, random weights" if not quick else "quick: 2 blocks, hidden 64",
        "quick": quick,
        "decode": decode,
        "train": train,
        "seconds": time.monotonic() - started,
    }


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['model']} on {report['device']} (torch {report['torch']}, CUDA {report['cuda']})",
             f"decode ({report['decode']['dtype']}):"]  # fmt: skip
    for row in report["decode"]["batches"]:
        took = f"{row['tokens']} tokens in {row['seconds']:.2f} s"
        lines.append(f"  batch {row['batch']:3}: {row['tokens_per_s']:9.1f} tok/s ({took})")
    t = report["train"]
    lines.append(
        f"train step (batch {t['batch']}, micro {t['micro_batch']}, last {t['train_last_layers']} blocks, "
        f"{t['tokens_per_step']} tokens, autocast {t['autocast']}): median {t['median_step_s']:.2f} s of {t['step_s']}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trajflow.lab.bench.gpu_check", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    parser.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    parser.add_argument(
        "--quick", action="store_true", help="a tiny model and batches: a smoke test, not a measurement"
    )
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens generated per request (default 128)")
    parser.add_argument("--steps", type=int, default=None, help="timed trainer steps (default 5)")
    args = parser.parse_args(argv)
    report = run(args.device, args.quick, args.new_tokens, args.steps)
    print(render(report), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
