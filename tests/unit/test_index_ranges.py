"""Sets of group indices travel in JSON as flat (gap, length) pairs (`trajflow.contracts.shards.flat_ranges`): a
sharded run's state and a step's input hold thousands of ranges of six-digit indices and more (docs/capacity.md)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from trajflow.contracts.shards import IndexSet, flat_ranges
from trajflow.contracts.trainer import TrainerConfig
from trajflow.contracts.training import TrainStepInput


def test_ranges_are_written_as_gaps_and_lengths_and_read_back() -> None:
    s = IndexSet.of([3, 4, 5, 9, 100_000, 100_002, 100_003])
    assert s.ranges == [(3, 6), (9, 10), (100_000, 100_001), (100_002, 100_004)]
    assert flat_ranges(s.ranges) == [3, 3, 3, 1, 99_990, 1, 1, 2]
    assert json.loads(s.model_dump_json()) == {"ranges": [3, 3, 3, 1, 99_990, 1, 1, 2]}
    assert IndexSet.model_validate_json(s.model_dump_json()) == s
    assert s.model_dump()["ranges"] == s.ranges  # Python mode keeps the pairs
    assert IndexSet.model_validate({"ranges": [[3, 6], [9, 10]]}).ranges == [(3, 6), (9, 10)]  # pairs read as such
    assert IndexSet.model_validate_json('{"ranges": []}') == IndexSet()


def test_the_flat_form_is_a_fraction_of_the_pairs_at_large_indices() -> None:
    worst = IndexSet.of(range(1_000_000, 1_024_576, 2))  # every other index: one range each
    pairs = len(json.dumps([list(r) for r in worst.ranges]))
    flat = len(json.dumps(flat_ranges(worst.ranges)))
    assert len(worst.ranges) == 12_288 and flat * 3 < pairs


def test_a_step_input_carries_its_groups_flat() -> None:
    step = TrainStepInput(run_id="r", version=4, refs=[], trainer=TrainerConfig(), groups=[(64, 128), (130, 131)])
    assert json.loads(step.model_dump_json())["groups"] == [64, 64, 2, 1]
    assert TrainStepInput.model_validate_json(step.model_dump_json()).groups == [(64, 128), (130, 131)]


@pytest.mark.parametrize("flat", [[1, 2, 3], [0, 0], [-1, 2], [2, 3, -4, 1]])
def test_a_malformed_flat_form_is_refused(flat: list[int]) -> None:
    with pytest.raises(ValidationError, match="flat ranges need"):
        IndexSet.model_validate({"ranges": flat})
