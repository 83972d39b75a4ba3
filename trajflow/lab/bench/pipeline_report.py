"""The figures of `trajflow bench pipeline`: the summary it writes as JSON (`summarize`) and the plain-text
report it prints (`render`), the workload stated beside the figures. Nothing here measures anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trajflow.lab.bench.workload import IdealBound, Workload, admission_bound, group_latency_units, ideal_bound, mean

if TYPE_CHECKING:
    from trajflow.lab.bench.pipeline import RunFigures

ANCHORS = (
    "published anchors (their hardware and workloads, not this one): async over sync ROLL Flash 2.24x (RLVR) / "
    "2.72x (agentic), AReaL 2.77x; trajectory- over batch-level env interaction RollArt 1.23-2.27x"
)


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.rjust(wd) if i else c.ljust(wd) for i, (c, wd) in enumerate(zip(cells, widths, strict=True)))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [_row(header, widths), _row(["-" * wd for wd in widths], widths), *(_row(r, widths) for r in rows)]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def render(s: dict[str, Any]) -> str:
    w, u = s["workload"], s["unit_s"]
    quick = " (--quick: a smoke run; overhead dominates, do not quote these figures)" if w["quick"] else ""
    gen = s["sync_generation_phase_s"]
    out = [
        f"trajflow bench pipeline: SYNTHETIC workload{quick}",
        f"  {w['description']}",
        f"  env delay mean {w['env_mean']:g} units; 1 unit = {u:g} s; {w['steps']} steps per mode",
        f"  train step T = {w['train_fraction']:g} x sync generation phase (pilot {gen['pilot']:.2f} s = "
        f"{gen['pilot'] / u:.1f} units) = {s['train_s']:.2f} s; the sync run's own phase: {gen['sync_run']:.2f} s",
        "",
    ]
    runs, adm = s["runs"], s["admission_bound_tps"]
    rows = []
    for key, alpha in [("sync", "0"), *((f"alpha{a}", str(a)) for a in w["alphas"])]:
        r = runs[key]
        speed = "1.00x" if key == "sync" else f"{s['speedup'][alpha]:.2f}x"
        rows.append(
            [
                "sync (barrier)" if key == "sync" else "async",
                alpha,
                f"{r['tps']:.3f}",
                f"{r['tps'] * u:.2f}",
                speed,
                f"{r['whole_tps']:.3f}",
                f"{adm[alpha]:.3f}",
                f"{r['decode_utilisation']:.0%}",
                f"{r['staleness_mean']:.2f}",
                str(r["dropped_stale"]),
            ]
        )
    header = [
        "mode",
        "α",
        "traj/s",
        "traj/unit",
        "speedup",
        "whole-run traj/s",
        "bound*",
        "decode util",
        "staleness",
        "dropped",
    ]
    out += _table(header, rows)
    ideal = s["ideal"]
    orch = s["orchestration"]
    out += [
        "",
        f"ideal bound: {ideal['formula']}",
        f"  B/T = {ideal['train_bound_tps']:.3f} traj/s, S/(E[turns]·E[decode]) = {ideal['decode_capacity_tps']:.3f} "
        "traj/s"
        f" -> ideal {s['ideal_tps']:.3f} traj/s ({s['ideal_tps'] * u:.2f} traj/unit, limited by {ideal['limited_by']})",
        f"  efficiency = best async / ideal = {s['efficiency']:.0%}",
        f"* admission bound(α) = (α+1)·B / (E[group latency] + T), E[group latency] = {s['group_latency_units']:.1f} "
        "units;"
        f" sync: B / (E[batch latency] + T), E[batch latency] = {s['batch_latency_units']:.1f} units. In expectation"
        " (Monte Carlo of the workload, no queueing, no overhead); a group's budget is freed when the step that"
        " trains it ends",
        f"orchestration ceiling (zero-delay trajectories, this machine): {orch['ceiling_tps']:.1f} traj/s, "
        f"{orch['activities_per_s']:.0f} activities/s = {orch['ceiling_tps'] * u:.1f} traj/unit "
        f"({s['ideal_tps'] / orch['ceiling_tps']:.0%} of it needed at the ideal rate, "
        f"{max(s['async_tps'].values()) / orch['ceiling_tps']:.0%} at the best measured one)",
        f"sync admission (B children started one at a time, each awaiting its start): "
        f"{_mean(runs['sync']['admission_s']):.2f} s per step = "
        f"{_mean(runs['sync']['admission_s']) / max(gen['sync_run'], 1e-9):.0%} of the sync generation phase",
        "trajectories still running when their run ended (terminated by the bench): "
        + ", ".join(f"{k} {r['leftovers_terminated']}" for k, r in runs.items()),
        f"machine: {s['machine']['cpus']} CPUs, 1-min load average {s['machine']['loadavg_1m_start']:.1f} at start, "
        f"{s['machine']['loadavg_1m_end']:.1f} at end (other jobs on the machine share its cores)",
        "",
        f"env interaction: {w['batch_size']} episodes, the same ones both ways (same lengths and env delays)",
    ]
    rows = [
        [
            k,
            f"{v['traj_tps']:.3f}",
            f"{v['batch_tps']:.3f}",
            " / ".join(f"{x:.1f}" for x in v["traj_s"]),
            " / ".join(f"{x:.1f}" for x in v["batch_s"]),
            f"{v['decode_utilisation']['traj']:.0%} / {v['decode_utilisation']['batch']:.0%}",
            f"{v['ratio']:.2f}x",
        ]
        for k, v in s["traj_vs_batch"].items()
    ]
    header = [
        "env σ",
        "traj-level traj/s",
        "batch-level traj/s",
        "traj-level s",
        "batch-level s",
        "decode util t/b",
        "ratio",
    ]
    out += _table(header, rows)
    out += ["", f"measured: {s['measurement']}", ANCHORS, f"bench wall time {s['wall_s']:.0f} s"]
    return "\n".join(out)


def summarize(
    w: Workload,
    calibration: dict[str, float],
    pilot: RunFigures,
    gen_s: float,
    train_s: float,
    runs: dict[str, RunFigures],
    tvb: dict[str, dict[str, object]],
    machine: dict[str, float],
    wall_s: float,
) -> dict[str, object]:
    u = w.unit_s
    bound: IdealBound = ideal_bound(w, train_s / u)
    latency = group_latency_units(w, w.env_sigma, seed=w.seed)
    batch_latency = group_latency_units(w, w.env_sigma, members=w.batch_size, samples=500, seed=w.seed)
    sync = runs["sync"]
    asyncs = {str(a): runs[f"alpha{a}"] for a in w.alphas}
    best = max(r.tps for r in asyncs.values())
    return {
        "sync_tps": sync.tps,
        "async_tps": {a: r.tps for a, r in asyncs.items()},
        "speedup": {a: r.tps / sync.tps for a, r in asyncs.items()},
        "ideal_tps": bound.ideal / u,
        "efficiency": best / (bound.ideal / u),
        "traj_vs_batch": tvb,
        "workload": w.as_dict(),
        "unit_s": u,
        "train_s": train_s,
        "sync_generation_phase_s": {"pilot": gen_s, "sync_run": mean(sync.generation_phases_s)},
        "ideal": {
            "formula": IdealBound.FORMULA,
            "decode_capacity_tps": bound.decode_capacity / u,
            "train_bound_tps": bound.train_bound / u,
            "limited_by": bound.limited_by,
        },
        "admission_bound_tps": {
            str(a): admission_bound(w, a, train_s / u, latency if a else batch_latency) / u for a in (0, *w.alphas)
        },
        "group_latency_units": latency,
        "batch_latency_units": batch_latency,
        "machine": machine,
        "whole_run": {
            "sync_tps": sync.whole_tps,
            "async_tps": {a: r.whole_tps for a, r in asyncs.items()},
            "speedup": {a: r.whole_tps / sync.whole_tps for a, r in asyncs.items()},
        },
        "runs": {k: r.as_dict() for k, r in {"pilot": pilot, **runs}.items()},
        "orchestration": calibration,
        "measurement": (
            "tps = B*(N-1)/(t_N - t_1), t_k = workflow time at the end of step k (first step = pipeline fill left "
            "out); rollout tps (traj_vs_batch) = B / wall seconds from the first start to the last result"
        ),
        "wall_s": wall_s,
    }
