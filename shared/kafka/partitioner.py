"""Kafka's default partitioner for keyed records, exactly as the Java client computes it."""

from __future__ import annotations

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``) as a signed 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length - (length % 4)
    for i in range(0, end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, num_partitions: int) -> int:
    """The partition the Java client's default partitioner picks for a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions
