"""Updating SQL results whose rows leave them, on Weir and on Apache Flink 2.2.1 over the same Kafka
topic of Nexmark events (issue 35): bench/flink/src/main/resources/nexmark/updating_having.sql (a
GROUP BY ... HAVING: an auction that stops passing is deleted) and updating_filter.sql (a WHERE and
FILTER (WHERE ...) aggregates over an updating result: a bidder who stops passing is retracted, a
bucket emptied is deleted), each into upsert-kafka, exactly-once. Flink runs them in one job of
``weir.bench.NexmarkSql`` (as tests/integration/sql/test_nexmark_vs_flink.py runs the suite's
queries), Weir in one job of the same statements on the session cluster. Each side's committed topic
(read_committed) is compacted by key in partition-offset order, a tombstone deleting its key, and
the two final tables are compared as multisets of whole rows, with each other and with plain
Python's over the same events; HAVING's topics must hold tombstones on both sides (Flink without
mini-batch, so that it emits every change as Weir does)."""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from typing import Any

import pytest

from tests.integration.conftest import WeirCluster
from tests.integration.sql.side_by_side import NO_RETENTION, flink_build, load_nexmark_topic, run_on_both_sides
from weir import nexmark as nx
from weir.connectors import kafka

pytestmark = pytest.mark.integration

QUERIES = ("updating_having", "updating_filter")
COLUMNS = {"updating_having": ("auction", "bids", "top"), "updating_filter": ("bucket", "bidders", "busy", "spent")}
EVENTS = 20_000
CONFIG = nx.NexmarkConfig(events_per_second=500)
PARTITIONS = 8


def reference(events: list[dict[str, Any]]) -> dict[str, Counter[tuple[Any, ...]]]:
    """The two queries' final tables in plain Python."""
    bids = [e for e in events if e["event_type"] == 2]
    auctions: dict[int, list[int]] = defaultdict(list)
    bidders: dict[int, list[int]] = defaultdict(list)
    for b in bids:
        auctions[b["auction"]].append(b["price"])
        bidders[b["bidder"]].append(b["price"])
    having = Counter((a, len(p), max(p)) for a, p in auctions.items() if max(p) < 27634713)
    buckets: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for bidder, prices in bidders.items():
        if sum(prices) > 12081771:
            buckets[bidder % 10].append((len(prices), sum(prices), max(prices)))
    filtered: Counter[tuple[Any, ...]] = Counter()
    for bucket, rows in buckets.items():
        spent = [s for _n, s, top in rows if top < 36747385]  # SUM over no row is NULL
        filtered[(bucket, len(rows), sum(1 for n, _s, _t in rows if n >= 9), sum(spent) if spent else None)] += 1
    return {"updating_having": having, "updating_filter": filtered}


def final_table(endpoints: Any, topic: str, columns: tuple[str, ...]) -> tuple[Counter[tuple[Any, ...]], int]:
    """The committed records compacted by key in partition-offset order (a tombstone deletes its key),
    as whole rows; and how many tombstones the topic holds."""
    table: dict[bytes, tuple[Any, ...]] = {}
    tombstones = 0
    for _p, _o, key, value in sorted(kafka.read_all(endpoints, topic)):
        assert key is not None, f"{topic}: a record without a key"
        if value is None:
            tombstones += 1
            table.pop(key, None)
            continue
        row = json.loads(value)
        table[key] = tuple(row[c] for c in columns)
    return Counter(table.values()), tombstones


def test_weir_s_deleting_updating_results_equal_flink_s(
    weir_cluster: WeirCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    build = flink_build()
    endpoints = weir_cluster.endpoints
    work = tmp_path_factory.mktemp("updating-vs-flink")
    topic = f"sql-updating-vs-flink-{uuid.uuid4().hex[:8]}"
    load_nexmark_topic(endpoints, topic, PARTITIONS, EVENTS, CONFIG)
    expected = reference([nx.to_dict(nx.event(n, CONFIG)) for n in range(EVENTS)])
    assert sum(expected["updating_having"].values()) >= 100 and sum(expected["updating_filter"].values()) == 10
    weir_out, flink_out = f"{topic}-weir", f"{topic}-flink"
    for prefix in (weir_out, flink_out):
        for query in QUERIES:
            assert kafka.create_topic(endpoints, f"{prefix}-{query}", 2, 1, NO_RETENTION)
    # Without mini-batch: every change emitted, as Weir's: a row that leaves HAVING is a tombstone on both.
    run_on_both_sides(
        weir_cluster, build, work, queries=QUERIES, topic=topic, weir_out=weir_out, flink_out=flink_out,
        job_name="updating_sql", mini_batch=False,
    )  # fmt: skip
    for query in QUERIES:
        weir, weir_tombstones = final_table(endpoints, f"{weir_out}-{query}", COLUMNS[query])
        flink_rows, flink_tombstones = final_table(endpoints, f"{flink_out}-{query}", COLUMNS[query])
        assert weir == flink_rows, f"{query}: Weir's final table is not Flink's"
        assert weir == expected[query], f"{query}: the final tables are not Python's"
        if query == "updating_having":  # an auction whose highest bid passes the bound is deleted
            assert weir_tombstones > 0 and flink_tombstones > 0, (weir_tombstones, flink_tombstones)
