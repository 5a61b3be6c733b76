"""free_port: a port the system gives twice in a row is not given twice."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from millpond.shared import net


class _Socket:
    """A socket bound to the next of the ports the system is made to give."""

    ports = [41000, 41000, 41000, 41001]

    def __init__(self, *_: Any) -> None:
        self.port = 0

    def __enter__(self) -> _Socket:
        return self

    def __exit__(self, *_: Any) -> None:
        pass

    def bind(self, address: tuple[str, int]) -> None:
        self.port = _Socket.ports.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return "127.0.0.1", self.port


def test_a_port_given_lately_is_not_given_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "_GIVEN", type(net._GIVEN)(maxlen=4))
    monkeypatch.setattr(net.socket, "socket", _Socket)
    assert [net.free_port(), net.free_port()] == [41000, 41001]  # (a broker's two listeners: distinct)
    assert _Socket.ports == []


def test_free_ports_are_free_and_distinct() -> None:
    ports = [net.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    for port in ports[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
