"""Loopback networking helpers."""

from __future__ import annotations

import socket
import threading
import time
from collections import deque

from millpond.shared.errors import SetupError

_GIVEN: deque[int] = deque(maxlen=256)
"""The ports ``free_port`` gave lately: the system may give a port closed a moment ago again, and
a service given two (a broker's listeners) would find them the same."""
_GIVING = threading.Lock()

OWN_PORTS: tuple[int, int] = (1, 0)
"""(n, i): ``free_port`` gives only the ports of share i of n (by a hash of the port: Linux gives
``bind`` ports of one parity, so no share may be a remainder of the port). Processes that pick
ports side by side (make test's pytest processes, ``tests/conftest.py``) each take their own
share, so a port one picked and has not yet bound is never picked by another."""
_TRIES = 10_000


def port_share(port: int, shares: int) -> int:
    """Which of ``shares`` shares ``port`` is in (Fibonacci hashing: the shares even among any
    run of ports, among the odd or the even ones alone too)."""
    return ((port * 0x9E3779B1) & 0xFFFFFFFF) * shares >> 32


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that nothing listens on right now, one of this process's own
    (``OWN_PORTS``) that it was not given lately."""
    shares, share = OWN_PORTS
    with _GIVING:
        for _ in range(_TRIES):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port: int = sock.getsockname()[1]
            if port not in _GIVEN and port_share(port, shares) == share:
                _GIVEN.append(port)
                return port
    raise SetupError(f"no free port of share {share} of {shares} on {host} in {_TRIES} tries")


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
