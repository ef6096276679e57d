"""``python -m weir.tools.prepare`` (compose's init service) against the real Kafka, PostgreSQL and S3:
it creates what is missing, fills the input topic once, and a second run changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from weir.connectors import kafka, s3
from weir.core.config import Endpoints
from weir.tools.demo import TABLE_DEFINITION
from weir.tools.prepare import DEMO_INPUTS, Inputs, prepare

pytestmark = pytest.mark.integration


@pytest.fixture
def inputs(services: Endpoints, unique: str) -> Iterator[tuple[Endpoints, Inputs]]:
    endpoints = services.model_copy(update={"s3_bucket": f"prepare-{unique}"})
    chosen = Inputs(
        {f"events-{unique}": 3, f"results-{unique}": 2}, f"results_{unique}", TABLE_DEFINITION, f"events-{unique}"
    )
    yield endpoints, chosen
    s3.client(services).delete_bucket(Bucket=endpoints.s3_bucket)
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {chosen.table}")


def _rows(endpoints: Endpoints, table: str) -> list[tuple[object, ...]]:
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        return conn.execute(f"SELECT key, window_start FROM {table}").fetchall()


def test_prepare_creates_what_is_missing_once_and_keeps_it(inputs: tuple[Endpoints, Inputs]) -> None:
    endpoints, chosen = inputs
    prepare(endpoints, chosen, events=500)

    s3.client(endpoints).head_bucket(Bucket=endpoints.s3_bucket)  # raises when missing
    for topic, partitions in chosen.topics.items():
        assert kafka.topic_partition_count(endpoints, topic) == partitions
    assert sum(kafka.end_offsets(endpoints, chosen.input_topic).values()) == 500
    assert _rows(endpoints, chosen.table) == []

    # What a user did since is kept: a second run (the next `docker compose up`) creates nothing,
    # drops nothing and does not produce the events again.
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {chosen.table} VALUES ('k', 0, 1000, 1, 1)")
    prepare(endpoints, chosen, events=500)
    assert sum(kafka.end_offsets(endpoints, chosen.input_topic).values()) == 500
    assert _rows(endpoints, chosen.table) == [("k", 0)]


def test_the_demo_inputs_are_make_demos() -> None:
    from weir.tools import demo

    assert DEMO_INPUTS.topics == demo.TOPICS and DEMO_INPUTS.table == demo.TABLE
    assert DEMO_INPUTS.input_topic in demo.TOPICS
