"""Loopback networking helpers."""

from __future__ import annotations

import socket
import time
from collections import deque

_GIVEN: deque[int] = deque(maxlen=256)
"""The ports ``free_port`` gave lately: the system may give a port closed a moment ago again, and
a service given two (a broker's listeners) would find them the same."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that nothing listens on right now, and that this process was
    not given lately."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.append(port)
            return port


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    """Wait until something accepts TCP connections on ``host:port``; False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False
