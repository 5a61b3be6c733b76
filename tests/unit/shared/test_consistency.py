"""Consistency tokens: round trip, merge keeps the larger offset, foreign text is refused."""

from __future__ import annotations

import pytest

from millpond.shared import consistency
from millpond.shared.errors import StatementError


def test_round_trip_and_merge() -> None:
    first = {("readings", 0): 5, ("readings", 3): 9}
    token = consistency.encode(first)
    assert token.startswith("v1.") and consistency.decode(token) == first
    merged = consistency.merge(first, {("readings", 0): 4, ("readings", 1): 2, ("other", 0): 1})
    assert merged == {("readings", 0): 5, ("readings", 1): 2, ("readings", 3): 9, ("other", 0): 1}
    assert consistency.encode({}) == "" and consistency.decode("") == {}
    assert consistency.of_partitions("t", [(0, 3), (1, -1)]) == {("t", 0): 3}


@pytest.mark.parametrize("token", ["abc", "v2.AAAA", "v1.!!!", "v1.AAAAAAA="])
def test_foreign_tokens_are_refused_with_what_to_send(token: str) -> None:
    with pytest.raises(StatementError, match="consistency_token"):
        consistency.decode(token)


def test_tokens_kept_made_are_those_of_their_positions() -> None:
    """``encode`` keeps the tokens it made: each is still its own positions' (the same
    positions in another order give the same token), past the most it keeps too."""
    for round_ in range(2):
        for offset in range(consistency._token.cache_info().maxsize + 10):
            positions = {("readings", offset % 7): offset, ("other", 1): round_}
            token = consistency.encode(positions)
            assert consistency.decode(token) == positions
            assert consistency.encode(dict(reversed(positions.items()))) == token
    kept = consistency._token.cache_info()
    assert kept.currsize <= kept.maxsize
    consistency.encode({("other", 1): 1, ("readings", 3): kept.maxsize + 9})  # the last one made: still kept
    assert consistency._token.cache_info().hits == kept.hits + 1


def test_a_token_of_many_positions_is_made_each_time_not_kept() -> None:
    positions = {("readings", p): 10 + p for p in range(consistency._ENCODED_POSITIONS + 1)}
    kept = consistency._token.cache_info()
    assert consistency.decode(consistency.encode(positions)) == positions
    assert consistency._token.cache_info() == kept  # neither asked nor kept


def test_a_token_naming_a_topic_longer_than_kafka_allows_is_refused() -> None:
    """A made-up token with a megabyte-long topic would be merged into every result's token and
    kept made; a real topic's name has at most 249 characters."""
    longest = consistency.encode({("t" * 249, 0): 1})
    assert consistency.decode(longest) == {("t" * 249, 0): 1}
    with pytest.raises(StatementError, match="longer than Kafka allows"):
        consistency.decode(consistency.encode({("t" * 1_000_000, 0): 1}))
