"""Kafka record keys and values laid out by Flink's options ('key.format', 'key.fields',
'key.fields-prefix', 'value.fields-include' = 'EXCEPT_KEY'), on Weir and on Apache Flink 2.2.1 over the
same topic of Nexmark events (issue 35): bench/flink/src/main/resources/nexmark/kafka_key_fields.sql
(a 'kafka' sink keyed by two prefixed columns, the value the other two), upsert_key_prefix.sql (an
'upsert-kafka' GROUP BY keyed by a prefixed primary key, the value without it) and
upsert_key_order.sql (an 'upsert-kafka' GROUP BY keyed by three columns, its PRIMARY KEY in neither
name nor column order). Flink runs the three in one job of ``weir.bench.NexmarkSql``, Weir in one job
of the same statements on the session cluster.

What each wrote is compared record for record: the kafka topics' (key object, value object) pairs as
multisets, the upsert-kafka topics compacted by key as final tables, each also equal to plain
Python's over the events; and the record keys byte for byte with their partitions (a compacted topic
compares keys as bytes within a partition): the kafka topics' (partition, key bytes, value object)
as multisets, the key-ordered tables compacted by partition and key bytes, each key the bytes Flink's
JSON format writes in key order. Then one bounded Weir job reads the first two queries' four topics
back through tables with the same options (a 'kafka' table with key fields, an 'upsert-kafka' table
with a prefixed key) into plain topics: Weir reads what Flink writes and what it writes itself, whole
rows equal to Python's."""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from typing import Any

import pytest

from bench.nexmark_bench import PARALLELISM
from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import WeirCluster
from tests.integration.sql.side_by_side import (
    NO_RETENTION,
    flink_build,
    load_nexmark_topic,
    output_topics,
    run_on_both_sides,
)
from weir import nexmark as nx
from weir.connectors import kafka
from weir.tools.cli import sql_job_source

pytestmark = pytest.mark.integration

QUERIES = ("kafka_key_fields", "upsert_key_prefix", "upsert_key_order")
EVENTS = 6_000
CONFIG = nx.NexmarkConfig(events_per_second=500)
PARTITIONS = 4
TIMEOUT_S = 600.0

Json = tuple[tuple[str, Any], ...]


def frozen(raw: bytes) -> Json:
    value = json.loads(raw)
    assert isinstance(value, dict), raw
    return tuple(sorted(value.items()))


def reference(events: list[dict[str, Any]]) -> tuple[Counter[tuple[Json, Json]], dict[Json, Json]]:
    """The two sinks' records in plain Python: each bid's (key, value) objects; each bidder's final
    (key, value) of its bid count and highest price."""
    bids = [e for e in events if e["event_type"] == 2]
    keyed = Counter(
        (
            tuple(sorted({"bidder": b["bidder"], "auction": b["auction"]}.items())),
            tuple(sorted({"price": b["price"], "channel": b["channel"]}.items())),
        )
        for b in bids
    )
    prices: dict[int, list[int]] = defaultdict(list)
    for b in bids:
        prices[b["bidder"]].append(b["price"])
    table = {
        (("bidder", bidder),): tuple(sorted({"bids": len(p), "top": max(p)}.items())) for bidder, p in prices.items()
    }
    return keyed, table


def key_bytes(fields: dict[str, Any]) -> bytes:
    """A record key as Flink's JSON format writes it: compact, the fields in the key's order."""
    return json.dumps(fields, separators=(",", ":")).encode()


def keyed_reference(events: list[dict[str, Any]]) -> tuple[Counter[tuple[bytes, Json]], dict[bytes, Json]]:
    """kafka_key_fields' records with their key bytes ('key.fields' = 'k_bidder;k_auction'); the final
    table of upsert_key_order by key bytes (PRIMARY KEY (channel, auction, bidder))."""
    bids = [e for e in events if e["event_type"] == 2]
    keyed = Counter(
        (
            key_bytes({"bidder": b["bidder"], "auction": b["auction"]}),
            tuple(sorted({"price": b["price"], "channel": b["channel"]}.items())),
        )
        for b in bids
    )
    prices: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for b in bids:
        prices[(b["channel"], b["auction"], b["bidder"])].append(b["price"])
    table = {
        key_bytes({"channel": c, "auction": a, "bidder": bidder}): tuple(
            sorted({"bidder": bidder, "channel": c, "auction": a, "bids": len(p), "top": max(p)}.items())
        )
        for (c, a, bidder), p in prices.items()
    }
    return keyed, table


