"""The TrainingWorkflow's admission pause, pure: a run of trajectories that failed on infrastructure stops admission,
one probe at a growing interval tests whether it works again, and the first trajectory that ends otherwise resumes
it. Works on the workflow's `TrainingState` in place and answers with a `ReportOutcome` for the workflow to act on
(stdlib and `contracts` only, like `trajflow.workflows.bookkeeping`, which calls it for every report).
"""

from __future__ import annotations

from dataclasses import dataclass

from trajflow.contracts.training import GroupState, TrainingRunConfig, TrainingState
from trajflow.contracts.trajectory import TrajectoryReport, TrajectoryStatus

MAX_PROBE_DELAY_S = 600.0
"""The longest wait between two probes of a paused run."""


@dataclass
class ReportOutcome:
    """What a report changed that the workflow must act on (log, search attributes, the prober)."""

    counted: bool = False
    """False when the report was ignored (late or a duplicate)."""
    paused: bool = False
    """This report stopped admission (a run of infra failures)."""
    resumed: str | None = None
    """Why admission resumed with this report, when it did."""
    abandoned: GroupState | None = None
    """The group this report made the workflow give up (members failed past the restart budget)."""
    flat: str | None = None
    """`filter_flat_groups`: this report completed a flat group, `dropped` or `trained`
    (`trajflow.workflows.flat.verdict`)."""
    flat_group: str = ""


def count(s: TrainingState, cfg: TrainingRunConfig, report: TrajectoryReport) -> ReportOutcome:
    """Count a report of a running member by its status, and pause or resume admission on it."""
    c = s.counters
    outcome = ReportOutcome(counted=True)
    if report.status is TrajectoryStatus.COMPLETED:
        c.completed += 1
    elif report.status is TrajectoryStatus.INFRA_FAILED:
        c.infra_failed += 1
    else:
        c.failed += 1
    if report.status is not TrajectoryStatus.INFRA_FAILED:
        s.infra_streak = 0
        if s.paused:
            outcome.resumed = f"{report.workflow_id} ended {report.status.value}: the infrastructure works again"
            resume(s)
        return outcome
    s.infra_streak += 1
    if not s.paused and s.infra_streak >= cfg.pause_after_infra_failures:
        s.paused = (
            f"{s.infra_streak} trajectories in a row failed on infrastructure, the last ({report.workflow_id}) "
            f"with: {report.error or 'no error recorded'}"
        )
        c.admission_pauses += 1
        outcome.paused = True
    return outcome


def resume(s: TrainingState) -> None:
    s.paused = None
    s.infra_streak = 0
    s.probe = False
    s.probe_delay_s = None


def probe_now(s: TrainingState, cfg: TrainingRunConfig) -> float:
    """While paused, a probe is due: admit one, and return how long to wait before the next."""
    delay = s.probe_delay_s or cfg.pause_probe_s
    s.probe = True
    s.probe_delay_s = min(delay * 2, MAX_PROBE_DELAY_S)
    return s.probe_delay_s
