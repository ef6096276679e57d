"""Regular joins over changelogs (issue 35) on Weir and on Apache Flink 2.2.1 over the same topic of
Nexmark events: bench/flink/src/main/resources/nexmark/join_aggregates.sql (an inner join of two
GROUP BY results), left_join_bids.sql (auctions LEFT JOIN their bids' GROUP BY),
join_upsert_table.sql (bids joined with an 'upsert-kafka' table of auction tags, written here with
updates, deletes and re-inserts into ``<events topic>-upsert``, then grouped by tag), and
top_n_updating.sql (a Top-N without a window of a GROUP BY's result). Flink runs the
four in one job of ``weir.bench.NexmarkSql``, Weir in one job of the same statements on the session
cluster; each upsert-kafka output is compacted by key (a tombstone deletes its key) and compared as
the final table, record for record, Weir's with Flink's and both with plain Python's."""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bench.nexmark_bench import weir_sql_statement_set
from tests.integration.checkpointing.test_recovery import process_running, wait_until
from tests.integration.conftest import WeirCluster
from tests.integration.sql.side_by_side import NO_RETENTION, flink_build, output_topics, run_on_both_sides
from tests.integration.sql.test_kafka_layout_vs_flink import Json, compacted
from weir import nexmark as nx
from weir.connectors import kafka
from weir.tools.cli import sql_job_source
from weir.tools.nexmark_load import load
from weir.tools.supervisor import kill_process

pytestmark = pytest.mark.integration

QUERIES = ("join_aggregates", "left_join_bids", "join_upsert_table", "top_n_updating")
EVENTS = 6_000
CONFIG = nx.NexmarkConfig(events_per_second=500)
PARTITIONS = 4
TIMEOUT_S = 600.0

Tags = dict[int, tuple[str, int]]


def frozen_row(row: dict[str, Any]) -> Json:
    return tuple(sorted(row.items()))


def tag_changes(auction_ids: Sequence[int]) -> tuple[list[tuple[int, dict[str, Any] | None]], Tags]:
    """The upsert table's records in order (a key's row, or None: a tombstone) and its final rows:
    every auction tagged, a third retagged, some deleted, some of those tagged again, and a few keys
    never tagged (their bids join nothing)."""
    records: list[tuple[int, dict[str, Any] | None]] = []
    final: Tags = {}

    def put(auction: int, tag: str, weight: int) -> None:
        records.append((auction, {"auction": auction, "tag": tag, "weight": weight}))
        final[auction] = (tag, weight)

    def delete(auction: int) -> None:
        records.append((auction, None))
        final.pop(auction, None)

    for a in auction_ids:
        if a % 17 != 0:
            put(a, f"t{a % 7}", a % 5 + 1)
    for a in auction_ids:
        if a % 3 == 0:
            put(a, f"t{(a + 1) % 7}", 2)
        if a % 11 == 0:
            delete(a)
        if a % 22 == 0:
            put(a, "t-back", 3)
    return records, final


def expected(events: Sequence[Any], tags: Tags) -> dict[str, dict[Json, Json]]:
    """The three sinks' final tables in plain Python, keyed as the sinks key them."""
    auctions = [e for e in events if isinstance(e, nx.Auction)]
    bids = [e for e in events if isinstance(e, nx.Bid)]
    sold: Counter[int] = Counter(a.seller for a in auctions)
    by_bidder: dict[int, list[int]] = defaultdict(list)
    by_auction: dict[int, list[int]] = defaultdict(list)
    for b in bids:
        by_bidder[b.bidder].append(b.price)
        by_auction[b.auction].append(b.price)
    joined = {
        (("seller", s),): frozen_row({"seller": s, "auctions": n, "bids": len(by_bidder[s]), "top": max(by_bidder[s])})
        for s, n in sold.items()
        if s in by_bidder
    }
    left = {
        (("id", a.id),): frozen_row(
            {
                "id": a.id,
                "seller": a.seller,
                "bids": len(by_auction[a.id]) if a.id in by_auction else None,
                "top": max(by_auction[a.id]) if a.id in by_auction else None,
            }
        )
        for a in auctions
    }
    per_tag: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for b in bids:
        if b.auction in tags:
            tag, weight = tags[b.auction]
            per_tag[tag][0] += 1
            per_tag[tag][1] += b.price * weight
    tagged = {(("tag", t),): frozen_row({"tag": t, "bids": n, "volume": volume}) for t, (n, volume) in per_tag.items()}
    counts: dict[int, Counter[int]] = defaultdict(Counter)
    for b in bids:
        counts[b.auction][b.bidder] += 1
    top = {
        (("auction", auction), ("rownum", rownum)): frozen_row(
            {"auction": auction, "bidder": bidder, "bids": n, "rownum": rownum}
        )
        for auction, per_bidder in counts.items()
        for rownum, (bidder, n) in enumerate(sorted(per_bidder.items(), key=lambda b: (-b[1], b[0]))[:3], start=1)
    }
    return {"join_aggregates": joined, "left_join_bids": left, "join_upsert_table": tagged, "top_n_updating": top}