def raw_key_records(endpoints: Any, topic: str) -> Counter[tuple[int, bytes, Json]]:
    """Each record's partition, key bytes and value object, as a multiset."""
    out: Counter[tuple[int, bytes, Json]] = Counter()
    for partition, _o, key, value in kafka.read_all(endpoints, topic):
        assert key is not None and value is not None, f"{topic}: a record without a key or a value"
        out[(partition, key, frozen(value))] += 1
    return out


def compacted_by_bytes(endpoints: Any, topic: str) -> dict[tuple[int, bytes], Json]:
    """The committed records compacted by partition and key bytes, as a compacted topic keeps them."""
    table: dict[tuple[int, bytes], Json] = {}
    for partition, _o, key, value in sorted(kafka.read_all(endpoints, topic)):
        assert key is not None, f"{topic}: a record without a key"
        if value is None:
            table.pop((partition, key), None)
        else:
            table[(partition, key)] = frozen(value)
    return table


def records(endpoints: Any, topic: str) -> Counter[tuple[Json, Json]]:
    out: Counter[tuple[Json, Json]] = Counter()
    for _p, _o, key, value in kafka.read_all(endpoints, topic):
        assert key is not None and value is not None, f"{topic}: a record without a key or a value"
        out[(frozen(key), frozen(value))] += 1
    return out


def compacted(endpoints: Any, topic: str) -> dict[Json, Json]:
    """The committed records compacted by key in partition-offset order (a tombstone deletes its key)."""
    table: dict[Json, Json] = {}
    for _p, _o, key, value in sorted(kafka.read_all(endpoints, topic)):
        assert key is not None, f"{topic}: a record without a key"
        if value is None:
            table.pop(frozen(key), None)
        else:
            table[frozen(key)] = frozen(value)
    return table


def read_back_script(topics: dict[str, str], outputs: dict[str, str]) -> str:
    """Both sides' topics read through tables of the same options, into plain tables."""
    parts = []
    inserts = []
    for side in ("weir", "flink"):
        parts.append(
            f"""CREATE TABLE {side}_keyed (k_bidder BIGINT, k_auction BIGINT, price BIGINT, channel STRING) WITH (
  'connector' = 'kafka', 'topic' = '{topics[f"{side}-kafka_key_fields"]}', 'format' = 'json',
  'key.format' = 'json', 'key.fields' = 'k_bidder;k_auction', 'key.fields-prefix' = 'k_',
  'value.fields-include' = 'EXCEPT_KEY', 'scan.startup.mode' = 'earliest-offset',
  'scan.bounded.mode' = 'latest-offset');
CREATE TABLE {side}_per_bidder (k_bidder BIGINT, bids BIGINT, top BIGINT, PRIMARY KEY (k_bidder) NOT ENFORCED) WITH (
  'connector' = 'upsert-kafka', 'topic' = '{topics[f"{side}-upsert_key_prefix"]}', 'key.format' = 'json',
  'value.format' = 'json', 'key.fields-prefix' = 'k_', 'value.fields-include' = 'EXCEPT_KEY',
  'scan.bounded.mode' = 'latest-offset');
CREATE TABLE {side}_rows (bidder BIGINT, auction BIGINT, price BIGINT, channel STRING) WITH (
  'connector' = 'kafka', 'topic' = '{outputs[f"{side}-rows"]}', 'format' = 'json');
CREATE TABLE {side}_table (bidder BIGINT, bids BIGINT, top BIGINT, PRIMARY KEY (bidder) NOT ENFORCED) WITH (
  'connector' = 'upsert-kafka', 'topic' = '{outputs[f"{side}-table"]}', 'key.format' = 'json',
  'value.format' = 'json');"""
        )
        inserts.append(f"INSERT INTO {side}_rows SELECT k_bidder, k_auction, price, channel FROM {side}_keyed;")
        inserts.append(f"INSERT INTO {side}_table SELECT k_bidder, bids, top FROM {side}_per_bidder;")
    return "\n".join([*parts, "EXECUTE STATEMENT SET BEGIN", *inserts, "END;"]) + "\n"


