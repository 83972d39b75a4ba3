"""infra.ports: a port for a server started later is picked below the kernel's ephemeral range (where outgoing
connections never take it as their local port), is free when picked, and the kernel's pick is the fallback where no
such range is left."""

from __future__ import annotations

import random
import socket

import pytest

from trajflow.infra import ports


def test_a_port_is_picked_below_the_ephemeral_range_and_is_free() -> None:
    low, _ = ports.ephemeral_range()
    for seed in range(20):
        port = ports.free_port(random.Random(seed))
        assert ports.LISTEN_PORTS_FROM <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free when picked


def test_a_port_in_use_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(ports, "LISTEN_PORTS_FROM", taken)
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (taken + 1_000, 60_999))
        picks = {ports.free_port(random.Random(seed)) for seed in range(50)}
    assert taken not in picks and all(taken < p < taken + 1_000 for p in picks)


def test_without_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.LISTEN_PORTS_FROM + 10, 60_999))
    assert 0 < ports.free_port(random.Random(0)) < 65_536
