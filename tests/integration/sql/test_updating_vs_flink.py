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
import subprocess
import uuid
from collections import Counter, defaultdict
from typing import Any

import pytest

from bench.contenders import flink_available, flink_build_dir, flink_environment
from bench.nexmark_bench import PARALLELISM, flink_sql_argv, free_port, weir_sql_statement_set
from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import WeirCluster
from weir import nexmark as nx
from weir.connectors import kafka
from weir.tools.cli import sql_job_source
from weir.tools.nexmark_load import load

pytestmark = pytest.mark.integration

QUERIES = ("updating_having", "updating_filter")
COLUMNS = {"updating_having": ("auction", "bids", "top"), "updating_filter": ("bucket", "bidders", "busy", "spent")}
EVENTS = 20_000
CONFIG = nx.NexmarkConfig(events_per_second=500)
PARTITIONS = 8
NO_RETENTION = {"retention.ms": "-1"}
TIMEOUT_S = 600.0


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
    reason = flink_available()
    if reason is not None:
        pytest.fail(f"Flink is needed for this test and cannot run: {reason}", pytrace=False)
    build = flink_build_dir()
    endpoints = weir_cluster.endpoints
    work = tmp_path_factory.mktemp("updating-vs-flink")
    topic = f"sql-updating-vs-flink-{uuid.uuid4().hex[:8]}"
    assert kafka.create_topic(endpoints, topic, PARTITIONS, 1, NO_RETENTION)
    producer = kafka.producer(endpoints, linger_ms=50, batch_num_messages=10_000, enable_idempotence=True)
    assert load(producer, topic, PARTITIONS, EVENTS, config=CONFIG) == EVENTS
    expected = reference([nx.to_dict(nx.event(n, CONFIG)) for n in range(EVENTS)])
    assert sum(expected["updating_having"].values()) >= 100 and sum(expected["updating_filter"].values()) == 10
    weir_out, flink_out = f"{topic}-weir", f"{topic}-flink"
    for prefix in (weir_out, flink_out):
        for query in QUERIES:
            assert kafka.create_topic(endpoints, f"{prefix}-{query}", 2, 1, NO_RETENTION)
    log = work / "flink.log"
    argv = flink_sql_argv(
        build,
        query=",".join(QUERIES),
        bootstrap=endpoints.kafka_bootstrap,
        topic=topic,
        output=flink_out,
        group=f"{flink_out}-group",
        checkpoint_uri=f"file://{work / 'flink-checkpoints'}",
        checkpoint_interval="2s",
        rest_port=free_port(),
        mini_batch=False,  # every change emitted, as Weir's: a row that leaves HAVING is a tombstone on both
    )
    with log.open("wb") as out:
        flink = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=work,
            env=flink_environment(build, endpoints),
        )  # fmt: skip
    try:
        script = weir_sql_statement_set(
            QUERIES, topic=topic, output=weir_out, bootstrap=endpoints.kafka_bootstrap, group=weir_out
        )
        job_file = work / "updating_sql.py"
        job_file.write_text(sql_job_source(script))
        job_id = weir_cluster.submit(str(job_file), {"checkpointing.interval": "1s"}, parallelism=PARALLELISM)
        final = wait_until(weir_cluster, job_id, lambda s: s.summary.is_terminal, "Weir's job to finish", TIMEOUT_S)
        assert final.summary.status == "FINISHED", final.failure
        code = flink.wait(timeout=TIMEOUT_S)
    finally:
        if flink.poll() is None:
            flink.kill()
            flink.wait(30)
    assert code == 0, f"Flink's job failed (exit {code}):\n" + log.read_text()[-3000:]
    for query in QUERIES:
        weir, weir_tombstones = final_table(endpoints, f"{weir_out}-{query}", COLUMNS[query])
        flink_rows, flink_tombstones = final_table(endpoints, f"{flink_out}-{query}", COLUMNS[query])
        assert weir == flink_rows, f"{query}: Weir's final table is not Flink's"
        assert weir == expected[query], f"{query}: the final tables are not Python's"
        if query == "updating_having":  # an auction whose highest bid passes the bound is deleted
            assert weir_tombstones > 0 and flink_tombstones > 0, (weir_tombstones, flink_tombstones)
