"""The Nexmark queries' SQL on Weir and on Apache Flink over the same Kafka topic: the outputs are the
same records, record for record (issue 35's proof).

One topic is loaded once with Nexmark events (``weir.tools.nexmark_load``: 8 partitions, each in
event-time order). For each query, the same SQL text runs on both: the DDL of
examples/sql/nexmark-ddl.sql (the flat ``events`` table, the ``person``, ``auction`` and ``bid``
views) over that topic, bounded (``scan.bounded.mode = latest-offset``), and the query's file
bench/flink/src/main/resources/nexmark/qN.sql with its ``${SINK}`` an exactly-once Kafka sink (the
same options on both), the eight INSERTs in one job on each side (a statement set: one JVM start and
one deployment instead of eight), with the mini-batch NexmarkSql gives Flink (``SET
'table.exec.mini-batch.*'``: 2 s, 50,000 rows) on both sides. Flink 2.2.1 runs it on a MiniCluster
in a JVM (``weir.bench.NexmarkSql``, the
benchmark's runner, built by bench/flink/build.sh as ``make bench-deps`` does: from Maven Central
into the cache), Weir on the session cluster (``weir sql``'s job file). Each side's committed output
is read back and decoded into whole records by one function (``bench.nexmark_bench.output_record``:
integers as ints, a TIMESTAMP(3) as epoch milliseconds whether written as SQL text or a number, a
DECIMAL to 3 places) and the two are compared as multisets. The plain-Python reference
(``weir.tools.nexmark_reference``) over the same events is in the failure message, to say which side
differs from it. q4 (an aggregation of an updating aggregation: retractions), q9 (winning bids: a Top-N
of a regular join, the row number not selected, keyed by the auction), q18 (deduplication:
each bidder's last bid per auction) and q19 (each auction's top 10 bids, a Top-N; tied bids compared
with one row number, ``QuerySpec.rank_ties``) are updating: both sides
write them to upsert-kafka (``${UPSERT_SINK}``), and each side's final table (the upserts applied in
partition-offset order, a tombstone deleting its key: ``bench.nexmark_bench.committed_records``) is
compared, as a multiset of whole rows; the others are append streams, every record compared. q10
writes a partitioned 'filesystem' table (CSV part files in folders ``dt=.../hm=...``): each side's
folder is read back as rows (``file_records``: each visible file's lines with its folder's partition
values; file names differ and are not compared). q13 (a
lookup join of the suite's side input file) runs in Weir's job only: Flink 2.2.1 refuses it
(``FLINK_REFUSES``), so its output is compared with the reference's.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.evidence import compare_records
from bench.nexmark_bench import (
    FLINK_REFUSES,
    SPECS,
    SQL_FUNCTIONS_MODULE,
    committed_records,
    expected_records,
    file_output,
    file_records,
    identity_of,
)
from tests.integration.conftest import WeirCluster
from tests.integration.sql.side_by_side import (
    NO_RETENTION,
    flink_build,
    load_nexmark_topic,
    run_on_both_sides,
    run_on_flink_only,
)
from weir import nexmark as nx
from weir.connectors import kafka
from weir.tools import nexmark_reference as ref

pytestmark = pytest.mark.integration

QUERIES = (
    *("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q9", "q10", "q11", "q14", "q15", "q16", "q17"),
    *("q18", "q19", "q20", "q21", "q22"),
)
WEIR_ONLY = ("q13",)
"""Queries Apache Flink 2.2.1 refuses (``bench.nexmark_bench.FLINK_REFUSES``: q13's lookup join of a
'filesystem' table): run on Weir in the same job, their output compared with the plain-Python
reference only."""
EVENTS = 20_000
CONFIG = nx.NexmarkConfig(events_per_second=500)  # 40 s of event time: 4 tumbling windows, 20 sliding ones
PARTITIONS = 8
LEAST = {
    "q0": 10_000,
    "q1": 10_000,
    "q2": 20,
    "q3": 5,
    "q4": 5,
    "q5": 20,
    "q7": 4,
    "q8": 10,
    "q9": 1_000,
    "q10": 10_000,
    "q11": 100,
    "q13": 10_000,
    "q14": 2_000,
    "q15": 1,
    "q16": 1_000,
    "q17": 1_000,
    "q18": 1_000,
    "q19": 1_000,
    "q20": 2_000,
    "q21": 10_000,
    "q22": 10_000,
}
"""Records the reference gives, at least (an empty result on both sides would prove nothing; q15's
final table is one row, a day's 12 figures, as the 40 s of events are in one day)."""


@dataclass(frozen=True)
class NexmarkTopic:
    topic: str
    expected: dict[str, list[tuple[Any, ...]]]


@pytest.fixture(scope="module")
def build() -> Path:
    """The Flink runner (bench/flink/build.sh; the first build downloads Flink from Maven Central, ~2 min)."""
    return flink_build()


@pytest.fixture(scope="module")
def nexmark_topic(weir_cluster: WeirCluster) -> NexmarkTopic:
    topic = f"sql-vs-flink-{uuid.uuid4().hex[:8]}"
    load_nexmark_topic(weir_cluster.endpoints, topic, PARTITIONS, EVENTS, CONFIG)
    events = [nx.event(n, CONFIG) for n in range(EVENTS)]
    expected = {q: expected_records(q, getattr(ref, q)(events)) for q in (*QUERIES, *WEIR_ONLY)}
    return NexmarkTopic(topic, expected)


def records(endpoints: Any, query: str, topic: str) -> Counter[tuple[Any, ...]]:
    """A query's committed output as a multiset of whole records (``committed_records``: one record per
    row, each value in the one form both sides are compared in, an updating query's final table; a
    row that is not a record of the query becomes a record that matches nothing); a 'filesystem'
    query's (q10) the rows of the visible part files in its folder (``file_records``)."""
    if SPECS[query].files:
        return Counter(file_records(query, file_output(topic)))
    read = kafka.read_all(endpoints, topic)
    if not SPECS[query].upsert_key:  # an append output's records all have values
        read = [(p, o, k, v) for p, o, k, v in read if v]
    found, notes = committed_records(query, read)
    assert not notes, f"{topic}: {notes}"
    return Counter(found)


@dataclass(frozen=True)
class Outputs:
    """Each side's output topic prefix: the query's output is ``<prefix>-<query>``."""

    weir: str
    flink: str


@pytest.fixture(scope="module")
def outputs(
    weir_cluster: WeirCluster, build: Path, nexmark_topic: NexmarkTopic, tmp_path_factory: pytest.TempPathFactory
) -> Outputs:
    """The queries run once on each side, at the same time: one Flink job (a JVM) and one Weir
    job (``weir sql``'s job file of the same statements, the INSERTs in one statement set), both with
    the mini-batch NexmarkSql gives Flink (its --mini-batch defaults to true)."""
    endpoints = weir_cluster.endpoints
    work = tmp_path_factory.mktemp("nexmark-vs-flink")
    sides = Outputs(weir=f"{nexmark_topic.topic}-weir", flink=f"{nexmark_topic.topic}-flink")
    for prefix in (sides.weir, sides.flink):
        for query in QUERIES:
            if not SPECS[query].files:
                assert kafka.create_topic(endpoints, f"{prefix}-{query}", 2, 1, NO_RETENTION)
    for query in WEIR_ONLY:
        assert kafka.create_topic(endpoints, f"{sides.weir}-{query}", 2, 1, NO_RETENTION)
    run_on_both_sides(
        weir_cluster, build, work, queries=QUERIES, topic=nexmark_topic.topic, weir_out=sides.weir,
        flink_out=sides.flink, job_name="nexmark_sql", mini_batch=True, weir_only=WEIR_ONLY,
        functions_module=SQL_FUNCTIONS_MODULE,
    )  # fmt: skip
    return sides


@pytest.mark.parametrize("query", WEIR_ONLY)
def test_flink_still_refuses_the_query_weir_runs_alone(
    weir_cluster: WeirCluster, build: Path, nexmark_topic: NexmarkTopic, tmp_path: Path, query: str
) -> None:
    """The reason a query is compared with the reference only: Flink 2.2.1 refuses it, with the error
    ``FLINK_REFUSES`` says (a Flink that runs it would fail this test: compare it with Flink then)."""
    code, output = run_on_flink_only(build, tmp_path, weir_cluster.endpoints, query, nexmark_topic.topic)
    assert code != 0, f"Flink ran {query}: compare it with Flink's output now\n{output[-2000:]}"
    assert FLINK_REFUSES[query] in output, output[-3000:]


@pytest.mark.parametrize("query", WEIR_ONLY)
def test_weir_sql_output_of_a_query_flink_refuses_equals_the_reference(
    weir_cluster: WeirCluster, nexmark_topic: NexmarkTopic, outputs: Outputs, query: str
) -> None:
    """q13 (each bid joined with the suite's side input file at ``auction % 10000``): Flink 2.2.1
    refuses it (``FLINK_REFUSES``); Weir's output is the plain-Python reference's, record for record."""
    assert query in FLINK_REFUSES
    expected = Counter(nexmark_topic.expected[query])
    assert sum(expected.values()) >= LEAST[query]
    weir = records(weir_cluster.endpoints, query, f"{outputs.weir}-{query}")
    if weir != expected:
        diff = compare_records(list(expected.elements()), list(weir.elements()), identity_of(SPECS[query]))
        pytest.fail(f"{query}: Weir's output is not the reference's: {diff.summary()}", pytrace=False)


@pytest.mark.parametrize("query", QUERIES)
def test_weir_sql_output_equals_flink_sql_output(
    weir_cluster: WeirCluster, nexmark_topic: NexmarkTopic, outputs: Outputs, query: str
) -> None:
    endpoints = weir_cluster.endpoints
    expected = nexmark_topic.expected[query]
    assert len(expected) >= LEAST[query]
    weir = records(endpoints, query, f"{outputs.weir}-{query}")
    flink = records(endpoints, query, f"{outputs.flink}-{query}")
    identity = identity_of(SPECS[query])
    if weir != flink:
        vs_flink = compare_records(list(flink.elements()), list(weir.elements()), identity)
        weir_vs_ref = compare_records(expected, list(weir.elements()), identity)
        flink_vs_ref = compare_records(expected, list(flink.elements()), identity)
        pytest.fail(
            f"{query}: Weir's output is not Flink's: {vs_flink.summary()}\n"
            f"  Weir vs the reference: {weir_vs_ref.summary()}\n  Flink vs the reference: {flink_vs_ref.summary()}",
            pytrace=False,
        )
    assert sum(weir.values()) >= LEAST[query]
