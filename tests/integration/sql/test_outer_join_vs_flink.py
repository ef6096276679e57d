"""RIGHT and FULL joins of two changelogs (issue 35) on Weir and on Apache Flink 2.2.1 over the same
topic of Nexmark events: bench/flink/src/main/resources/nexmark/right_join_changelogs.sql (each
auction's bids as a GROUP BY result, the auctions ending in 3 under a NULL key, groups leaving through
HAVING, RIGHT JOIN an 'upsert-kafka' table of notes on auctions), full_join_changelogs.sql (the same
sides FULL JOINed) and full_join_grouped.sql (a GROUP BY over that FULL JOIN). The notes are written
here into ``<events topic>-upsert`` with updates, tombstones (also of keys never written), re-inserts,
rows written again unchanged, and NULL auctions. Flink runs the three in one job of
``weir.bench.NexmarkSql``, Weir in one job of the same statements on the session cluster; each
exactly-once upsert-kafka output compacted by key is compared as the final table, record for record,
Weir's with Flink's and both with plain Python's (tests/unit/weir/sql/test_changelog_join_sql.py's
reference, which also runs the files in process)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.integration.conftest import WeirCluster
from tests.integration.sql.side_by_side import NO_RETENTION, flink_build, output_topics, run_on_both_sides
from tests.integration.sql.test_kafka_layout_vs_flink import Json, compacted
from tests.unit.weir.sql.test_changelog_join_sql import (
    OUTER_QUERIES,
    assert_outer_cases,
    auctions_to_note,
    expected_outer_joins,
    note_history,
)
from weir import nexmark as nx
from weir.connectors import kafka
from weir.tools.nexmark_load import load

pytestmark = pytest.mark.integration

EVENTS = 6_000
CONFIG = nx.NexmarkConfig(events_per_second=500)
PARTITIONS = 4


def prepare(endpoints: Any, topic: str) -> dict[str, dict[Json, Json]]:
    """The events' topic and its ``-upsert`` topic of notes written; the sinks' final tables in Python."""
    assert kafka.create_topic(endpoints, topic, PARTITIONS, 1, NO_RETENTION)
    producer = kafka.producer(endpoints, linger_ms=50, batch_num_messages=10_000, enable_idempotence=True)
    assert load(producer, topic, PARTITIONS, EVENTS, config=CONFIG) == EVENTS
    events = [nx.event(n, CONFIG) for n in range(EVENTS)]
    records, notes = note_history(auctions_to_note(events))
    assert kafka.create_topic(endpoints, f"{topic}-upsert", 2, 1, NO_RETENTION)
    for note_id, row in records:  # one key's records in one partition, in order
        key = json.dumps({"id": note_id}).encode()
        producer.produce(f"{topic}-upsert", key=key, value=None if row is None else json.dumps(row).encode())
    assert producer.flush(60) == 0
    want = expected_outer_joins(events, notes)
    for query in OUTER_QUERIES:
        assert_outer_cases(query, want[query])
    return want


def test_weir_right_and_full_joins_of_changelogs_end_as_flink_s(
    weir_cluster: WeirCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    build = flink_build()
    endpoints = weir_cluster.endpoints
    work = tmp_path_factory.mktemp("outer-join-vs-flink")
    topic = f"sql-outer-join-{uuid.uuid4().hex[:8]}"
    want = prepare(endpoints, topic)
    weir_out, flink_out = f"{topic}-weir", f"{topic}-flink"
    topics = output_topics(endpoints, weir_out, flink_out, OUTER_QUERIES)
    run_on_both_sides(
        weir_cluster, build, work, queries=OUTER_QUERIES, topic=topic, weir_out=weir_out, flink_out=flink_out,
        job_name="outer_join",
    )  # fmt: skip

    for query in OUTER_QUERIES:
        weir_table = compacted(endpoints, topics[f"weir-{query}"])
        flink_table = compacted(endpoints, topics[f"flink-{query}"])
        assert weir_table == flink_table, f"{query}: Weir's final table is not Flink's"
        assert weir_table == want[query], f"{query}: the final tables are not Python's"
