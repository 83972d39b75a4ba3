"""The timeline of `trajflow bench real`: per mode, when decode and the trainer were busy, step ends marked.

One row per stage and mode, time since each mode's start on the x axis: in the sync mode the two stages take
turns, in an async mode they overlap — which is the whole speedup, and easier to see than to read in a table.
"""

from __future__ import annotations

from pathlib import Path


def plot_timeline(summary: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes: list[dict] = summary["modes"]  # type: ignore[assignment]
    fig, axes = plt.subplots(len(modes), 1, figsize=(11, 1.6 * len(modes) + 0.8), sharex=True, squeeze=False)
    colours = {"decode": "tab:blue", "trainer": "tab:orange"}
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        for row, (stage, spans) in enumerate(sorted(mode["spans"].items())):
            bars = [(a, b - a) for a, b in spans]
            ax.broken_barh(bars, (row - 0.4, 0.8), color=colours.get(stage, "grey"))
        for t in mode["step_times_s"]:
            ax.axvline(t, color="black", linewidth=0.6, linestyle=":")
        ax.set_yticks(range(len(mode["spans"])), sorted(mode["spans"]))
        ax.set_title(f"{mode['label']}: {mode['tps']:.3f} traj/s (dotted: step ends)", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds since the mode started")
    where: dict = summary["machine"]  # type: ignore[assignment]
    kernels = where.get("kernels") or {}
    caps = sorted({f"{k}={v}" for env in (kernels.get("isa_caps") or {}).values() for k, v in (env or {}).items()})
    fig.suptitle(
        f"bench real: {where.get('cpu')}, {where.get('cores')} cores, native bf16 {where.get('native_bf16')}, "
        f"layout {where.get('layout', '?')}, decode dtype {kernels.get('decode_dtype', '?')}, trainer autocast "
        f"{kernels.get('trainer_autocast', '?')}{', ' + ' '.join(caps) if caps else ''}",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
