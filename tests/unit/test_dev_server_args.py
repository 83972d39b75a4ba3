"""Every dev server the project starts (`trajflow up`, `--hosts`, the benches, the tests' fixture) gets the same
search attributes and dynamic config, each value as the JSON the CLI requires."""

from __future__ import annotations

import json
from pathlib import Path

from trajflow.contracts.names import SEARCH_ATTRIBUTES
from trajflow.infra.settings import Settings
from trajflow.infra.temporal import DEV_SERVER_DYNAMIC_CONFIG, dev_server_args, dev_server_command


def pairs(argv: list[str], flag: str) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == flag)


def test_the_dev_server_lifts_the_transfer_queue_poll_limit() -> None:
    config = pairs(dev_server_args(), "--dynamic-config-value")
    assert {key: json.loads(value) for key, value in config.items()} == DEV_SERVER_DYNAMIC_CONFIG
    assert DEV_SERVER_DYNAMIC_CONFIG["history.transferProcessorMaxPollRPS"] > 20  # the server's default


def test_up_and_the_fixtures_start_the_same_server(tmp_path: Path) -> None:
    command = dev_server_command(Settings(state_dir=tmp_path))
    assert command[-len(dev_server_args()) :] == dev_server_args()
    assert pairs(command, "--search-attribute") == SEARCH_ATTRIBUTES
