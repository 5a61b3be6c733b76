from hypothesis import given
from hypothesis import strategies as st

from millpond.shared.kafka.partitioner import murmur2, partition_for

# Kafka's own vectors (clients/src/test/.../UtilsTest.java, testMurmur2).
JAVA_VECTORS = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


def test_murmur2_matches_the_java_client() -> None:
    for text, expected in JAVA_VECTORS.items():
        assert murmur2(text.encode()) == expected, text


@given(st.binary(), st.integers(min_value=1, max_value=1000))
def test_partition_is_in_range_and_stable(key: bytes, partitions: int) -> None:
    p = partition_for(key, partitions)
    assert 0 <= p < partitions
    assert p == partition_for(key, partitions)
