"""The router's cluster status names each coordinator's part when none leads, a coordinator
stuck claiming the leadership included."""

from __future__ import annotations

from typing import Any, cast

import pytest

from millpond.coordinator.v1 import coordinator_pb2
from millpond.services.coordinator.converters import with_election
from millpond.services.coordinator.leadership import ElectionState, ElectionStatus
from millpond.services.router.hosts import HostTable
from millpond.services.router.status import ClusterStatus
from millpond.shared.errors import UnavailableError


class Stub:
    def __init__(self, reply: coordinator_pb2.GetClusterStatusResponse):
        self.reply = reply

    async def GetClusterStatus(self, request: Any, **call: Any) -> coordinator_pb2.GetClusterStatusResponse:
        return self.reply


class FakeCoordinators:
    def __init__(self, replies: dict[str, coordinator_pb2.GetClusterStatusResponse]):
        self.endpoints = list(replies)
        self.stubs = [Stub(r) for r in replies.values()]


def _reply(election: ElectionStatus, leader: bool = False) -> coordinator_pb2.GetClusterStatusResponse:
    return with_election(coordinator_pb2.GetClusterStatusResponse(leader=leader), election)


async def test_a_coordinator_electing_in_vain_shows_as_such_and_the_cluster_as_leaderless() -> None:
    coordinators = FakeCoordinators({
        "c1:1": _reply(ElectionStatus(ElectionState.ELECTING, 15, "ConnectionError: broker unreachable")),
        "c2:1": _reply(ElectionStatus()),
    })
    status = ClusterStatus(cast(Any, coordinators), HostTable(1.0), lambda: 0, 1.0)
    with pytest.raises(UnavailableError) as err:
        await status.get()
    assert err.value.message.startswith(
        "no coordinator leads the cluster (c1:1: electing, without a leader until its claim is written (15 claims "
        "failed, the last: ConnectionError: broker unreachable); c2:1: follower)")


async def test_the_leaders_view_is_answered() -> None:
    leader = _reply(ElectionStatus(ElectionState.LEADING), leader=True)
    status = ClusterStatus(cast(Any, FakeCoordinators({"c1:1": _reply(ElectionStatus()), "c2:1": leader})),
                           HostTable(1.0), lambda: 2, 1.0)
    answer = await status.get()
    assert answer.cluster.election == coordinator_pb2.ELECTION_STATE_LEADING and answer.push_queries == 2
