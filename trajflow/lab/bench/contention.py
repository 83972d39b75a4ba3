"""`trajflow bench contention`: do a busy decode worker and a busy trainer, sharing this machine's cores, slow
each other down, under torch's default threads against the hardware section's defaults (`trajflow.infra.placement`)?

What only async does is overlap the two stages: the HF engine generating while the trainer steps. Each in its own
process, as in the embedded stack: one process generates a batch (`trajflow.lab.bench.torch_work.decode_round`, through
`trajflow.rl.engines.hf.HFEngine`) while another takes trainer steps (`trajflow.rl.trainer.PolicyTrainer`), with each
setting:

- `torch-default`: no thread settings; torch starts one OpenMP thread per core in each process.
- `placed`: the variables `trajflow.infra.placement.worker_env` gives the embedded stack's decode and trainer workers
  (`OMP_NUM_THREADS` and `TRAJFLOW_THREADS`: the cores divided between the two torch workers).
- `passive`: torch's default threads with `OMP_WAIT_POLICY=PASSIVE` (idle OpenMP threads sleep, not spin).

and each stage alone, under `torch-default` and `placed` (what the sync mode gets: one stage at a time). Reported:
decode tokens/s and the median trainer step that ran wholly inside the decode window, per setting, and their
ratios against `torch-default`. The model is the real SmolLM2-135M (`trajflow.rl.models.resolve_model("smollm2")`), on
the CPU, in the dtype `trajflow.rl.precision` chooses; `--quick` uses the tiny random model (a smoke test, not a
measurement).

Limits: one machine, whatever else runs on it (the report gives the load average before and after); the
processes are not pinned (as in the embedded stack without cpusets); one repeat per setting unless asked.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trajflow.infra.processes import python_module, same_code_env

SETTINGS = ("torch-default", "placed", "passive")
_CLEARED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TRAJFLOW_THREADS", "OMP_WAIT_POLICY")


def child_env(setting: str, kind: str) -> dict[str, str]:
    """The environment of a `kind` (decode or trainer) process under `setting`."""
    from trajflow.contracts.config import RunConfig
    from trajflow.infra.placement import worker_env

    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env = same_code_env(env)
    if setting == "placed":
        env.update({k: v for k, v in worker_env(RunConfig(), kind).items() if k != "TRAJFLOW_DEVICE"})
    elif setting == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif setting != "torch-default":
        raise ValueError(f"unknown setting {setting!r}; use one of {SETTINGS}")
    return env


# ---- the two child processes -------------------------------------------------------------------------------


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def _threads() -> int:
    from trajflow.infra.settings import Settings
    from trajflow.rl import devices

    return devices.set_threads(Settings().threads)


def _decode_child(model: Path, batch: int, new_tokens: int, rounds: int) -> None:
    from trajflow.lab.bench.torch_work import decode_round, prompts
    from trajflow.rl.engines.hf import HFEngine
    from trajflow.rl.precision import choose_precision

    threads = _threads()
    dtype = choose_precision("cpu").dtype

    async def run() -> None:
        import torch

        engine = HFEngine(model, max_batch=batch, batch_wait_ms=50, device="cpu", dtype=getattr(torch, dtype))
        await engine.start()
        eos = set(engine._eos)
        vocab = int(engine.model.config.vocab_size)
        await decode_round(engine, prompts(2, vocab, seed=99, avoid=eos), 4)  # warm-up
        _emit("ready", threads=threads, dtype=dtype)
        for r in range(rounds):
            torch.manual_seed(r)
            result = await decode_round(engine, prompts(batch, vocab, seed=r, avoid=eos), new_tokens)
            _emit("round", **asdict(result), tokens_per_s=result.tokens_per_s)
        await engine.close()

    asyncio.run(run())


def _trainer_child(model: Path, batch: int, steps: int | None) -> None:
    from trajflow.contracts.training import TrainerConfig
    from trajflow.lab.bench.torch_work import episode_samples, time_steps
    from trajflow.rl.trainer import PolicyTrainer

    threads = _threads()
    config = TrainerConfig(micro_batch=8, train_last_layers=2 if "tiny" in model.name else 8, autocast="auto")
    trainer = PolicyTrainer(model, config, device="cpu")
    samples = episode_samples(batch, int(trainer.unwrapped_model.config.vocab_size))
    time_steps(lambda: trainer.train_step(samples), samples, 1)  # warm-up
    _emit("ready", threads=threads, autocast=trainer.autocast.dtype)
    done = 0
    while steps is None or done < steps:  # without a count: until the parent ends the process
        (step,) = time_steps(lambda: trainer.train_step(samples), samples, 1)
        _emit("step", **asdict(step))
        done += 1


# ---- the parent --------------------------------------------------------------------------------------------


def _spawn(kind: str, setting: str, args: list[str]) -> subprocess.Popen[str]:
    argv = python_module("trajflow.lab.bench.contention", "child", kind, *args)
    return subprocess.Popen(argv, env=child_env(setting, kind), stdout=subprocess.PIPE, text=True)


def _events(lines: list[str] | Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines if line.startswith("{")]


def _wait_ready(proc: subprocess.Popen[str], what: str) -> dict[str, Any]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{") and json.loads(line)["event"] == "ready":
            return json.loads(line)
    raise RuntimeError(f"the {what} process exited before it was ready (exit {proc.wait()})")


def _finish(proc: subprocess.Popen[str], what: str) -> list[dict[str, Any]]:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the {what} process failed (exit {proc.returncode})")
    return _events(out.splitlines())


def run_pair(setting: str, model: Path, plan: dict[str, int]) -> dict[str, Any]:
    """Trainer steps running while the engine generates, both under `setting`."""
    trainer = _spawn("trainer", setting, ["--model", str(model), "--batch", str(plan["train_batch"])])
    try:
        ready_t = _wait_ready(trainer, "trainer")
        decode = _spawn("decode", setting, _decode_args(model, plan))
        ready_d = _wait_ready(decode, "decode")
        rounds = [e for e in _finish(decode, "decode") if e["event"] == "round"]
    finally:
        trainer.terminate()  # our own child, by its handle
    out, _ = trainer.communicate()
    steps = [e for e in _events(out.splitlines()) if e["event"] == "step"]
    window = (rounds[0]["started"], rounds[-1]["ended"])
    inside = [s for s in steps if s["started"] >= window[0] and s["ended"] <= window[1]]
    return {
        "setting": setting,
        "threads": {"decode": ready_d["threads"], "trainer": ready_t["threads"]},
        "decode_tokens_per_s": sum(r["tokens"] for r in rounds) / sum(r["seconds"] for r in rounds),
        "decode_window_s": window[1] - window[0],
        "trainer_steps_inside": len(inside),
        "trainer_step_s": _median([s["seconds"] for s in inside]),
        "dtype": ready_d["dtype"],
        "autocast": ready_t["autocast"],
    }


def run_alone(setting: str, model: Path, plan: dict[str, int]) -> dict[str, Any]:
    """Each stage by itself under `setting` (what the sync mode runs)."""
    decode = _spawn("decode", setting, _decode_args(model, plan))
    ready_d = _wait_ready(decode, "decode")
    rounds = [e for e in _finish(decode, "decode") if e["event"] == "round"]
    args = ["--model", str(model), "--batch", str(plan["train_batch"]), "--steps", str(plan["alone_steps"])]
    trainer = _spawn("trainer", setting, args)
    ready_t = _wait_ready(trainer, "trainer")
    steps = [e for e in _finish(trainer, "trainer") if e["event"] == "step"]
    return {
        "setting": setting,
        "threads": {"decode": ready_d["threads"], "trainer": ready_t["threads"]},
        "decode_tokens_per_s": sum(r["tokens"] for r in rounds) / sum(r["seconds"] for r in rounds),
        "trainer_step_s": _median([s["seconds"] for s in steps]),
    }


def _decode_args(model: Path, plan: dict[str, int]) -> list[str]:
    return [
        "--model",
        str(model),
        "--batch",
        str(plan["batch"]),
        "--new-tokens",
        str(plan["new_tokens"]),
        "--rounds",
        str(plan["rounds"]),
    ]


def _median(values: list[float]) -> float | None:
    from statistics import median

    return median(values) if values else None


def measure(
    model: Path,
    plan: dict[str, int],
    settings: tuple[str, ...],
    say: Any,
    alone_settings: tuple[str, ...] = SETTINGS[:2],
) -> dict[str, Any]:
    load_before = os.getloadavg()
    together, alone = [], []
    for setting in settings:
        say(f"together, {setting}: decode batch {plan['batch']} x {plan['new_tokens']} tokens while the trainer steps")
        together.append(run_pair(setting, model, plan))
        say(json.dumps(together[-1]))
    for setting in alone_settings:
        say(f"alone, {setting}")
        alone.append(run_alone(setting, model, plan))
        say(json.dumps(alone[-1]))
    base = next((row for row in together if row["setting"] == "torch-default"), together[0])
    for row in together:
        row["decode_vs_default"] = row["decode_tokens_per_s"] / base["decode_tokens_per_s"]
        if row["trainer_step_s"] and base["trainer_step_s"]:
            row["trainer_speedup_vs_default"] = base["trainer_step_s"] / row["trainer_step_s"]
    return {
        "machine": _machine(),
        "model": str(model),
        "plan": plan,
        "together": together,
        "alone": alone,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }


def _machine() -> str:
    import platform

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{cpu}, {os.cpu_count()} cores, {len(os.sched_getaffinity(0))} usable"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"machine: {report['machine']}; load average before {report['loadavg_before'][0]:.2f}, "
        f"after {report['loadavg_after'][0]:.2f}",
        "together (decode and trainer overlapping):",
    ]
    for r in report["together"]:
        step = (
            f"{r['trainer_step_s']:.2f} s ({r['trainer_steps_inside']} steps)"
            if r["trainer_step_s"]
            else "no step inside"
        )
        lines.append(
            f"  {r['setting']:14} threads {r['threads']}: decode {r['decode_tokens_per_s']:7.1f} tok/s "
            f"(x{r['decode_vs_default']:.2f}), trainer step {step}"
            + (f" (x{r['trainer_speedup_vs_default']:.2f})" if "trainer_speedup_vs_default" in r else "")
        )
    lines.append("alone (one stage at a time, as sync runs them):")
    for r in report["alone"]:
        lines.append(
            f"  {r['setting']:14} threads {r['threads']}: decode {r['decode_tokens_per_s']:7.1f} tok/s, "
            f"trainer step {r['trainer_step_s']:.2f} s"
        )
    return "\n".join(lines)


def main(
    quick: bool,
    json_path: Path | None,
    cache_dir: Path,
    settings: tuple[str, ...] = SETTINGS,
    alone_settings: tuple[str, ...] = SETTINGS[:2],
) -> int:
    from trajflow.rl.models import resolve_model

    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f} s] {msg}", file=sys.stderr, flush=True)

    model = resolve_model("tiny" if quick else "smollm2", cache_dir, progress=say)
    plan = (
        {"batch": 4, "new_tokens": 16, "rounds": 2, "train_batch": 4, "alone_steps": 2}
        if quick
        else {"batch": 32, "new_tokens": 16, "rounds": 1, "train_batch": 4, "alone_steps": 2}
    )
    report = measure(model, plan, settings, say, alone_settings)
    report["quick"] = quick
    print(render(report), flush=True)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
    return 0


def _child_main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trajflow.lab.bench.contention child")
    parser.add_argument("kind", choices=["decode", "trainer"])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None)
    a = parser.parse_args(argv)
    if a.kind == "decode":
        _decode_child(a.model, a.batch, a.new_tokens, a.rounds)
    else:
        _trainer_child(a.model, a.batch, a.steps)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        _child_main(sys.argv[2:])
    else:
        sys.exit("run it as `trajflow bench contention` (this entry point is for its child processes)")
