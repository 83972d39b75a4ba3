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
  picks for the device; tokens/s = generated tokens / the engine's busy time, of the second round at that batch size
  (the first, reported beside it, pays once for each new shape; `decode_rounds`);
- train: `trajflow.rl.trainer.PolicyTrainer` steps of the default config's shape, read from
  trajflow/configs/default.toml's [train] (`default_train`: batch_size episodes a step, and its trainer settings as
  they are: micro_batch, train_last_layers, loss, lr, autocast) on samples shaped like the default job's
  (`trajflow.lab.bench.torch_work`); the first step is a warm-up and is not counted.

`tests/gpu/test_gpu_smollm2.py` (`make test-gpu`) runs the same builders and rounds on CUDA and asserts on what they
return.

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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajflow.contracts.trainer import TrainerConfig
    from trajflow.lab.bench.torch_work import DecodeRound
    from trajflow.rl.engines.base import Completion
    from trajflow.rl.engines.hf import HFEngine
    from trajflow.rl.engines.vllm import VLLMEngine
    from trajflow.rl.precision import Precision
    from trajflow.rl.samples import TrainSample
    from trajflow.rl.trainer import PolicyTrainer

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
QUICK = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


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


def decode_engine(path: Path, device: str, max_batch: int) -> tuple[HFEngine, Precision]:
    """The HF engine on `path` and `device` in the dtype the decode workers would pick there (not started)."""
    import torch

    from trajflow.contracts.config import ModelConfig
    from trajflow.rl.engines.hf import HFEngine
    from trajflow.rl.engines.load import decode_precision

    precision = decode_precision(ModelConfig(name_or_path=str(path)), device)
    engine = HFEngine(path, max_batch=max_batch, batch_wait_ms=20, device=device, dtype=getattr(torch, precision.dtype))
    return engine, precision


async def decode_rounds(
    engine: HFEngine | VLLMEngine, batches: list[int], new_tokens: int, first_rounds: list[DecodeRound] | None = None
) -> list[tuple[DecodeRound, list[Completion]]]:
    """On a started engine: a warm-up round of 2 prompts, then two rounds a batch size, each of that many random
    160-token prompts sent at once (seeded by the batch size; other prompts in the first), sampled at T = 0.7. The
    second round is the one returned: the first at a batch size pays once for what each new shape costs the first time
    (on an H200 it ran at a third of the second's speed, HF engine, SmolLM2's architecture), which a serving engine
    pays once in its life. The first rounds are appended to `first_rounds` where given."""
    import torch
    from transformers import AutoConfig

    from trajflow.lab.bench.torch_work import generate_round, prompts

    vocab = int(AutoConfig.from_pretrained(engine.model_path).vocab_size)
    eos = set(engine._eos)
    await generate_round(engine, prompts(2, vocab, seed=99, avoid=eos), 8)
    rounds = []
    for n in batches:
        torch.manual_seed(n)
        first, _ = await generate_round(engine, prompts(n, vocab, seed=10_000 + n, avoid=eos), new_tokens)
        if first_rounds is not None:
            first_rounds.append(first)
        rounds.append(await generate_round(engine, prompts(n, vocab, seed=n, avoid=eos), new_tokens))
    return rounds


def check_decode(path: Path, device: str, batches: list[int], new_tokens: int) -> dict[str, Any]:
    engine, precision = decode_engine(path, device, max(batches))

    first: list[DecodeRound] = []

    async def run() -> list[tuple[DecodeRound, list[Completion]]]:
        await engine.start()
        try:
            return await decode_rounds(engine, batches, new_tokens, first)
        finally:
            await engine.close()

    rows = [
        {
            "batch": r.batch,
            "new_tokens": r.new_tokens,
            "tokens": r.tokens,
            "seconds": r.seconds,
            "tokens_per_s": r.tokens_per_s,
            "first_round_tokens_per_s": cold.tokens_per_s,
        }
        for (r, _), cold in zip(asyncio.run(run()), first, strict=True)
    ]
    return {"dtype": precision.dtype, "dtype_reason": precision.reason, "batches": rows}


def default_train(quick: bool) -> tuple[int, TrainerConfig]:
    """The default job's step: default.toml's batch_size and its trainer settings as they are. `quick`: 4 episodes,
    micro-batches of 2, the last block only (the quick model has 2)."""
    from trajflow.contracts.config import load_run_config

    train = load_run_config("default").train
    if quick:
        return 4, train.trainer.model_copy(update={"micro_batch": 2, "train_last_layers": 1})
    return train.batch_size, train.trainer


def default_trainer(path: Path, device: str, quick: bool) -> tuple[PolicyTrainer, list[TrainSample]]:
    """A `PolicyTrainer` on `path` and `device` with the default job's trainer settings, and a batch of the default
    job's size shaped like its episodes (`default_train`)."""
    from trajflow.lab.bench.torch_work import episode_samples
    from trajflow.rl.trainer import PolicyTrainer

    batch, config = default_train(quick)
    trainer = PolicyTrainer(path, config, device=device)
    return trainer, episode_samples(batch, int(trainer.unwrapped_model.config.vocab_size))


def time_train(trainer: PolicyTrainer, samples: list[TrainSample], steps: int) -> dict[str, Any]:
    """One warm-up step, then `steps` timed steps; the figures and the trainer's settings."""
    from trajflow.lab.bench.torch_work import median, time_steps

    metrics: dict[str, float] = {}

    def step() -> None:
        metrics.update(trainer.train_step(samples))

    time_steps(step, samples, 1)  # warm-up
    timed = time_steps(step, samples, steps)
    seconds = [t.seconds for t in timed]
    config = trainer.config
    return {
        "device": str(trainer.accelerator.device),
        "autocast": trainer.autocast.dtype,
        "autocast_reason": trainer.autocast.reason,
        "batch": len(samples),
        "micro_batch": config.micro_batch,
        "train_last_layers": config.train_last_layers,
        "loss": config.loss.kind,
        "lr": config.lr,
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
        trainer, samples = default_trainer(path, resolved, quick)
        train = time_train(trainer, samples, steps or (1 if quick else 5))
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
    lines = [
        f"{report['model']} on {report['device']} (torch {report['torch']}, CUDA {report['cuda']})",
        f"decode ({report['decode']['dtype']}):",
    ]
    for row in report["decode"]["batches"]:
        took = (
            f"{row['tokens']} tokens in {row['seconds']:.2f} s; the first round {row['first_round_tokens_per_s']:.1f}"
        )
        lines.append(f"  batch {row['batch']:3}: {row['tokens_per_s']:9.1f} tok/s ({took})")
    t = report["train"]
    lines.append(
        f"train step (batch {t['batch']}, micro {t['micro_batch']}, last {t['train_last_layers']} blocks, {t['loss']}, "
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
