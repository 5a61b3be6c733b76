"""TLS for every gRPC endpoint, from PEM files that are read again when they change.

A service with ``tls_cert_file``, ``tls_key_file`` and ``tls_ca_file`` set serves TLS and
requires a client certificate signed by the CA (mutual TLS); its own calls to the other
services present the same certificate. Rotating a certificate is replacing the files:
the server picks the new pair up at the next handshake, and channels opened after the
change use it (``ChannelFactory`` replaces its cached channels).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from millpond.shared.errors import SetupError

log = logging.getLogger(__name__)
S = TypeVar("S")
CHECK_EVERY_S = 1.0
"""How often a ChannelFactory looks whether its TLS files changed."""
RETIRE_AFTER_S = 30.0
"""How long a channel replaced after a certificate change stays open for calls in flight."""


@dataclass(frozen=True)
class TlsFiles:
    """A certificate, its key and the CA that signs the peers, as PEM files."""

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def of(cls, cert: str | None, key: str | None, ca: str | None) -> TlsFiles | None:
        """The files when all three are set; None when none is; SetupError for a partial set."""
        given = [cert, key, ca]
        if not any(given):
            return None
        if not all(given):
            raise SetupError("TLS needs all three of MILLPOND_TLS_CERT_FILE, MILLPOND_TLS_KEY_FILE and "
                             "MILLPOND_TLS_CA_FILE (or none, for plaintext)")
        assert cert and key and ca
        return cls(Path(cert), Path(key), Path(ca))

    def stamp(self) -> tuple[int, ...]:
        """Changes whenever any of the files does."""
        try:
            stats = [os.stat(f) for f in (self.cert, self.key, self.ca)]
            return tuple(n for s in stats for n in (s.st_mtime_ns, s.st_size))
        except OSError as err:
            raise SetupError(f"cannot read TLS file {err.filename}: {err.strerror}") from None

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(certificate chain, private key, CA certificates)."""
        return self.cert.read_bytes(), self.key.read_bytes(), self.ca.read_bytes()


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Mutual TLS credentials that load the files again at the first handshake after they change."""
    lock = threading.Lock()
    seen = [files.stamp()]

    def configuration() -> Any:
        cert, key, ca = files.read()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch() -> Any:
        # Called by gRPC's core for each new handshake (on its own threads): None keeps the
        # current configuration.
        with lock:
            try:
                stamp = files.stamp()
                if stamp == seen[0]:
                    return None
                config = configuration()
            except (SetupError, OSError) as err:  # a file half rewritten: keep serving the old pair
                log.warning("TLS files unreadable; keeping the current certificate", extra={"error": str(err)})
                return None
            seen[0] = stamp
            log.info("TLS certificate reloaded", extra={"cert": str(files.cert)})
            return config

    return grpc.dynamic_ssl_server_credentials(configuration(), fetch, require_client_authentication=True)


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Credentials that trust the CA and present this service's certificate."""
    cert, key, ca = files.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


class ChannelFactory:
    """Channels to the other services: plaintext, or mutual TLS with this service's files.

    One channel per endpoint is kept and reused (gRPC multiplexes calls over it). When the
    TLS files change, the next request for a channel opens a new one with the new
    certificate and retires the old one after ``RETIRE_AFTER_S``.
    """

    def __init__(self, tls: TlsFiles | None, options: list[tuple[str, Any]] | None = None):
        self.tls = tls
        self.options = options or []
        self._stamp = tls.stamp() if tls is not None else ()
        self._credentials = channel_credentials(tls) if tls is not None else None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[tuple[str, Callable[..., Any]], Any] = {}
        self._closing: set[asyncio.Future[None]] = set()
        self._checked = time.monotonic()

    def _refresh(self) -> None:
        # At most one look at the files a second: channel() is on every pull query's path.
        if self.tls is None or time.monotonic() - self._checked < CHECK_EVERY_S:
            return
        self._checked = time.monotonic()
        try:
            stamp = self.tls.stamp()
            if stamp == self._stamp:
                return
            credentials = channel_credentials(self.tls)
        except (SetupError, OSError) as err:
            log.warning("TLS files unreadable; keeping the current certificate", extra={"error": str(err)})
            return
        self._stamp, self._credentials = stamp, credentials
        retired, self._channels, self._stubs = list(self._channels.values()), {}, {}
        loop = asyncio.get_running_loop()
        for channel in retired:
            loop.call_later(RETIRE_AFTER_S, self._close_retired, channel)

    def _close_retired(self, channel: grpc.aio.Channel) -> None:
        task = asyncio.ensure_future(channel.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def channel(self, endpoint: str) -> grpc.aio.Channel:
        """The shared channel to ``endpoint``."""
        self._refresh()
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = self._channels[endpoint] = self.open(endpoint)
        return channel

    def stub(self, endpoint: str, stub_class: Callable[[grpc.aio.Channel], S]) -> S:
        """A stub of ``stub_class`` over the shared channel to ``endpoint``."""
        channel = self.channel(endpoint)
        stub: S | None = self._stubs.get((endpoint, stub_class))
        if stub is None:
            stub = self._stubs[(endpoint, stub_class)] = stub_class(channel)
        return stub

    def open(self, endpoint: str) -> grpc.aio.Channel:
        """A new channel of the caller's own (close it when done)."""
        if self._credentials is None:
            return grpc.aio.insecure_channel(endpoint, options=self.options)
        return grpc.aio.secure_channel(endpoint, self._credentials, options=self.options)

    async def close(self) -> None:
        """Close every shared channel."""
        channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close()


@dataclass(frozen=True)
class ClientCredentials:
    """What a client (the CLI, a test, another program) connects with: the TLS files, and a
    bearer token sent as ``authorization`` metadata on every call (only over TLS: gRPC
    never sends call credentials in plaintext)."""

    tls: TlsFiles | None = None
    token: str | None = None

    def channel(self, endpoint: str, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
        """A blocking channel to ``endpoint``."""
        credentials = self._credentials()
        if credentials is None:
            return grpc.insecure_channel(endpoint, options=options)
        return grpc.secure_channel(endpoint, credentials, options=options)

    def aio_channel(self, endpoint: str, options: list[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
        """An asyncio channel to ``endpoint``."""
        credentials = self._credentials()
        if credentials is None:
            return grpc.aio.insecure_channel(endpoint, options=options)
        return grpc.aio.secure_channel(endpoint, credentials, options=options)

    def _credentials(self) -> grpc.ChannelCredentials | None:
        """The TLS and token credentials, or None for plaintext."""
        if self.tls is None:
            if self.token:
                raise SetupError("a bearer token is only sent over TLS: give the CA, certificate and key "
                                 "files too (--tls-ca-file, --tls-cert-file, --tls-key-file)")
            return None
        credentials = channel_credentials(self.tls)
        if self.token:
            credentials = grpc.composite_channel_credentials(credentials,
                                                             grpc.access_token_call_credentials(self.token))
        return credentials
