"""Upsert sinks keyed by columns that do not identify a row of the result (issue 35), on Weir and on
Apache Flink 2.2.1 over the same topic of Nexmark events: bench/flink/src/main/resources/nexmark/
materialize_group_by.sql (``GROUP BY auction, bidder HAVING COUNT(*) = 1`` into ``PRIMARY KEY
(auction)``) and materialize_left_join.sql (an upsert-kafka table of auction tags, written here with
updates, deletes and re-inserts into ``<events topic>-upsert``, LEFT JOIN the bids' GROUP BY, WHERE no
bid, into ``PRIMARY KEY (tag)``). Both planners add their SinkUpsertMaterializer
(``'table.exec.sink.upsert-materialize'`` AUTO, the default). Flink runs the two in one job of
``weir.bench.NexmarkSql``, Weir in one job of the same statements on the session cluster; each
upsert-kafka output is compacted by key (a tombstone deletes its key) and compared as the final
table, as multisets of whole rows, Weir's with Flink's and both with plain Python's."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from tests.integration.conftest import WeirCluster
from tests.integration.sql.side_by_side import NO_RETENTION, flink_build, output_topics, run_on_both_sides
from tests.integration.sql.test_kafka_layout_vs_flink import Json, compacted
from weir import nexmark as nx
from weir.connectors import kafka
from weir.sql import explain
from weir.tools.nexmark_load import load

pytestmark = pytest.mark.integration

QUERIES = ("materialize_group_by", "materialize_left_join")
EVENTS = 6_000
CONFIG = nx.NexmarkConfig(events_per_second=500)
PARTITIONS = 4


def frozen_row(row: dict[str, Any]) -> Json:
    return tuple(sorted(row.items()))


def tag_changes(auctions: Sequence[int], seed: int) -> tuple[list[tuple[int, dict[str, Any] | None]], dict[int, str]]:
    """The upsert table's records in order (a key's row, or None: a tombstone) and its final tags:
    about three auctions per tag; a third retagged, some deleted, some of those tagged again."""
    rng = random.Random(seed)
    tags = max(2, len(auctions) // 3)
    records: list[tuple[int, dict[str, Any] | None]] = []
    final: dict[int, str] = {}

    def put(auction: int, tag: str) -> None:
        records.append((auction, {"auction": auction, "tag": tag, "weight": 1}))
        final[auction] = tag

    for a in auctions:
        put(a, f"t{rng.randrange(tags)}")
    for a in auctions:
        roll = rng.random()
        if roll < 0.3:
            put(a, f"t{rng.randrange(tags)}")
        elif roll < 0.45:
            records.append((a, None))
            final.pop(a, None)
        if roll < 0.1:
            put(a, "t-back")
    return records, final


def expected(events: Sequence[Any], tags: dict[int, str]) -> dict[str, dict[Json, Json]]:
    """The two sinks' final tables in plain Python, keyed as the sinks key them."""
    bids = [e for e in events if isinstance(e, nx.Bid)]
    counts = Counter((b.auction, b.bidder) for b in bids)
    once = {a for (a, _bidder), n in counts.items() if n == 1}
    bid_on = {b.auction for b in bids}
    unbid = {t for a, t in tags.items() if a not in bid_on}
    return {
        "materialize_group_by": {(("auction", a),): frozen_row({"auction": a}) for a in once},
        "materialize_left_join": {(("tag", t),): frozen_row({"tag": t}) for t in unbid},
    }


def prepare(endpoints: Any, topic: str) -> dict[str, dict[Json, Json]]:
    """The events' topic and its ``-upsert`` topic of tags written; the sinks' final tables in Python."""
    assert kafka.create_topic(endpoints, topic, PARTITIONS, 1, NO_RETENTION)
    producer = kafka.producer(endpoints, linger_ms=50, batch_num_messages=10_000, enable_idempotence=True)
    assert load(producer, topic, PARTITIONS, EVENTS, config=CONFIG) == EVENTS
    events = [nx.event(n, CONFIG) for n in range(EVENTS)]
    auctions = sorted({e.id for e in events if isinstance(e, nx.Auction)})
    records, tags = tag_changes([*auctions, max(auctions) + 1], seed=35)
    assert kafka.create_topic(endpoints, f"{topic}-upsert", 2, 1, NO_RETENTION)
    for auction, row in records:  # one key's records in one partition, in order
        key = json.dumps({"auction": auction}).encode()
        producer.produce(f"{topic}-upsert", key=key, value=None if row is None else json.dumps(row).encode())
    assert producer.flush(60) == 0
    want = expected(events, tags)
    # the sink keys hold several rows on the way, and some keys leave: the materializer has work
    assert 20 <= len(want["materialize_group_by"]) < len({b.auction for b in events if isinstance(b, nx.Bid)})
    assert 5 <= len(want["materialize_left_join"]) < len(set(tags.values()))
    return want


def test_weir_materializes_upsert_sinks_as_flink_does(
    weir_cluster: WeirCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    build = flink_build()
    endpoints = weir_cluster.endpoints
    work = tmp_path_factory.mktemp("upsert-materialize-vs-flink")
    topic = f"sql-upsert-materialize-{uuid.uuid4().hex[:8]}"
    want = prepare(endpoints, topic)
    weir_out, flink_out = f"{topic}-weir", f"{topic}-flink"
    topics = output_topics(endpoints, weir_out, flink_out, QUERIES)
    scripts: list[str] = []

    def keep(script: str) -> str:
        scripts.append(script)
        return script

    run_on_both_sides(
        weir_cluster, build, work, queries=QUERIES, topic=topic, weir_out=weir_out, flink_out=flink_out,
        job_name="upsert_materialize", edit=keep,
    )  # fmt: skip
    (script,) = scripts
    assert explain(script).count("sink-upsert-materializer:") == 2  # both statements go through it

    for query in QUERIES:
        weir_table = compacted(endpoints, topics[f"weir-{query}"])
        flink_table = compacted(endpoints, topics[f"flink-{query}"])
        assert Counter(weir_table.values()) == Counter(flink_table.values()), f"{query}: Weir's rows are not Flink's"
        assert weir_table == flink_table, f"{query}: Weir's final table is not Flink's"
        assert weir_table == want[query], f"{query}: the final tables are not Python's"
