"""Local TCP ports: a free one to give a process, and whether a given one can be bound (nothing listens there)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS_FROM = 20_000
"""Where a port for a server is picked: from here up to the kernel's ephemeral range, which it leaves alone."""


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (Linux's default where it cannot be read)."""
    try:
        low, high = (int(x) for x in EPHEMERAL_RANGE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32_768, 60_999


def free_port(rng: random.Random | None = None) -> int:
    """A port nothing listens on now, for a server started later. Picked below the kernel's ephemeral range: the
    kernel's own pick (port 0) lies inside it, where any outgoing connection made meanwhile (a client, a download)
    may take it as its local port, and the server then fails to bind. Another process may still take it first."""
    low = ephemeral_range()[0]
    rng = rng or random.SystemRandom()
    if low - LISTEN_PORTS_FROM >= 1_000:
        for _ in range(200):
            port = rng.randrange(LISTEN_PORTS_FROM, low)
            if port_free(port):
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether a listener could bind `port` on 127.0.0.1 now (SO_REUSEADDR, as servers bind)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
