"""One trajectory's trace read back from the workers' JSON-lines span files (`trajflow.observability.tracing`), as the
timeline `trajflow trace WORKFLOW_ID` prints: each span's offset and duration, and where the episode's time went.

"Where the time went" splits the episode's wall time into the activities' own execution on their workers (the
`run <activity>` spans) by activity, and orchestration: everything else (scheduling, the wait for a worker to pick a
task up, delivering results, the workflow's own tasks). Spans exported over OTLP are not in the files: look them up
in the collector by the `trajflow.workflow_id` attribute. A trajectory still running has no root span yet (the
workflow writes it when the episode ends); its finished activities are shown.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from trajflow.contracts.traces import ROOT_SPAN, RUN_PREFIX, SpanRecord, attr


@dataclass(frozen=True)
class Row:
    span: SpanRecord
    depth: int
    offset_s: float


@dataclass
class Timeline:
    workflow_id: str
    trace_id: str
    rows: list[Row]
    root: SpanRecord | None
    total_s: float
    activity_s: dict[str, float] = field(default_factory=dict)
    """Seconds spent inside each activity's body on its workers (all attempts), by activity type."""

    @property
    def orchestration_s(self) -> float:
        return max(self.total_s - sum(self.activity_s.values()), 0.0)

    def to_json(self) -> dict:
        return {
            "workflow_id": self.workflow_id,
            "trace_id": self.trace_id,
            "finished": self.root is not None,
            "total_s": round(self.total_s, 6),
            "activity_s": {k: round(v, 6) for k, v in self.activity_s.items()},
            "orchestration_s": round(self.orchestration_s, 6),
            "spans": [
                {
                    "depth": r.depth,
                    "offset_s": round(r.offset_s, 6),
                    "seconds": round(r.span.seconds, 6),
                    **r.span.model_dump(),
                }
                for r in self.rows
            ],
        }


def span_files(traces_dir: Path) -> list[Path]:
    return sorted(traces_dir.glob("*.jsonl")) if traces_dir.is_dir() else []


TRACE_ID_AT = slice(len('{"trace_id":"'), len('{"trace_id":"') + 32)
"""Where a span line holds its trace id: `SpanRecord`'s first field, so other traces' lines are skipped unparsed."""


def read_spans(files: list[Path], needle: str = "", trace_ids: Collection[str] | None = None) -> list[SpanRecord]:
    """The spans of the files whose line mentions `needle` (a workflow or trace id) and, given `trace_ids`, belongs
    to one of those traces; the newest copy of each span."""
    found: dict[str, SpanRecord] = {}
    for path in files:
        with path.open(encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n") or needle not in line:  # a line being written has no newline yet
                    continue
                if trace_ids is None or line[TRACE_ID_AT] in trace_ids:
                    span = SpanRecord.model_validate_json(line)
                    found[span.span_id] = span
    return list(found.values())


def trace_of(workflow_id: str, traces_dir: Path) -> Timeline | None:
    """The timeline of `workflow_id`'s latest trace, or None when no file holds a span of it."""
    files = span_files(traces_dir)
    key = attr("workflow_id")
    mine = [s for s in read_spans(files, workflow_id) if s.attributes.get(key) == workflow_id]
    if not mine:
        return None
    trace_id = max(mine, key=lambda s: s.start_ns).trace_id
    return build(workflow_id, trace_id, read_spans(files, trace_id))


def build(workflow_id: str, trace_id: str, spans: list[SpanRecord]) -> Timeline:
    """Order a trace's spans as a tree (children by start time under their parent) and add up where time went."""
    spans = [s for s in spans if s.trace_id == trace_id]
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[SpanRecord]] = defaultdict(list)
    for s in spans:
        children[s.parent_id if s.parent_id in ids else None].append(s)
    root = next((s for s in children[None] if s.name == ROOT_SPAN), None)
    start = min(s.start_ns for s in spans)
    end = root.end_ns if root is not None else max(s.end_ns for s in spans)
    rows: list[Row] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in sorted(children[parent], key=lambda s: (s.start_ns, s.name)):
            rows.append(Row(s, depth, (s.start_ns - start) / 1e9))
            walk(s.span_id, depth + 1)

    walk(None, 0)
    activity_s: dict[str, float] = defaultdict(float)
    for s in spans:
        if s.name.startswith(RUN_PREFIX):
            activity_s[s.name.removeprefix(RUN_PREFIX)] += s.seconds
    return Timeline(workflow_id, trace_id, rows, root, (end - start) / 1e9, dict(activity_s))


def render(t: Timeline, width: int = 32) -> list[str]:
    """The timeline as text: a heading with the root's attributes, one line per span with a bar, and the split."""
    head = f"trajectory {t.workflow_id}  trace {t.trace_id}"
    if t.root is not None:
        a = t.root.attributes
        facts = [
            f"{k} {a[attr(k)]}"
            for k in ("run", "task", "seed", "status", "reward", "turns", "policy_version")
            if attr(k) in a
        ]
        head += "\n  " + "  ".join(facts)
    else:
        head += "\n  still running (or its last spans are not written yet): its root span comes when it ends"
    lines = [head, f"  {'start':>8} {'seconds':>8}  span"]
    scale = width / t.total_s if t.total_s > 0 else 0.0
    for r in t.rows:
        lead = int(r.offset_s * scale)
        bar = " " * lead + "█" * max(1, int(r.span.seconds * scale))
        lines.append(
            f"  {r.offset_s:8.2f} {r.span.seconds:8.2f}  {'  ' * r.depth}{_label(r.span):<50} |{bar:<{width}}|"
        )
    lines.append(f"where the time went ({t.total_s:.2f} s):")
    parts = sorted(t.activity_s.items(), key=lambda kv: -kv[1]) + [("orchestration", t.orchestration_s)]
    for name, seconds in parts:
        share = 100 * seconds / t.total_s if t.total_s > 0 else 0.0
        lines.append(f"  {name:<18} {seconds:8.2f} s  {share:5.1f}%")
    key = attr("agent_seconds")
    program = [float(r.span.attributes[key]) for r in t.rows if key in r.span.attributes]
    if program:  # inside env.step: the agent program's own work between its calls
        lines.append(f"  of which the agent program between calls: {sum(program):.2f} s, {len(program)} call(s)")
    return lines


def _label(s: SpanRecord) -> str:
    a = s.attributes
    extra = []
    if attr("turn") in a:
        extra.append(f"turn {a[attr('turn')]}")
    if attr("policy_version") in a and s.name != ROOT_SPAN:
        extra.append(f"v{a[attr('policy_version')]}")
    if attr("completion_tokens") in a:
        extra.append(f"{a[attr('completion_tokens')]} tok")
    if attr("agent_call") in a:  # an agent program's turn: its call, and its own time before the next one
        extra.append(f"call {a[attr('agent_call')]}")
    if attr("agent_seconds") in a:
        extra.append(f"program {float(a[attr('agent_seconds')]):.2f}s")
    if attr("attempt") in a:
        extra.append(f"attempt {a[attr('attempt')]}, waited {float(a.get(attr('pickup_wait_s'), 0.0)):.3f}s")
    if s.status == "error":
        extra.append("ERROR")
    return s.name + (f" ({', '.join(extra)})" if extra else "")
