"""free_port: a port the system gives twice in a row is not given twice, and processes that pick
ports side by side each take their own."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import pytest

from millpond.shared import net


def fake_system(ports: list[int]) -> SimpleNamespace:
    """A socket module whose sockets are bound to ``ports`` in turn (only ``free_port`` sees it)."""
    class Socket:
        def __init__(self, *_: Any) -> None:
            self.port = 0

        def __enter__(self) -> Socket:
            return self

        def __exit__(self, *_: Any) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            self.port = ports.pop(0)

        def getsockname(self) -> tuple[str, int]:
            return "127.0.0.1", self.port

    return SimpleNamespace(socket=Socket, AF_INET=socket.AF_INET, SOCK_STREAM=socket.SOCK_STREAM)


def test_a_port_given_lately_is_not_given_again(monkeypatch: pytest.MonkeyPatch) -> None:
    ports = [41000, 41000, 41000, 41002]
    monkeypatch.setattr(net, "_GIVEN", type(net._GIVEN)(maxlen=4))
    monkeypatch.setattr(net, "OWN_PORTS", (1, 0))
    monkeypatch.setattr(net, "socket", fake_system(ports))
    assert [net.free_port(), net.free_port()] == [41000, 41002]  # (a broker's two listeners: distinct)
    assert ports == []


@pytest.mark.parametrize("share", [0, 1, 2])
def test_each_process_takes_only_its_share_of_ports(monkeypatch: pytest.MonkeyPatch, share: int) -> None:
    """Two or three processes picking ports side by side (make test's) never pick the same one,
    and each finds its own among the ports of the one parity Linux gives ``bind``."""
    monkeypatch.setattr(net, "OWN_PORTS", (3, share))
    ports = {net.free_port() for _ in range(20)}
    assert len(ports) == 20 and {net.port_share(p, 3) for p in ports} == {share}
    for parity in (0, 1):
        given = range(32768 + parity, 61000, 2)
        assert min(sum(1 for p in given if net.port_share(p, 2) == s) for s in range(2)) > len(given) // 3
        assert min(sum(1 for p in given if net.port_share(p, 3) == s) for s in range(3)) > len(given) // 4


def test_a_share_no_port_is_in_is_an_error_not_a_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "OWN_PORTS", (2, 1))
    monkeypatch.setattr(net, "_TRIES", 3)
    monkeypatch.setattr(net, "socket", fake_system([p for p in range(40000, 41000, 2) if net.port_share(p, 2) == 0]))
    with pytest.raises(net.SetupError, match="no free port of share 1 of 2"):
        net.free_port()
