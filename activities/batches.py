"""What a train step reads from the store: its trajectory records, a bounded number at a time (one at a time, a
step of thousands spent most of its time waiting on the store). Shared by the trainer activity and the benchmarks'
simulated trainer (`trajflow.lab.bench.sim_trainer`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from infra.store import ObjectStore
from trajflow.contracts.records import TrajectoryRecord

RECORD_READS = 8
"""Objects a step reads from the store at once (below boto3's default pool of 10 connections)."""


def load_records(store: ObjectStore, uris: list[str], concurrency: int = RECORD_READS) -> list[TrajectoryRecord]:
    """The records at `uris`, in that order, read `concurrency` at a time; the first failed read raises."""
    if len(uris) <= 1 or concurrency <= 1:
        return [TrajectoryRecord.model_validate(store.get_json(u)) for u in uris]
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="records") as pool:
        return list(pool.map(lambda u: TrajectoryRecord.model_validate(store.get_json(u)), uris))
