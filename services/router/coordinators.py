"""The router's channels to the coordinators, and which one leads."""

from __future__ import annotations

from millpond.coordinator.v1 import coordinator_pb2_grpc
from millpond.shared.config import RouterSettings
from millpond.shared.rpc.tls import ChannelFactory


class Coordinators:
    """Stubs to the coordinators, and which one said last that it leads."""

    def __init__(self, settings: RouterSettings, channels: ChannelFactory):
        self.settings = settings
        self.channels = channels
        self.leader = 0
        """Index of the coordinator that last said it leads (asked first)."""

    @property
    def endpoints(self) -> list[str]:
        """host:port of each coordinator, in configuration order."""
        return list(self.settings.coordinators)

    @property
    def stubs(self) -> list[coordinator_pb2_grpc.CoordinatorServiceStub]:
        """A stub per coordinator, in configuration order."""
        return [self.channels.stub(c, coordinator_pb2_grpc.CoordinatorServiceStub) for c in self.settings.coordinators]
