"""The local Kafka broker runs transactions on a single node."""

from __future__ import annotations

import uuid

import pytest

from weir.connectors import kafka
from weir.core.config import Endpoints

pytestmark = pytest.mark.integration


def test_read_committed_sees_only_committed_transaction(services: Endpoints) -> None:
    topic = f"infra-txn-{uuid.uuid4().hex[:8]}"
    kafka.create_topics(services, {topic: 1})
    producer = kafka.producer(services, transactional_id=f"infra-test-{uuid.uuid4().hex[:8]}")
    producer.init_transactions(30)

    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, key=b"k", value=f"committed-{i}".encode())
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(2):
        producer.produce(topic, key=b"k", value=f"aborted-{i}".encode())
    producer.flush(30)
    producer.abort_transaction(30)

    committed = [v for _, _, _, v in kafka.read_all(services, topic, "read_committed")]
    uncommitted = [v for _, _, _, v in kafka.read_all(services, topic, "read_uncommitted")]

    assert committed == [b"committed-0", b"committed-1", b"committed-2"]
    assert uncommitted == [b"committed-0", b"committed-1", b"committed-2", b"aborted-0", b"aborted-1"]
    kafka.delete_topics(services, [topic])
