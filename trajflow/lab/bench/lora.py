"""`trajflow bench lora`: what LoRA costs against the last-k-blocks option, per trainer step, on this machine; and
what computing logits only from the first loss token on saves.

Two ways to train part of the default config's model (trajflow/configs/default.toml: SmolLM2-135M, a batch of 16
episodes, micro_batch 8, ppo_clip, autocast `auto`), and the first of them the way the trainer worked before:

- `last-blocks`: the config as it is, `train_last_layers` = 8 of 30 blocks (the backward pass stops at block 22);
- `lora`: `train_last_layers` = 0 and `lora` = rank 16 (alpha 32) on every attention and MLP projection of every
  block (`trajflow.rl.lora`), so the backward pass runs through all 30 blocks, but only the adapters get weight
  gradients and AdamW state;
- `every-logit`: `last-blocks` with the LM head (and log-softmax) at every position, prompt included, as the
  trainer computed them before `trajflow.rl.updates.first_loss_column` (this process replaces that function with one
  that answers 0), so the saving is measured side by side.

Each option runs in a fresh process (so peak memory is its own): it builds `trajflow.rl.trainer.PolicyTrainer`, takes
one warm-up step and `--steps` timed ones on samples shaped like the default task's episodes
(`trajflow.lab.bench.torch_work`: 220 to 400 tokens, random ids), then writes a checkpoint and exports the weights once,
as the trainer worker does after every step. Reported per option: trainable parameters, step seconds (each and median),
peak resident memory (`resource.getrusage` maxrss) after building the trainer and after the steps, checkpoint and export
seconds and bytes. The load average before and after says how busy the machine was.

Limits: one machine, whatever else runs on it; torch's default threads (every core) in each process; random
token ids (step time depends on shapes, not values); maxrss is the process's peak resident set, not a breakdown
(model, activations, logits, optimizer state together). `--quick` uses the tiny random model: a smoke test of
the path, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trajflow.infra.processes import python_module, same_code_env

OPTIONS = ("last-blocks", "lora", "every-logit")
DEFAULT_CONFIG = "default"
"""The shipped config whose trainer settings the options share."""


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def trainer_config(option: str, quick: bool, rank: int) -> tuple[Any, int]:
    """The option's trainer config and batch size: the default config's (or a tiny shape with `quick`)."""
    from trajflow.contracts.config import load_run_config
    from trajflow.contracts.training import LoraConfig

    train = load_run_config(DEFAULT_CONFIG).train
    base, batch = train.trainer, train.batch_size
    if quick:
        base, batch = base.model_copy(update={"micro_batch": 2, "train_last_layers": 1}), 4
    if option in ("last-blocks", "every-logit"):
        return base, batch
    if option == "lora":
        return base.model_copy(update={"train_last_layers": 0, "lora": LoraConfig(rank=rank, alpha=2 * rank)}), batch
    raise ValueError(f"unknown option {option!r}; use one of {OPTIONS}")


def child(option: str, model: Path, steps: int, quick: bool, rank: int) -> dict[str, Any]:
    """Run one option in this process (see the module docstring) and return its figures."""
    from trajflow.lab.bench.torch_work import episode_samples, median, time_steps
    from trajflow.rl.precision import choose_precision
    from trajflow.rl.trainer import PolicyTrainer

    config, batch = trainer_config(option, quick, rank)
    if option == "every-logit":
        from trajflow.rl import updates

        updates.first_loss_column = lambda mask: 0  # every position through the LM head, as before
    rss_start = _maxrss_mib()
    started = time.perf_counter()
    trainer = PolicyTrainer(model, config, device="cpu")
    build_s = time.perf_counter() - started
    rss_built = _maxrss_mib()
    trainable = sum(p.numel() for group in trainer.optimizer.param_groups for p in group["params"])
    samples = episode_samples(batch, int(trainer.tokenizer.vocab_size))
    losses: list[float] = []

    def step() -> None:
        losses.append(trainer.train_step(samples)["loss"])

    warmup = time_steps(step, samples, 1)[0]
    timed = time_steps(step, samples, steps)
    rss_steps = _maxrss_mib()
    export_dtype = choose_precision("cpu").dtype
    with tempfile.TemporaryDirectory(prefix="trajflow-bench-lora-") as tmp:
        started = time.perf_counter()
        trainer.save_checkpoint(Path(tmp) / "checkpoint")
        checkpoint_s = time.perf_counter() - started
        started = time.perf_counter()
        trainer.export_weights(Path(tmp) / "export", export_dtype)
        export_s = time.perf_counter() - started
        checkpoint_bytes, export_bytes = _bytes(Path(tmp) / "checkpoint"), _bytes(Path(tmp) / "export")
    seconds = [t.seconds for t in timed]
    return {
        "option": option,
        "trainer": config.model_dump(mode="json"),
        "batch": batch,
        "tokens_per_step": timed[0].tokens,
        "autocast": trainer.autocast.dtype,
        "trainable_params": trainable,
        "build_s": build_s,
        "warmup_step_s": warmup.seconds,
        "step_s": seconds,
        "median_step_s": median(seconds),
        "losses_finite": all(v == v for v in losses),  # NaN != NaN
        "maxrss_start_mib": rss_start,
        "maxrss_built_mib": rss_built,
        "maxrss_steps_mib": rss_steps,
        "checkpoint_s": checkpoint_s,
        "checkpoint_bytes": checkpoint_bytes,
        "export_dtype": export_dtype,
        "export_s": export_s,
        "export_bytes": export_bytes,
        "threads": _threads(),
    }


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _run_child(option: str, model: Path, steps: int, quick: bool, rank: int) -> dict[str, Any]:
    argv = python_module("trajflow.lab.bench.lora", "--child", option, "--model", str(model), "--steps", str(steps))
    argv += ["--rank", str(rank), *(["--quick"] if quick else [])]
    done = subprocess.run(argv, env=same_code_env(dict(os.environ)), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench lora: the {option} process exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(models_dir: Path, steps: int, quick: bool, rank: int) -> dict[str, Any]:
    """Every option in a fresh process, one after another; the report."""
    import torch

    from trajflow.rl.models import resolve_model

    model = resolve_model("tiny" if quick else "smollm2", models_dir)
    load_before = os.getloadavg()
    started = time.monotonic()
    results = [_run_child(option, model, steps, quick, rank) for option in OPTIONS]
    return {
        "model": "tiny random Qwen2 (quick)" if quick else "SmolLM2-135M-Instruct",
        "quick": quick,
        "machine": platform.processor() or platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "load_before": list(load_before),
        "load_after": list(os.getloadavg()),
        "options": results,
        "seconds": time.monotonic() - started,
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"{report['model']} on {report['machine']} ({report['cores']} cores, {report['cpu_capability']}), "
        f"load average before {report['load_before'][0]:.2f}, after {report['load_after'][0]:.2f}",
        f"{'option':<12} {'trainable':>11} {'step s (median)':>16} {'peak RSS MiB':>13} {'after build':>12} "
        f"{'ckpt MB':>8} {'ckpt s':>7} {'export s':>9}",
    ]
    for r in report["options"]:
        lines.append(
            f"{r['option']:<12} {r['trainable_params']:>11,} {r['median_step_s']:>16.2f} "
            f"{r['maxrss_steps_mib']:>13.0f} "
            f"{r['maxrss_built_mib']:>12.0f} {r['checkpoint_bytes'] / 1e6:>8.1f} {r['checkpoint_s']:>7.2f} "
            f"{r['export_s']:>9.2f}"
        )
    first = report["options"][0]
    steps = "; ".join(f"{r['option']} {[round(s, 2) for s in r['step_s']]}" for r in report["options"])
    lines.append(
        f"batch {first['batch']} ({first['tokens_per_step']} tokens), micro_batch {first['trainer']['micro_batch']}, "
        f"autocast {first['autocast']}, {first['threads']} threads; step seconds after one warm-up step each: {steps}"
    )
    rows = {r["option"]: r for r in report["options"]}
    if "every-logit" in rows:
        ratio = rows["every-logit"]["median_step_s"] / rows["last-blocks"]["median_step_s"]
        lines.append(
            f"logits from the first loss token on: steps {ratio:.2f}x as fast as with logits at every position"
        )
    return "\n".join(lines)


def main(quick: bool, json_path: Path | None, models_dir: Path, steps: int = 3, rank: int = 16) -> int:
    if steps < 1 or rank < 1:
        raise ValueError(f"--steps and --rank must be at least 1 (got {steps} and {rank})")
    report = run(models_dir, steps, quick, rank)
    print(render(report), flush=True)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
    return 0 if all(r["losses_finite"] for r in report["options"]) else 1


def _child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trajflow.lab.bench.lora", description="one option of `trajflow bench lora`"
    )
    parser.add_argument("--child", choices=OPTIONS, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(child(args.child, args.model, args.steps, args.quick, args.rank)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
