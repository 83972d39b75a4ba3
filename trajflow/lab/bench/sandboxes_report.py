"""The figures of `trajflow bench sandbox`: the samples one run measured (`Figures`), the summary it writes as
JSON (`summarize`, each of the issue's targets judged by `targets`) and the plain-text report it prints (`render`),
the plan stated beside the figures. Nothing here measures anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajflow.lab.bench.sandboxes import Plan

LAYERS = ("base", "runtime", "task")
"""The image layers, bottom up: built cold in this order (`Plan.cold_layers`) and reported in it."""
TARGETS: tuple[tuple[str, str, str, float, str], ...] = (
    ("warm_reset_ms", "p50", "<=", 50.0, "≤ 50 ms"),
    ("warm_reset_ms", "p99", "<=", 200.0, "≤ 200 ms"),
    ("cold_reset_ms", "p50", "<=", 1500.0, "≤ 1.5 s"),
    ("reset_success_rate", "", ">=", 0.9999, "≥ 99.99%"),
)
"""(figure, key in it, comparison, target, as printed) on this 2-core machine, from the issue."""


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        raise ValueError("percentile of no samples")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def latency(samples_ms: Sequence[float]) -> dict[str, float]:
    return {"p50": percentile(samples_ms, 50), "p99": percentile(samples_ms, 99)}


@dataclass
class Figures:
    """Everything one run measured, before it is summarised."""

    plan: Plan
    owner: str
    image: str
    pool_size: int
    cached: dict[str, Any]
    warm_ms: list[float]
    warm_hits: int
    cold_ms: list[float]
    steps: dict[str, Any]
    chaos: dict[str, Any]
    builds: dict[str, Any]
    machine: dict[str, float]
    leftover_containers: int
    wall_s: float


def summarize(f: Figures) -> dict[str, Any]:
    """The --json document: the issue's keys first, then detail."""
    s: dict[str, Any] = {
        "warm_reset_ms": latency(f.warm_ms),
        "cold_reset_ms": latency(f.cold_ms),
        "layer_build_s": f.builds["layer_build_s"],
        "cached_build_s": f.cached["cached_build_s"],
        "steps_per_s": f.steps["steps_per_s"],
        "reset_success_rate": f.chaos["success_rate"],
        "env": f.plan.env_id,
        "image": f.image,
        "quick": f.plan.quick,
        "plan": asdict(f.plan),
        "owner": f.owner,
        "pool_size": f.pool_size,
        "warm_hits": f.warm_hits,
        "warm_reset_samples_ms": f.warm_ms,
        "cold_reset_samples_ms": f.cold_ms,
        "cached_build_detail_s": f.cached["cached_build_detail_s"],
        "wheel_download_s": f.builds["wheel_download_s"],
        "layer_build_notes": f.builds["layer_build_notes"],
        "bench_images_removed": f.builds["bench_images_removed"],
        "steps": f.steps,
        "resets": f.chaos["resets"],
        "kills": f.chaos["kills"],
        "chaos": f.chaos,
        "leftover_containers": f.leftover_containers,
        "machine": f.machine,
        "wall_s": f.wall_s,
    }
    s["targets"] = targets(s)
    return s


def targets(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each target of the issue with the measured value and whether it is met."""
    out = {}
    for figure, key, op, target, shown in TARGETS:
        value = s[figure][key] if key else s[figure]
        met = value <= target if op == "<=" else value >= target
        name = f"{figure}.{key}" if key else figure
        out[name] = {"value": value, "target": target, "op": op, "shown": shown, "met": met}
    return out


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return [line.rstrip() for line in lines]


def render(s: dict[str, Any]) -> str:
    t, ch, st = s["targets"], s["chaos"], s["steps"]
    quick = " (--quick: small samples; a smoke run, do not quote)" if s["quick"] else ""

    def verdict(key: str) -> list[str]:
        return [t[key]["shown"], "met" if t[key]["met"] else "NOT met"]

    def build(layer: str) -> str:
        v = s["layer_build_s"][layer]
        if v is None:
            return "FAILED" if s["layer_build_notes"].get(layer, "").startswith("cold build failed") else "-"
        wheels = s["wheel_download_s"]
        return f"{v:.1f} s" + (f" (wheels {wheels:.1f} s)" if layer == "runtime" and wheels is not None else "")

    w, c = s["warm_reset_ms"], s["cold_reset_ms"]
    n_warm, n_cold = len(s["warm_reset_samples_ms"]), len(s["cold_reset_samples_ms"])
    rows = [
        ["figure", "value", "target", "verdict"],
        [f"warm reset p50 ({n_warm} samples)", f"{w['p50']:.1f} ms", *verdict("warm_reset_ms.p50")],
        ["warm reset p99", f"{w['p99']:.1f} ms", *verdict("warm_reset_ms.p99")],
        [f"cold reset p50 ({n_cold} samples)", f"{c['p50']:.0f} ms", *verdict("cold_reset_ms.p50")],
        ["cold reset p99", f"{c['p99']:.0f} ms", "", ""],
        ["images, all layers cached (worker start)", f"{s['cached_build_s'] * 1000:.0f} ms", "", ""],
        *([f"{layer} layer, cold build", build(layer), "", ""] for layer in LAYERS),
        [f"steps/s ({st['concurrency']} sandboxes, {st['seconds']:.0f} s)", f"{s['steps_per_s']:.1f}", "", ""],
        [f"reset success ({ch['resets']} resets, kills)", f"{ch['success_rate']:.2%}", *verdict("reset_success_rate")],
    ]
    m = s["machine"]
    out = [
        f"trajflow bench sandbox: env {s['env']!r}{quick}",
        f"  image {s['image']}; warm pool {s['pool_size']}; action `{st['action']}`; {m['cpus']:.0f} CPUs, "
        f"load {m['loadavg_1m_start']:.1f} -> {m['loadavg_1m_end']:.1f}; {s['wall_s']:.0f} s in all",
        "",
        *_table(rows),
        "",
        f"warm hits {s['warm_hits']}/{n_warm} (the pool was full before every sample)",
        f"resets under kills: {ch['kills']} of {ch['containers']} containers killed ({ch['kill_targets']} chosen, "
        f"{ch['kills_missed']} gone before their time, {ch['kills_pending_at_end']} pending at the end); "
        f"{ch['first_attempt_failures']} resets hit a failure ({ch['failure_types'] or 'none'}), {ch['retries']} "
        f"retries and {ch['recoveries']} recoveries spent, "
        f"{ch['final_failures']} failed past the workflow's budget; the pool served {ch['warm_hits']} warm and "
        f"{ch['cold_starts']} cold, discarded {ch['discarded_dead']} dead idle sandboxes, {ch['refill_failures']} "
        "refills failed",
    ]
    out += [f"  failed: {e}" for e in ch["errors"]]
    if ch["env_faults"]:
        out.append(f"BENCH BUG: {ch['env_faults']} env faults (ERR_ENV) under kills: kills must only cost infra errors")
    if st["errors"]:
        out.append(f"steps errors: {st['errors']}")
    out += [f"{layer} layer: {note}" for layer, note in s["layer_build_notes"].items()]
    if s["leftover_containers"]:
        out.append(f"BENCH BUG: {s['leftover_containers']} containers outlived their close (removed at the end)")
    if ch["resets"] < 10_000:
        out.append(f"note: {ch['resets']} resets resolve the success rate to {1 / max(ch['resets'], 1):.2%}")
    return "\n".join(out)
