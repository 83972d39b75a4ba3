"""Contracts as a whole: dead fields stay gone, records written by an older trajflow stay readable."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contracts.records import TrajectoryRecord
from contracts.trajectory import ScoreInput, ScoreRequest, TrajectoryRequest, TrajectoryStatus


def test_score_input_holds_only_the_request() -> None:
    assert set(ScoreInput.model_fields) == {"request"}
    with pytest.raises(ValidationError):
        ScoreInput.model_validate({"pool": "default", "request": ScoreRequest(env_id="game:x").model_dump()})


def test_a_record_saved_with_the_old_empty_extra_field_still_loads() -> None:
    record = TrajectoryRecord(
        workflow_id="w", request=TrajectoryRequest(), status=TrajectoryStatus.COMPLETED, reward=1.0,
        first_observation="o", turns=[], context=None, env_recoveries=0,
    )  # fmt: skip
    assert "extra" not in record.model_dump()
    old = {**record.model_dump(mode="json"), "extra": {}}
    assert TrajectoryRecord.model_validate(old) == record
    with pytest.raises(ValidationError):
        TrajectoryRecord.model_validate({**old, "extra": {"something": 1}})
