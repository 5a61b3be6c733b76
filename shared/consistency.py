"""Consistency tokens: the input positions a client has seen, carried from result to request.

A token is the highest offset per topic partition that results given to the client
reflected (ksqlDB's consistency vector, which it only offers for pull queries on one
node). A pull result reflects, per table partition, how far the answering copy processed
the table's input topic; an INSERT reflects the offset after the record it wrote. Tokens
merge by taking the larger offset per partition, so the token a client holds only grows,
and a router that serves no copy older than the token gives monotonic reads across
failover and read-your-writes after an INSERT.

On the wire: ``v1.`` + base64url of a ``millpond.common.v1.ConsistencyVector``.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Iterable, Mapping

from google.protobuf.message import DecodeError

from millpond.common.v1 import rows_pb2
from millpond.shared.errors import StatementError

Positions = dict[tuple[str, int], int]
"""(topic, partition) -> the next offset not reflected."""

_PREFIX = "v1."
_ENCODED_POSITIONS = 4
"""The most positions of a token kept made (``_token``): a client's token grows with what it
read and rarely repeats exactly, and the tokens kept must stay small (a request can carry
megabytes)."""


def merge(*vectors: Mapping[tuple[str, int], int]) -> Positions:
    """The larger offset per topic partition."""
    out: Positions = {}
    for vector in vectors:
        for tp, offset in vector.items():
            if offset > out.get(tp, -1):
                out[tp] = offset
    return out


def encode(positions: Mapping[tuple[str, int], int]) -> str:
    """The token for ``positions`` (empty text for none)."""
    if not positions:
        return ""
    ordered = tuple(sorted(positions.items()))
    return _token(ordered) if len(ordered) <= _ENCODED_POSITIONS else _make_token(ordered)


def _make_token(ordered: tuple[tuple[tuple[str, int], int], ...]) -> str:
    vector = rows_pb2.ConsistencyVector(positions=[
        rows_pb2.Position(topic=t, partition=p, offset=o) for (t, p), o in ordered])
    return _PREFIX + base64.urlsafe_b64encode(vector.SerializeToString()).decode()


_token = functools.lru_cache(maxsize=4096)(_make_token)
"""Tokens of few positions, kept made: a pull of one key gives one of a few (its partition's
position moves a batch at a time), and making one is most of what a token costs a lookup."""


MAX_TOPIC_CHARS = 249
"""Kafka's longest topic name: a token naming a longer one was not issued here (and one made
up with a megabyte-long name, merged into each result's token, would be kept made by ``_token``)."""


def decode(token: str) -> Positions:
    """The positions of a token (empty text: none); StatementError when it is not a token."""
    if not token:
        return {}
    problem = "send back the consistency_token of an earlier result unchanged, or none"
    if not token.startswith(_PREFIX):
        raise StatementError(f"consistency_token has an unknown version; {problem}")
    try:
        vector = rows_pb2.ConsistencyVector.FromString(
            base64.b64decode(token[len(_PREFIX):], altchars=b"-_", validate=True))
    except (binascii.Error, ValueError, DecodeError):
        raise StatementError(f"consistency_token is not a token this cluster issued; {problem}") from None
    if not vector.positions:
        raise StatementError(f"consistency_token holds no positions; {problem}")
    if any(len(p.topic) > MAX_TOPIC_CHARS for p in vector.positions):  # no such topic: a made-up token
        raise StatementError(f"consistency_token names a topic longer than Kafka allows; {problem}")
    return merge(*({(p.topic, p.partition): p.offset} for p in vector.positions))


def of_partitions(topic: str, offsets: Iterable[tuple[int, int]]) -> Positions:
    """Positions of one topic's partitions, skipping unknown ones (negative offsets)."""
    return {(topic, p): o for p, o in offsets if o >= 0}
