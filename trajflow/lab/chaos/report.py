"""What `trajflow chaos` shows of a `ChaosReport`: the text report, its JSON and a plot of the run under faults."""

from __future__ import annotations

import json
from pathlib import Path

from trajflow.lab.chaos.harness import ChaosReport


def format_report(r: ChaosReport) -> str:
    c = r.counts
    lines = [f"chaos run {r.run_id} ({'quick, ' if r.quick else ''}{r.config}): {r.wall_s:.0f}s"]
    for f in r.faults:
        rec = f"recovered in {f.recovered_after_s:.1f}s" if f.recovered_after_s is not None else "no progress after it"
        lines.append(f"  t={f.at_s:6.1f}s  {f.fault:12} {f.detail}; {rec}")
    for name in r.faults_not_injected:
        lines.append(f"  NOT INJECTED: {name} (the run ended before its moment)")
    k = r.containers
    lines.append(
        f"  sandboxes: {k.killed} of {k.episodes_seen} episodes had their container killed mid-episode "
        f"({k.targeted} picked, {k.ended_before_kill} ended before the kill)"
    )
    lines += [
        f"  trajectories started {c.started}: completed {c.completed}, failed {c.failed}, infra-failed "
        f"{c.infra_failed}, cancelled (redundant/leftover) {c.cancelled}, LOST {c.lost}",
        f"  consumed {c.consumed}, consumed twice {c.consumed_twice}, infra failures scored {c.infra_failures_scored}",
        f"  steps completed {c.steps_completed} of {c.steps_configured}",
    ]
    for goal, met in c.goals_met.items():
        lines.append(f"  [{'ok' if met else 'FAIL'}] {goal}")
    for kind, ids in (("lost", c.lost_ids), ("consumed twice", c.consumed_twice_ids), ("scored", c.infra_scored_ids)):
        if ids:
            lines.append(f"  {kind}: {', '.join(ids)}")
    lines.append("PASS" if r.ok else "FAIL")
    return "\n".join(lines)


def write_json(r: ChaosReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(r.to_json(), indent=2))


def write_plot(r: ChaosReport, path: Path) -> Path | None:
    """Trajectories ended and policy version over time, with a line at each fault."""
    if not r.timeline:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s[0] for s in r.timeline]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(t, [s[1] for s in r.timeline], label="trajectories ended")
    ax2 = ax.twinx()
    ax2.step(t, [s[2] for s in r.timeline], where="post", color="tab:green", label="policy version")
    ax2.set_ylabel("policy version")
    for f in r.faults:
        ax.axvline(f.at_s, color="tab:red", alpha=0.5)
        ax.text(f.at_s, ax.get_ylim()[1] * 0.95, f.fault, rotation=90, va="top", fontsize=8, color="tab:red")
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("trajectories ended")
    ax.set_title(f"chaos run {r.run_id}: {'PASS' if r.ok else 'FAIL'}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