def prepare(endpoints: Any, topic: str) -> dict[str, dict[Json, Json]]:
    """The events' topic and its ``-upsert`` topic of tags written; the sinks' final tables in Python."""
    assert kafka.create_topic(endpoints, topic, PARTITIONS, 1, NO_RETENTION)
    producer = kafka.producer(endpoints, linger_ms=50, batch_num_messages=10_000, enable_idempotence=True)
    assert load(producer, topic, PARTITIONS, EVENTS, config=CONFIG) == EVENTS
    events = [nx.event(n, CONFIG) for n in range(EVENTS)]
    auction_ids = sorted({e.id for e in events if isinstance(e, nx.Auction)})
    records, tags = tag_changes([*auction_ids, max(auction_ids) + 1])
    assert kafka.create_topic(endpoints, f"{topic}-upsert", 2, 1, NO_RETENTION)
    for auction, row in records:  # one key's records in one partition, in order
        key = json.dumps({"auction": auction}).encode()
        producer.produce(f"{topic}-upsert", key=key, value=None if row is None else json.dumps(row).encode())
    assert producer.flush(60) == 0
    want = expected(events, tags)
    assert len(want["join_aggregates"]) > 30 and len(want["join_upsert_table"]) >= 7
    assert any(dict(v)["bids"] is None for v in want["left_join_bids"].values())  # auctions without a bid remain
    return want


@pytest.fixture(scope="module")
def changelog_events(weir_cluster: WeirCluster) -> tuple[str, dict[str, dict[Json, Json]]]:
    """The module's input, written once and read by both tests (each with its own consumer group and
    output topics): the events' topic and the sinks' final tables in Python."""
    topic = f"sql-changelog-join-{uuid.uuid4().hex[:8]}"
    return topic, prepare(weir_cluster.endpoints, topic)


def test_weir_joins_changelogs_as_flink_does(
    weir_cluster: WeirCluster,
    tmp_path_factory: pytest.TempPathFactory,
    changelog_events: tuple[str, dict[str, dict[Json, Json]]],
) -> None:
    build = flink_build()
    endpoints = weir_cluster.endpoints
    work = tmp_path_factory.mktemp("changelog-join-vs-flink")
    topic, want = changelog_events
    weir_out, flink_out = f"{topic}-weir", f"{topic}-flink"
    topics = output_topics(endpoints, weir_out, flink_out, QUERIES)
    run_on_both_sides(
        weir_cluster, build, work, queries=QUERIES, topic=topic, weir_out=weir_out, flink_out=flink_out,
        job_name="changelog_join",
    )  # fmt: skip

    for query in QUERIES:
        weir_table = compacted(endpoints, topics[f"weir-{query}"])
        flink_table = compacted(endpoints, topics[f"flink-{query}"])
        assert weir_table == flink_table, f"{query}: Weir's final table is not Flink's"
        assert weir_table == want[query], f"{query}: the final tables are not Python's"


def test_joins_of_changelogs_through_a_taskmanager_kill_leave_the_exact_final_tables(
    weir_cluster: WeirCluster, tmp_path: Path, changelog_events: tuple[str, dict[str, dict[Json, Json]]]
) -> None:
    """The same statements on Weir alone, the events read at a pace, a TaskManager running the job's
    tasks killed after two checkpoints: the job recovers from its last checkpoint (the joins' and
    aggregates' state, the sources' offsets, the exactly-once sinks' transactions) and its final
    tables are Python's."""
    endpoints = weir_cluster.endpoints
    topic, want = changelog_events
    out = f"{topic}-kill-weir"
    for query in QUERIES:
        assert kafka.create_topic(endpoints, f"{out}-{query}", 2, 1, NO_RETENTION)
    script = weir_sql_statement_set(QUERIES, topic=topic, output=out, bootstrap=endpoints.kafka_bootstrap, group=out)
    paced = script.replace(
        "'scan.bounded.mode' = 'latest-offset',\n  'format' = 'json'",
        "'scan.bounded.mode' = 'latest-offset',\n  'format' = 'json',\n  'scan.records-per-second' = '500'",
    )
    assert paced.count("scan.records-per-second") == 1, "the events table's options are not where they were"
    job_file = tmp_path / "changelog_join_kill.py"
    job_file.write_text(sql_job_source(paced))
    params = {"checkpointing.interval": "500ms", "restart.strategy": "fixed-delay", "restart.delay": "1s"}
    job_id = weir_cluster.submit(str(job_file), params, parallelism=2)
    status = wait_until(
        weir_cluster,
        job_id,
        lambda s: s.summary.status == "RUNNING" and (s.last_completed_checkpoint or 0) >= 2,
        "two completed checkpoints",
    )
    victim = random.Random(topic).choice(sorted({str(t.taskmanager_id) for t in status.tasks}))
    assert process_running(weir_cluster, victim), f"{victim} runs the job's tasks but is not running"
    killed_wall = time.time()
    kill_process(weir_cluster.directory, victim)
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.is_terminal, "the job to finish", TIMEOUT_S)
    assert final.summary.status == "FINISHED", final.failure
    assert final.last_restore_at is not None and final.last_restore_at >= killed_wall, "the kill caused no restore"
    for query in QUERIES:
        assert compacted(endpoints, f"{out}-{query}") == want[query], f"{query}: the final table is not Python's"
