import asyncio
import socket
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from millpond.deploy.local.kafka_broker import EmbeddedKafka


async def _round_trip(bootstrap: str) -> list[bytes]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic("launcher-test", num_partitions=2, replication_factor=1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="launcher-test")
    await producer.start()
    async with producer.transaction():
        await producer.send("launcher-test", b"hello", key=b"k", partition=1)
    await producer.stop()
    consumer = AIOKafkaConsumer("launcher-test", bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                isolation_level="read_committed")
    await consumer.start()
    try:
        batch = await consumer.getmany(timeout_ms=10_000)
        return [r.value for rs in batch.values() for r in rs]
    finally:
        await consumer.stop()


def test_broker_starts_answers_transactions_and_stops(tmp_path: Path) -> None:
    broker = EmbeddedKafka(tmp_path / "kafka")
    broker.start()
    try:
        assert broker.process is not None and broker.process.poll() is None
        assert asyncio.run(_round_trip(broker.bootstrap_servers)) == [b"hello"]
        process, port = broker.process, broker.port
    finally:
        broker.stop()
    assert process.poll() is not None, "the broker process must be gone after stop()"
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "nothing may listen on the broker port after stop()"
    # The broker logs through slf4j 1.7: with a binding of the wrong slf4j major it logs nothing.
    log = broker.log_file.read_text()
    assert "Kafka Server started" in log, f"the broker's log lacks its start line:\n{log[:2000]}"