def test_weir_lays_out_kafka_keys_and_values_as_flink_does_and_reads_flink_s(
    weir_cluster: WeirCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    build = flink_build()
    endpoints = weir_cluster.endpoints
    work = tmp_path_factory.mktemp("kafka-layout-vs-flink")
    topic = f"sql-kafka-layout-{uuid.uuid4().hex[:8]}"
    load_nexmark_topic(endpoints, topic, PARTITIONS, EVENTS, CONFIG)
    events = [nx.to_dict(nx.event(n, CONFIG)) for n in range(EVENTS)]
    expected_records, expected_table = reference(events)
    expected_keyed, expected_ordered = keyed_reference(events)
    assert len(expected_ordered) > 1_000
    assert sum(expected_records.values()) > 3_000 and len(expected_table) > 100
    weir_out, flink_out = f"{topic}-weir", f"{topic}-flink"
    topics = output_topics(endpoints, weir_out, flink_out, QUERIES)
    run_on_both_sides(
        weir_cluster, build, work, queries=QUERIES, topic=topic, weir_out=weir_out, flink_out=flink_out,
        job_name="kafka_layout",
    )  # fmt: skip

    weir_records = records(endpoints, topics["weir-kafka_key_fields"])
    assert weir_records == records(endpoints, topics["flink-kafka_key_fields"]), "Weir's records are not Flink's"
    assert weir_records == expected_records, "the records are not Python's"
    weir_table = compacted(endpoints, topics["weir-upsert_key_prefix"])
    assert weir_table == compacted(endpoints, topics["flink-upsert_key_prefix"]), "Weir's table is not Flink's"
    assert weir_table == expected_table, "the final tables are not Python's"
    # the keys' bytes (Flink's JSON key in key order, not by name) and their partitions (the Java
    # client's murmur2 of those bytes): both topics compact together
    weir_keyed = raw_key_records(endpoints, topics["weir-kafka_key_fields"])
    flink_keyed = raw_key_records(endpoints, topics["flink-kafka_key_fields"])
    assert weir_keyed == flink_keyed, "other key bytes or partitions than Flink's"
    unpartitioned: Counter[tuple[bytes, Json]] = Counter()
    for (_partition, key, value), n in weir_keyed.items():
        unpartitioned[(key, value)] += n
    assert unpartitioned == expected_keyed, "the key bytes are not 'key.fields' order's"
    weir_ordered = compacted_by_bytes(endpoints, topics["weir-upsert_key_order"])
    flink_ordered = compacted_by_bytes(endpoints, topics["flink-upsert_key_order"])
    assert weir_ordered == flink_ordered, "other key bytes or partitions than Flink's"
    assert {key: value for (_partition, key), value in weir_ordered.items()} == expected_ordered, (
        "the key bytes are not the PRIMARY KEY order's"
    )

    outputs = {
        f"{side}-{what}": f"{topic}-read-{side}-{what}" for side in ("weir", "flink") for what in ("rows", "table")
    }
    for name in outputs.values():
        assert kafka.create_topic(endpoints, name, 2, 1, NO_RETENTION)
    reader = work / "read_back.py"
    reader.write_text(sql_job_source(read_back_script(topics, outputs)))
    job_id = weir_cluster.submit(str(reader), {"checkpointing.interval": "1s"}, parallelism=PARALLELISM)
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.is_terminal, "the read-back job to finish", TIMEOUT_S)
    assert final.summary.status == "FINISHED", final.failure
    want_rows = Counter(
        tuple(sorted({**dict(key), **dict(value)}.items()))
        for (key, value), n in expected_records.items()
        for _ in range(n)
    )
    want_table = {key: tuple(sorted({**dict(key), **dict(value)}.items())) for key, value in expected_table.items()}
    for side in ("weir", "flink"):
        rows = Counter(
            frozen(v) for _p, _o, _k, v in kafka.read_all(endpoints, outputs[f"{side}-rows"]) if v is not None
        )
        assert rows == want_rows, f"{side}'s kafka topic read back is not the rows written"
        assert compacted(endpoints, outputs[f"{side}-table"]) == want_table, f"{side}'s upsert-kafka topic read back"
