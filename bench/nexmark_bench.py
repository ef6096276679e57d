"""Nexmark on Weir and on Apache Flink: each query on both, the same events from the same topic,
every figure the median of repeated runs with its spread, every output checked record for record.

``make bench-nexmark`` runs ``python -m bench.nexmark_bench [--quick] [--events N] [--queries q0,q1]
[--runs 3] [--event-rate 10000000] [--checkpoint-interval 180s] [--load-wait S]``:

1. N Nexmark events (``weir.tools.nexmark_load``, default 1,000,000; ``--quick`` 100,000) into one
   8-partition topic, once, at the Nexmark suite's event-time rate (10M events per second of event
   time, its ``nexmark.workload.suite.100m.tps``); every run of both contenders reads it from the
   start (bounded);
2. runs: ``--runs`` (3) rounds; in each, every query, the two contenders in an order that
   alternates from query to query and from round to round (ABBA); before each run the load gate
   waits for the 1-minute load average to fall to the core count, else marks the run under load;
3. per run, Weir: a fresh private cluster (JobManager, 3 TaskManagers; its start-up is in the run,
   as Flink's JVM start-up is) running ``examples/nexmark/qN.py`` at ``-p 3``, exactly-once Kafka
   sink, a checkpoint every ``--checkpoint-interval`` to the S3 server; Flink: a fresh JVM running
   the reference's ``qN.sql`` as the reference configures Flink (``weir.bench.NexmarkSql``:
   RocksDB, incremental checkpoints at the same interval on the same S3 server, mini-batch 2 s /
   50,000 rows, split distinct aggregates, parallelism 3, exactly-once Kafka sink). An updating
   query (q4) is the same program on both sides: Weir's job emits the running result at every
   change (``-D q4.updates=true``) keyed by the row's key, as Flink's upsert-kafka sink does;
4. figures, each the median (min-max) over the runs: events/s and CPU seconds per million events
   over the whole run (launch to job finished) and over 10-90 % of the input (per-process CPU
   samples every 0.2 s against the records the source read: Weir's
   ``weir_source_records_read_total``, Flink's ``numRecordsOut`` of its source from the REST API),
   the S3 server's CPU during the run counted to the contender; a warm-up ratio (CPU per
   event over 10-50 % of the input / over 50-90 %) shows whether the JVM's JIT is noise in the
   steady state; Weir / Flink ratios of the medians;
5. output: each run's committed output decoded into whole records and compared with the
   plain-Python reference (``weir.tools.nexmark_reference``) over the same events as a multiset
   (an updating query as its final table: upserts applied in order); a mismatch fails that
   contender's figure for the query.

A query is in the run when its Weir job file exists (``examples/nexmark/qN.py``); its Flink side
when ``bench/flink/src/main/resources/nexmark/qN.sql`` does. Results: ``bench/results/nexmark.json``,
``nexmark.md`` and ``nexmark.png``, with the provenance block (``bench/provenance.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from bench import provenance
from bench.evidence import (
    RecordDiff,
    RunOutcome,
    Sample,
    Upsert,
    compare_records,
    figure_of,
    final_table,
    run_order,
    spread_label,
    steady_state,
    with_notes,
)
from bench.harness import (
    REPO_ROOT,
    RESULTS_DIR,
    BenchEnvironment,
    BenchError,
    ProcessSampler,
    ensure_services,
    load_gate,
    log,
    new_run_id,
    prepare_environment,
    publish_results,
    reap,
    remove_checkpoints,
    remove_run_root,
    s3_server_pid,
    start_private_cluster,
)
from weir.tools.nexmark_reference import SIDE_INPUT_ROWS, side_input_text

QUERY_ORDER: Final = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q11")
QUICK_QUERIES: Final = ("q0", "q1", "q2")
EXAMPLES_DIR: Final = REPO_ROOT / "examples" / "nexmark"
FLINK_SQL_DIR: Final = REPO_ROOT / "bench" / "flink" / "src" / "main" / "resources" / "nexmark"
FLINK_SQL_MAIN: Final = "weir.bench.NexmarkSql"
PARTITIONS: Final = 8
PARALLELISM: Final = 3
FULL_EVENTS: Final = 1_000_000
QUICK_EVENTS: Final = 100_000
RUNS: Final = 3
EVENT_RATE: Final = 10_000_000
"""Events per second of event time: the Nexmark suite's (nexmark.yaml, ``nexmark.workload.suite.100m.tps``)."""
CHECKPOINT_INTERVAL: Final = "180s"
"""The reference's ``execution.checkpointing.interval: 180000``, given to both contenders."""
LOAD_WAIT_S: Final = 180.0
QUICK_LOAD_WAIT_S: Final = 60.0
SIDES: Final = ("weir", "flink")
JOB_TIMEOUT_S: Final = 900.0
SAMPLE_S: Final = 0.2
S3_SERVER: Final = "s3-server"
WEIR_SOURCE_UID: Final = "nexmark-source"
FIGURES: Final = ("steady_eps", "steady_cpu_s_per_million", "whole_eps", "whole_cpu_s_per_million", "s3_cpu_s")


# Query selection (pure) ----------------------------------------------------------------------------------


def query_key(name: str) -> tuple[int, str]:
    digits = name[1:]
    return (int(digits), name) if name.startswith("q") and digits.isdigit() else (10**6, name)


def present_queries(examples_dir: Path = EXAMPLES_DIR) -> list[str]:
    """The Nexmark queries with a Weir job file, in query order."""
    found = [p.stem for p in examples_dir.glob("q*.py") if p.stem[1:].isdigit()]
    return sorted(found, key=query_key)


FLINK_REFUSES: Final = {
    "q13": "Temporal Table Join requires primary key in versioned table",
}
"""The query files Apache Flink 2.2.1 refuses, with (the start of) its error: run on Weir only. q13:
its 'filesystem' connector is no lookup source, so FOR SYSTEM_TIME AS OF reads it as a versioned
table (tests/integration/sql/test_nexmark_vs_flink.py checks that Flink still refuses it)."""


def flink_queries(sql_dir: Path = FLINK_SQL_DIR) -> set[str]:
    """The query files Flink runs (those it refuses left out)."""
    return {p.stem for p in sql_dir.glob("q*.sql")} - FLINK_REFUSES.keys()


def sql_queries(sql_dir: Path = FLINK_SQL_DIR) -> list[str]:
    """``--sql``: the queries with a SQL file (Weir's SQL runs each), in query order."""
    return sorted((p.stem for p in sql_dir.glob("q*.sql")), key=query_key)


WALL_CLOCK_QUERIES: Final = frozenset({"q12"})
"""The query files whose output depends on when each event is processed (q12's processing-time
windows): no reference output to check a run against (tests/integration/sql/test_nexmark_q12.py
checks its invariants against Flink's)."""


def measured_sql_queries(sql_dir: Path = FLINK_SQL_DIR) -> list[str]:
    """The SQL queries ``--sql`` measures: those with a Kafka output (q10 writes files; the Flink
    comparison test checks it) whose output can be checked (not ``WALL_CLOCK_QUERIES``)."""
    return [q for q in sql_queries(sql_dir) if not (q in SPECS and SPECS[q].files) and q not in WALL_CLOCK_QUERIES]


def select_queries(
    requested: Sequence[str] | None, *, quick: bool, present: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The queries to run and the requested ones skipped (no job file). Default: every present query,
    or the stateless q0-q2 in quick mode."""
    if requested:
        wanted = list(dict.fromkeys(q.strip() for q in requested if q.strip()))
    else:
        wanted = list(QUICK_QUERIES) if quick else list(present)
    chosen = [q for q in wanted if q in present]
    skipped = [q for q in wanted if q not in present]
    return sorted(chosen, key=query_key), skipped


def schedule(queries: Sequence[str], runs: int, sides: Sequence[str] = SIDES) -> list[tuple[int, str, str]]:
    """(round, query, side) in the order they run: round after round, every query in each, its
    sides in an order alternating with the query and the round (two sides: ABBA)."""
    out = []
    for round_ in range(1, runs + 1):
        for index, query in enumerate(queries):
            for side in run_order(list(sides), round_ - 1 + index):
                out.append((round_, query, side))
    return out


# The same SQL on Weir (pure) ---------------------------------------------------------------------------------

NEXMARK_DDL: Final = REPO_ROOT / "examples" / "sql" / "nexmark-ddl.sql"
WEIR_SQL_SOURCE_UID: Final = "sql-source-events"
"""The source of a Weir SQL job's ``events`` table (docs/sql.md: ``sql-source-<table>``)."""
TRANSACTION_TIMEOUT_MS: Final = 900_000
"""NexmarkSql.java's ``properties.transaction.timeout.ms`` of its sink."""
_EVENTS_WITH: Final = re.compile(r"(CREATE TABLE events \(.*?\) WITH \()(.*?)(\);)", re.DOTALL)


def events_options(topic: str, bootstrap: str, group: str) -> str:
    """The ``events`` table's WITH options as weir.bench.NexmarkSql gives them to Flink: the loaded
    topic from its start, read_committed, bounded at the offsets it has when the job starts."""
    return (
        f"\n  'connector' = 'kafka',\n  'topic' = '{topic}',\n  'properties.bootstrap.servers' = '{bootstrap}',\n"
        f"  'properties.group.id' = '{group}',\n  'properties.isolation.level' = 'read_committed',\n"
        "  'scan.startup.mode' = 'earliest-offset',\n  'scan.bounded.mode' = 'latest-offset',\n  'format' = 'json'\n"
    )


def sink_options(output: str, bootstrap: str, group: str) -> str:
    """The ``${SINK}`` of a query's file as weir.bench.NexmarkSql writes it for Flink (an exactly-once
    Kafka sink, JSON); Weir accepts the same text (its transactional ids are its own)."""
    return (
        f"'connector' = 'kafka', 'topic' = '{output}', 'properties.bootstrap.servers' = '{bootstrap}', "
        f"'format' = 'json', 'sink.delivery-guarantee' = 'exactly-once', 'sink.transactional-id-prefix' = '{group}', "
        f"'properties.transaction.timeout.ms' = '{TRANSACTION_TIMEOUT_MS}', 'properties.linger.ms' = '5'"
    )


SQL_FUNCTIONS_MODULE: Final = "weir.tools.nexmark_functions"
"""The Python functions a Weir SQL job of the queries is given (q14's ``count_char``)."""


def kafka_events_ddl(topic: str, *, bootstrap: str, group: str, ddl: str | None = None) -> str:
    """examples/sql/nexmark-ddl.sql (the DDL of weir.bench.NexmarkSql: the flat ``events`` table, the
    ``person``, ``auction`` and ``bid`` views) with the events table's options those NexmarkSql gives
    Flink."""
    text = NEXMARK_DDL.read_text() if ddl is None else ddl
    replaced, found = _EVENTS_WITH.subn(
        lambda m: m.group(1) + events_options(topic, bootstrap, group) + m.group(3), text, count=1
    )
    if not found:
        raise BenchError("examples/sql/nexmark-ddl.sql has no CREATE TABLE events (...) WITH (...)")
    return replaced


def upsert_sink_options(output: str, bootstrap: str, group: str) -> str:
    """The ``${UPSERT_SINK}`` of an updating query's file (q4) as weir.bench.NexmarkSql writes it for
    Flink: upsert-kafka keyed by the primary key (JSON key and value), exactly-once."""
    return (
        f"'connector' = 'upsert-kafka', 'topic' = '{output}', 'properties.bootstrap.servers' = '{bootstrap}', "
        "'key.format' = 'json', 'value.format' = 'json', 'sink.delivery-guarantee' = 'exactly-once', "
        f"'sink.transactional-id-prefix' = '{group}', "
        f"'properties.transaction.timeout.ms' = '{TRANSACTION_TIMEOUT_MS}', 'properties.linger.ms' = '5'"
    )


def upsert_source_options(topic: str, bootstrap: str) -> str:
    """The ``${UPSERT_SOURCE}`` of a query's file as weir.bench.NexmarkSql writes it for Flink: an
    'upsert-kafka' table (JSON key and value) of the topic ``<topic>-upsert`` beside the events' topic,
    read up to its latest offsets."""
    return (
        f"'connector' = 'upsert-kafka', 'topic' = '{topic}-upsert', 'properties.bootstrap.servers' = '{bootstrap}', "
        "'key.format' = 'json', 'value.format' = 'json', 'scan.bounded.mode' = 'latest-offset'"
    )


def debezium_source_options(topic: str, bootstrap: str) -> str:
    """The ``${DEBEZIUM_SOURCE}`` of a query's file as weir.bench.NexmarkSql writes it for Flink: a
    'kafka' table of 'debezium-json' (a CDC topic's change envelopes) of the topic ``<topic>-debezium``
    beside the events' topic, read from its start up to its latest offsets."""
    return (
        f"'connector' = 'kafka', 'topic' = '{topic}-debezium', 'properties.bootstrap.servers' = '{bootstrap}', "
        "'format' = 'debezium-json', 'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset'"
    )


def debezium_sink_options(output: str, bootstrap: str, group: str) -> str:
    """The ``${DEBEZIUM_SINK}`` of a query's file as weir.bench.NexmarkSql writes it for Flink: the
    ``${SINK}`` in 'debezium-json' (each change of an updating result a Debezium envelope)."""
    return sink_options(output, bootstrap, group).replace("'format' = 'json'", "'format' = 'debezium-json'")


SIDE_INPUT: Final = Path(tempfile.gettempdir()) / "weir-nexmark" / f"side_input_{SIDE_INPUT_ROWS}.txt"
"""Where q13's side input is written (``write_side_input``) for both contenders (``${SIDE_INPUT}``)."""


def write_side_input(path: Path = SIDE_INPUT) -> Path:
    """The Nexmark suite's side input file (``weir.tools.nexmark_reference.side_input_text``) at
    ``path``, written (atomically) unless it holds that text already."""
    text = side_input_text()
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(path)
    return path


FILE_OUTPUTS: Final = Path(tempfile.gettempdir()) / "weir-nexmark" / "files"
"""Where a query into a 'filesystem' table (q10) writes: ``<FILE_OUTPUTS>/<output>``, ``output`` the
name its Kafka sink's topic would have (NexmarkSql's ``--file-output``, the same folder)."""


def file_output(output: str, root: Path = FILE_OUTPUTS) -> Path:
    return root / output


def query_sql(
    query: str,
    *,
    output: str,
    bootstrap: str,
    group: str,
    sql_dir: Path = FLINK_SQL_DIR,
    side_input: Path | None = None,
    topic: str = "",
) -> str:
    """The query's file, the one Flink runs, its ``${SINK}`` / ``${UPSERT_SINK}`` what NexmarkSql puts
    there, its ``${SIDE_INPUT}`` the side input file (q13; written by ``write_side_input`` when not
    given), its ``${FILE_OUTPUT}`` the folder ``file_output(output)`` (q10), its ``${UPSERT_SOURCE}``
    the 'upsert-kafka' table of the topic ``<topic>-upsert`` (``upsert_source_options``), its
    ``${DEBEZIUM_SOURCE}`` and ``${DEBEZIUM_SINK}`` the 'debezium-json' tables of
    ``debezium_source_options`` and ``debezium_sink_options``."""
    text = (sql_dir / f"{query}.sql").read_text()
    text = text.replace("${UPSERT_SOURCE}", upsert_source_options(topic, bootstrap))
    text = text.replace("${DEBEZIUM_SOURCE}", debezium_source_options(topic, bootstrap))
    text = text.replace("${DEBEZIUM_SINK}", debezium_sink_options(output, bootstrap, group))
    if "${SIDE_INPUT}" in text:
        text = text.replace("${SIDE_INPUT}", str(side_input or write_side_input()))
    text = text.replace("${FILE_OUTPUT}", f"file://{file_output(output)}")
    text = text.replace("${UPSERT_SINK}", upsert_sink_options(output, bootstrap, group))
    return text.replace("${SINK}", sink_options(output, bootstrap, group))


MINI_BATCH_SETTINGS: Final = (
    "SET 'table.exec.mini-batch.enabled' = 'true';\n"
    "SET 'table.exec.mini-batch.allow-latency' = '2s';\n"
    "SET 'table.exec.mini-batch.size' = '50000';\n"
)
"""The mini-batch weir.bench.NexmarkSql gives Flink (the reference's config.yaml), as SET statements."""


def weir_sql_script(
    query: str,
    *,
    topic: str,
    output: str,
    bootstrap: str,
    group: str,
    ddl: str | None = None,
    sql_dir: Path = FLINK_SQL_DIR,
    mini_batch: bool = False,
) -> str:
    """The script Weir's SQL runs for ``query``: the DDL over the topic (``kafka_events_ddl``), then
    the query's file with NexmarkSql's sink (``query_sql``); with ``mini_batch``, first the mini-batch
    settings NexmarkSql gives Flink (:data:`MINI_BATCH_SETTINGS`)."""
    return (
        (MINI_BATCH_SETTINGS if mini_batch else "")
        + kafka_events_ddl(topic, bootstrap=bootstrap, group=group, ddl=ddl)
        + "\n"
        + query_sql(query, output=output, bootstrap=bootstrap, group=group, sql_dir=sql_dir, topic=topic)
    )


_INSERT: Final = re.compile(r"^INSERT INTO", re.MULTILINE)


def weir_sql_statement_set(
    queries: Sequence[str],
    *,
    topic: str,
    output: str,
    bootstrap: str,
    group: str,
    sql_dir: Path = FLINK_SQL_DIR,
    mini_batch: bool = False,
) -> str:
    """Every query of ``queries`` in one script and one job, as ``NexmarkSql --query q0,q1,...`` runs
    them on Flink: the DDL, each query's sink table (its ``${SINK}`` the topic ``<output>-<query>``,
    the transactional id prefix ``<group>-<query>``), then the INSERTs in one ``EXECUTE STATEMENT
    SET`` (the source read once); with ``mini_batch``, first NexmarkSql's mini-batch settings."""
    tables = [(MINI_BATCH_SETTINGS if mini_batch else "") + kafka_events_ddl(topic, bootstrap=bootstrap, group=group)]
    inserts = []
    for query in queries:
        text = query_sql(
            query, output=f"{output}-{query}", bootstrap=bootstrap, group=f"{group}-{query}", sql_dir=sql_dir,
            topic=topic,
        )  # fmt: skip
        match = _INSERT.search(text)
        if match is None:
            raise BenchError(f"{query}.sql has no INSERT INTO at the start of a line")
        tables.append(text[: match.start()].strip())
        inserts.append(text[match.start() :].strip())
    return "\n\n".join([*tables, "EXECUTE STATEMENT SET BEGIN", *inserts, "END;"]) + "\n"


# Records of each query (pure) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuerySpec:
    """A query's output as whole records: its columns and their kinds (``int``, ``str``, ``ts``:
    epoch ms, ``dec3``: a decimal of 3 places), the columns that identify a row (a mismatching
    record with the same identity is reported as changed: a bid's identity includes its random
    ``extra``, as a hot bidder bids on a hot auction many times in one millisecond at the suite's
    event rate), and, for an updating query, its key."""

    columns: tuple[tuple[str, str], ...]
    identity: tuple[str, ...] = ()
    upsert_key: tuple[str, ...] = ()
    files: bool = False
    """Written into a partitioned 'filesystem' table, not Kafka: read back by ``file_records``."""
    rank_ties: tuple[str, str, str] = ()
    """A Top-N's ``(partition, order, row number)`` columns: rows of one partition tied on the order
    column are compared with the lowest row number among them (which of them gets which number is
    arrival order on Flink, the rows' values on Weir; both are Flink SQL's undefined order)."""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _kind in self.columns)


RANK_COLUMNS: Final = tuple((f"{rank}_bids", "int") for rank in ("total", "rank1", "rank2", "rank3"))
"""q15-q17's bid counts, in all and per price rank."""
DISTINCT_RANK_COLUMNS: Final = tuple(
    (f"{rank}_{what}", "int") for what in ("bidders", "auctions") for rank in ("total", "rank1", "rank2", "rank3")
)
"""q15's and q16's distinct bidders and auctions, in all and per price rank."""

SPECS: Final = {
    "q0": QuerySpec(
        (("auction", "int"), ("bidder", "int"), ("price", "int"), ("dateTime", "ts"), ("extra", "str")),
        ("auction", "bidder", "dateTime", "extra"),
    ),
    "q1": QuerySpec(
        (("auction", "int"), ("bidder", "int"), ("price", "dec3"), ("dateTime", "ts"), ("extra", "str")),
        ("auction", "bidder", "dateTime", "extra"),
    ),
    "q2": QuerySpec((("auction", "int"), ("price", "int"))),
    "q3": QuerySpec((("name", "str"), ("city", "str"), ("state", "str"), ("id", "int")), ("id",)),
    "q4": QuerySpec((("id", "int"), ("final", "int")), ("id",), upsert_key=("id",)),
    "q5": QuerySpec((("auction", "int"), ("num", "int")), ("auction",)),
    "q7": QuerySpec(
        (("auction", "int"), ("price", "int"), ("bidder", "int"), ("dateTime", "ts"), ("extra", "str")),
        ("auction", "bidder", "dateTime", "extra"),
    ),
    "q8": QuerySpec((("id", "int"), ("name", "str"), ("stime", "ts")), ("id", "stime")),
    "q10": QuerySpec(
        (
            ("auction", "int"),
            ("bidder", "int"),
            ("price", "int"),
            ("dateTime", "ts"),
            ("extra", "str"),
            ("dt", "str"),
            ("hm", "str"),
        ),
        ("auction", "bidder", "dateTime", "extra"),
        files=True,
    ),
    "q13": QuerySpec(
        (("auction", "int"), ("bidder", "int"), ("price", "int"), ("dateTime", "ts"), ("value", "str")),
        ("auction", "bidder", "dateTime"),
    ),
    "q11": QuerySpec(
        (("bidder", "int"), ("bid_count", "int"), ("starttime", "ts"), ("endtime", "ts")), ("bidder", "starttime")
    ),
    "q9": QuerySpec(
        (
            ("id", "int"),
            ("itemName", "str"),
            ("description", "str"),
            ("initialBid", "int"),
            ("reserve", "int"),
            ("dateTime", "ts"),
            ("expires", "ts"),
            ("seller", "int"),
            ("category", "int"),
            ("extra", "str"),
            ("auction", "int"),
            ("bidder", "int"),
            ("price", "int"),
            ("bid_dateTime", "ts"),
            ("bid_extra", "str"),
        ),
        ("id",),
        upsert_key=("id",),
    ),
    "q19": QuerySpec(
        (
            ("auction", "int"),
            ("bidder", "int"),
            ("price", "int"),
            ("channel", "str"),
            ("url", "str"),
            ("dateTime", "ts"),
            ("extra", "str"),
            ("rank_number", "int"),
        ),
        ("auction", "bidder", "dateTime", "extra"),
        upsert_key=("auction", "rank_number"),
        rank_ties=("auction", "price", "rank_number"),
    ),
    "q18": QuerySpec(
        (
            ("auction", "int"),
            ("bidder", "int"),
            ("price", "int"),
            ("channel", "str"),
            ("url", "str"),
            ("dateTime", "ts"),
            ("extra", "str"),
        ),
        ("auction", "bidder"),
        upsert_key=("bidder", "auction"),
    ),
    "q14": QuerySpec(
        (
            ("auction", "int"),
            ("bidder", "int"),
            ("price", "dec3"),
            ("bidTimeType", "str"),
            ("dateTime", "ts"),
            ("extra", "str"),
            ("c_counts", "int"),
        ),
        ("auction", "bidder", "dateTime", "extra"),
    ),
    "q15": QuerySpec((("day", "str"), *RANK_COLUMNS, *DISTINCT_RANK_COLUMNS), ("day",), upsert_key=("day",)),
    "q16": QuerySpec(
        (("channel", "str"), ("day", "str"), ("minute", "str"), *RANK_COLUMNS, *DISTINCT_RANK_COLUMNS),
        ("channel", "day"),
        upsert_key=("channel", "day"),
    ),
    "q17": QuerySpec(
        (
            ("auction", "int"),
            ("day", "str"),
            *RANK_COLUMNS,
            ("min_price", "int"),
            ("max_price", "int"),
            ("avg_price", "int"),
            ("sum_price", "int"),
        ),
        ("auction", "day"),
        upsert_key=("auction", "day"),
    ),
    "q20": QuerySpec(
        (
            ("auction", "int"),
            ("bidder", "int"),
            ("price", "int"),
            ("channel", "str"),
            ("url", "str"),
            ("bid_dateTime", "ts"),
            ("bid_extra", "str"),
            ("itemName", "str"),
            ("description", "str"),
            ("initialBid", "int"),
            ("reserve", "int"),
            ("auction_dateTime", "ts"),
            ("expires", "ts"),
            ("seller", "int"),
            ("category", "int"),
            ("auction_extra", "str"),
        ),
        ("auction", "bidder", "bid_dateTime", "bid_extra"),
    ),
    "q21": QuerySpec(
        (("auction", "int"), ("bidder", "int"), ("price", "int"), ("channel", "str"), ("channel_id", "str")),
    ),
    "q22": QuerySpec(
        (
            ("auction", "int"),
            ("bidder", "int"),
            ("price", "int"),
            ("channel", "str"),
            ("dir1", "str"),
            ("dir2", "str"),
            ("dir3", "str"),
        ),
    ),
}
UPDATING: Final = frozenset(q for q, spec in SPECS.items() if spec.upsert_key)
WEIR_EXTRA_PARAMS: Final = {"q4": {"q4.updates": "true"}}
"""Weir's q4 emits its running result at every change, Flink SQL's updating stream (same program)."""

_THOUSANDTH: Final = Decimal("0.001")


def epoch_ms(value: Any) -> int:
    """Epoch milliseconds from Weir's integer or Flink's JSON ``TIMESTAMP(3)`` text (SQL or ISO
    form, UTC: the job's ``table.local-time-zone``)."""
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    if isinstance(value, str):
        text = value.strip().replace("T", " ").removesuffix("Z")
        parsed = datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC)
        return round(parsed.timestamp() * 1000)
    raise ValueError(f"not a timestamp: {value!r}")


def canonical(kind: str, value: Any) -> Any:
    """One value in the form both contenders' outputs and the reference are compared in; NULL is None
    whatever the kind (a SQL column is nullable: Flink's intermediate updates of q16 have NULLs)."""
    if value is None:
        return None
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | Decimal):
            raise ValueError(f"not an integer: {value!r}")
        return int(value)
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"not a string: {value!r}")
        return value
    if kind == "ts":
        return epoch_ms(value)
    if kind == "dec3":
        return Decimal(str(value)).quantize(_THOUSANDTH)
    raise ValueError(f"unknown column kind {kind!r}")


def record_of(spec: QuerySpec, row: dict[str, Any]) -> tuple[Any, ...]:
    """A row (a reference dict, or a decoded output record) as a whole record in column order; a
    missing column or a value of the wrong kind raises ValueError or KeyError."""
    return tuple(canonical(kind, row[name]) for name, kind in spec.columns)


def decode(value: bytes | None) -> Any:
    """An output record's JSON, floats kept exact (``Decimal``)."""
    return json.loads(value or b"null", parse_float=Decimal)


NOT_A_RECORD: Final = "<not a record of the query>"


def output_record(spec: QuerySpec, value: bytes | None) -> tuple[Any, ...]:
    """A committed output record as a whole record; one that is not a row of the query becomes a
    record that matches nothing (reported as unexpected, with its bytes)."""
    try:
        row = decode(value)
        if not isinstance(row, dict):
            raise ValueError("not a JSON object")
        return record_of(spec, row)
    except (ValueError, KeyError, TypeError, ArithmeticError):
        return (NOT_A_RECORD, (value or b"")[:200].decode(errors="replace"))


def identity_of(spec: QuerySpec) -> Callable[[tuple[Any, ...]], Any] | None:
    if not spec.identity:
        return None
    positions = [spec.names.index(name) for name in spec.identity]
    return lambda record: tuple(record[i] for i in positions) if record and record[0] != NOT_A_RECORD else record


Ties = Mapping[tuple[Any, ...], tuple[Any, ...]]
"""Each record of a group a query may choose any of (``nexmark_reference.TIES``: q18's bids at one
bidder's and auction's latest millisecond) to the one record that stands for its group."""


def tie_records(query: str, groups: Sequence[Sequence[dict[str, Any]]]) -> Ties:
    """``Ties`` of a query's groups of reference rows: every record of a group to its least."""
    spec = SPECS[query]
    ties: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for group in groups:
        records = [record_of(spec, row) for row in group]
        least = min(records, key=repr)
        ties.update((record, least) for record in records)
    return ties


def chosen(records: Sequence[tuple[Any, ...]], ties: Ties) -> list[tuple[Any, ...]]:
    """``records`` with each one of a tied group (``Ties``) replaced by the record that stands for it,
    so any choice among a group compares equal; a record outside every group stays as it is."""
    return [ties.get(r, r) for r in records] if ties else list(records)


def expected_records(
    query: str, reference_rows: Sequence[dict[str, Any]], ties: Ties | None = None
) -> list[tuple[Any, ...]]:
    spec = SPECS[query]
    return chosen(untied(spec, [record_of(spec, row) for row in reference_rows]), ties or {})


def untied(spec: QuerySpec, records: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``records`` with a Top-N's tied rows numbered alike (``QuerySpec.rank_ties``): each the lowest
    row number of the rows of its partition and order value."""
    if not spec.rank_ties:
        return list(records)
    partition, order, rank = (spec.names.index(name) for name in spec.rank_ties)
    lowest: dict[tuple[Any, Any], Any] = {}
    for r in records:
        if r and r[0] != NOT_A_RECORD:
            tie = (r[partition], r[order])
            lowest[tie] = min(lowest.get(tie, r[rank]), r[rank])
    return [
        r[:rank] + (lowest[(r[partition], r[order])],) + r[rank + 1 :] if r and r[0] != NOT_A_RECORD else r
        for r in records
    ]


def file_records(query: str, folder: Path) -> list[tuple[Any, ...]]:
    """A 'filesystem' query's output as whole records (``record_of``): each visible part file's CSV
    lines (names starting with ``.`` or ``_``, in-progress files and _SUCCESS markers, left out) with
    the partition values of its folders (``col=value``, ``%XX`` unescaped as Flink escapes them),
    read the same way from either contender's folder, whatever the files are named."""
    spec = SPECS[query]
    kinds = dict(spec.columns)
    out: list[tuple[Any, ...]] = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or any(part.startswith((".", "_")) for part in relative.parts):
            continue
        partition = {
            name: urllib.parse.unquote(value)
            for name, _, value in (part.partition("=") for part in relative.parts[:-1])
        }
        names = [name for name in spec.names if name not in partition]
        with path.open(newline="") as lines:
            for fields in csv.reader(lines):
                if len(fields) != len(names):
                    out.append((NOT_A_RECORD, f"{relative}: {fields!r}"[:200]))
                    continue
                row = {**partition, **dict(zip(names, fields, strict=True))}
                try:
                    out.append(record_of(spec, {k: _csv_value(kinds[k], v) for k, v in row.items()}))
                except (ValueError, KeyError):
                    out.append((NOT_A_RECORD, f"{relative}: {fields!r}"[:200]))
    return out


def _csv_value(kind: str, text: str) -> Any:
    if text == "" and kind != "str":
        return None
    return int(text) if kind == "int" else text


def check_output(
    query: str,
    expected: Sequence[tuple[Any, ...]],
    records: Sequence[tuple[int, int, bytes | None, bytes | None]],
    ties: Ties | None = None,
) -> RecordDiff:
    """A run's committed output ``(partition, offset, key, value)`` against the reference's records:
    as a multiset; an updating query as its final table (``committed_records``); a record of a tied
    group (``Ties``, the same as ``expected_records`` was given) as the record standing for it."""
    spec = SPECS[query]
    found, notes = committed_records(query, records)
    return with_notes(compare_records(expected, chosen(found, ties or {}), identity_of(spec)), notes)


def committed_records(
    query: str, records: Sequence[tuple[int, int, bytes | None, bytes | None]]
) -> tuple[list[tuple[Any, ...]], tuple[str, ...]]:
    """A query's committed output ``(partition, offset, key, value)`` as whole records
    (``output_record``), and what made it undefined: an append query's every record; an updating
    query's final table (upserts applied in partition-offset order; a tombstone deletes the row its
    key names), with a note when a key was written to several partitions."""
    spec = SPECS[query]
    if not spec.upsert_key:
        return [output_record(spec, value) for _p, _o, _k, value in records], ()
    key_positions = [spec.names.index(name) for name in spec.upsert_key]
    upserts = []
    broken: list[tuple[Any, ...]] = []
    for partition, offset, key, value in records:
        if value is None:
            try:
                row_key = decode(key)
                upserts.append(
                    Upsert(
                        tuple(canonical(dict(spec.columns)[k], row_key[k]) for k in spec.upsert_key),
                        None,
                        partition,
                        offset,
                    )
                )
            except (ValueError, KeyError, TypeError):
                broken.append((NOT_A_RECORD, f"tombstone with key {key!r}"))
            continue
        record = output_record(spec, value)
        if record[0] == NOT_A_RECORD:
            broken.append(record)
            continue
        upserts.append(Upsert(tuple(record[i] for i in key_positions), record, partition, offset))
    table = final_table(upserts)
    return [*untied(spec, table.rows), *broken], table.notes


# Figures and the report (pure) ------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summarize(entry: dict[str, Any]) -> dict[str, Any]:
    """A query's figures: per side the spread of each value over its runs (failed when a run failed
    or its output mismatched), and the Weir / Flink ratios of the medians."""
    for side in SIDES:
        runs = entry.get("runs", {}).get(side, [])
        if not runs:
            continue
        outcomes = [
            RunOutcome(
                values={name: r.get(name) for name in FIGURES},
                output_ok=bool((r.get("check") or {}).get("ok")),
                error=r.get("error"),
                under_load=bool((r.get("load") or {}).get("under_load")),
            )
            for r in runs
        ]
        entry.setdefault("figures", {})[side] = figure_of(outcomes, FIGURES).as_dict()
    figures = entry.get("figures", {})

    def median(side: str, name: str) -> float | None:
        value = (figures.get(side) or {}).get(name)
        return value["median"] if value else None

    entry["ratios"] = {
        "steady_eps_weir_vs_flink": ratio(median("weir", "steady_eps"), median("flink", "steady_eps")),
        "steady_cpu_weir_vs_flink": ratio(
            median("weir", "steady_cpu_s_per_million"), median("flink", "steady_cpu_s_per_million")
        ),
        "whole_eps_weir_vs_flink": ratio(median("weir", "whole_eps"), median("flink", "whole_eps")),
        "whole_cpu_weir_vs_flink": ratio(
            median("weir", "whole_cpu_s_per_million"), median("flink", "whole_cpu_s_per_million")
        ),
    }
    return entry


CPU_GEOMEAN_TARGET: Final = 0.6


def cpu_targets(document: dict[str, Any]) -> list[dict[str, str]]:
    """The Nexmark CPU targets on the steady-state CPU per event medians, as pass or miss: every
    query at or below Flink's, and their geometric mean <= 0.6x. A query without both figures (a
    failed or missing run) is named, and makes neither target pass."""
    ratios = {
        q: (e.get("ratios") or {}).get("steady_cpu_weir_vs_flink") for q, e in document.get("queries", {}).items()
    }
    measured = {q: r for q, r in ratios.items() if r}
    unmeasured = sorted(q for q, r in ratios.items() if not r)
    if not measured:
        return [
            {"target": name, "goal": goal, "value": "–", "result": "not measured"}
            for name, goal in (("every query's CPU per event <= Flink's", "<= 1.0x"), ("geometric mean", "<= 0.6x"))
        ]
    worst = max(measured, key=lambda q: measured[q])
    above = [q for q, r in measured.items() if r > 1.0]
    geomean = math.exp(sum(math.log(r) for r in measured.values()) / len(measured))
    missing = f"; not measured: {', '.join(unmeasured)}" if unmeasured else ""
    return [
        {
            "target": "every query's CPU per event <= Flink's",
            "goal": "<= 1.0x",
            "value": f"highest {worst} {measured[worst]:.2f}x"
            + (f"; above: {', '.join(above)}" if above else "")
            + missing,
            "result": "pass" if not above and not unmeasured else "miss",
        },
        {
            "target": f"geometric mean of the {len(measured)} queries' CPU per event ratios",
            "goal": f"<= {CPU_GEOMEAN_TARGET}x",
            "value": f"{geomean:.2f}x{missing}",
            "result": "pass" if geomean <= CPU_GEOMEAN_TARGET and not unmeasured else "miss",
        },
    ]


def _num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "–" if value is None else fmt.format(value)


def _spread(figure: dict[str, Any] | None, name: str, fmt: str = "{:,.0f}") -> str:
    if not figure:
        return "–"
    if not figure.get("ok"):
        return "**failed**"
    value = figure.get(name)
    if not value:
        return "–"
    return spread_label(value, figure.get("runs"), fmt)


def _warmup(runs: Sequence[dict[str, Any]]) -> str:
    ratios = sorted(x for r in runs if (x := (r.get("steady_state") or {}).get("warmup_ratio")) is not None)
    return "–" if not ratios else f"{ratios[len(ratios) // 2]:.2f}"


def _check(runs: Sequence[dict[str, Any]]) -> str:
    if not runs:
        return "–"
    failed = [
        f"run {r.get('round', n)}: {r['error'] if 'error' in r else (r.get('check') or {}).get('summary', '?')}"
        for n, r in enumerate(runs, start=1)
        if "error" in r or not (r.get("check") or {}).get("ok")
    ]
    if not failed:
        records = (runs[0].get("check") or {}).get("actual_records")
        return f"ok ({len(runs)}/{len(runs)}; {_num(records)} records)"
    return "**FAILED** " + "; ".join(text[:200] for text in failed)


def render_markdown(document: dict[str, Any]) -> str:
    """The results file's Markdown; a file of format 1 (one run per query, counts checked, no
    ``runs``) is refused with ValueError: its figures are not of this form."""
    if any("runs" not in entry for entry in document.get("queries", {}).values()):
        raise ValueError("results format 1 (one run per query, output counts only)")
    kind = "quick run" if document.get("quick") else "full run"
    config = document.get("config", {})
    sql = config.get("weir_side") == "sql"
    lines = [
        "# Nexmark: Weir SQL vs Apache Flink SQL" if sql else "# Nexmark: Weir vs Apache Flink",
        "",
        f"Run `{document['run_id']}` ({kind}). " + provenance.markdown_line(document.get("provenance")),
        "",
        *(
            [
                "Weir runs each query's SQL, the text Flink runs (`weir sql`: examples/sql/nexmark-ddl.sql over the "
                "topic, then bench/flink/src/main/resources/nexmark/qN.sql), not examples/nexmark/qN.py.",
                "",
            ]
            if sql
            else []
        ),
        f"{document['events']:,} events in {document['partitions']} partitions at {config.get('event_rate', 0):,} "
        f"events/s of event time; parallelism {document['parallelism']} on both sides; exactly-once Kafka sinks on "
        f"both; a checkpoint every {config.get('checkpoint_interval', '?')} on both, to the same S3 server; "
        f"Flink as the Nexmark reference configures it (mini-batch {config.get('flink_mini_batch', '?')}, RocksDB "
        f"incremental). {config.get('runs', '?')} run(s) per query and contender, the order alternating "
        f"(ABBA); the load gate waited up to {config.get('load_wait_s', '?')} s before each run. Each figure: the "
        "median of the runs (min-max); a run whose output does not match the reference record for record "
        "fails its contender's figure.",
        "",
        "Steady state, 10-90 % of the input (CPU sampled per process; the S3 server's CPU counted in):",
        "",
        "| query | Weir events/s | Flink events/s | Weir / Flink | Weir CPU s / M | Flink CPU s / M | Weir / Flink "
        "| warm-up ratio (Weir, Flink) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    queries = document.get("queries", {})
    for query, entry in queries.items():
        figures, r = entry.get("figures", {}), entry.get("ratios", {})
        runs = entry.get("runs", {})
        lines.append(
            f"| {query} | {_spread(figures.get('weir'), 'steady_eps')} | {_spread(figures.get('flink'), 'steady_eps')} "
            f"| {_num(r.get('steady_eps_weir_vs_flink'), '{:.2f}x')} "
            f"| {_spread(figures.get('weir'), 'steady_cpu_s_per_million', '{:.1f}')} "
            f"| {_spread(figures.get('flink'), 'steady_cpu_s_per_million', '{:.1f}')} "
            f"| {_num(r.get('steady_cpu_weir_vs_flink'), '{:.2f}x')} "
            f"| {_warmup(runs.get('weir', []))}, {_warmup(runs.get('flink', []))} |"
        )
    lines += [
        "",
        "Whole run, launch to job finished (Weir's cluster start-up and Flink's JVM start-up and SQL planning "
        "included):",
        "",
        "| query | Weir events/s | Flink events/s | Weir / Flink | Weir CPU s / M | Flink CPU s / M | Weir / Flink "
        "| S3 server CPU s (Weir, Flink) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for query, entry in queries.items():
        figures, r = entry.get("figures", {}), entry.get("ratios", {})
        lines.append(
            f"| {query} | {_spread(figures.get('weir'), 'whole_eps')} | {_spread(figures.get('flink'), 'whole_eps')} "
            f"| {_num(r.get('whole_eps_weir_vs_flink'), '{:.2f}x')} "
            f"| {_spread(figures.get('weir'), 'whole_cpu_s_per_million', '{:.1f}')} "
            f"| {_spread(figures.get('flink'), 'whole_cpu_s_per_million', '{:.1f}')} "
            f"| {_num(r.get('whole_cpu_weir_vs_flink'), '{:.2f}x')} "
            f"| {_spread(figures.get('weir'), 's3_cpu_s', '{:.2f}')}, "
            f"{_spread(figures.get('flink'), 's3_cpu_s', '{:.2f}')} |"
        )
    lines += [
        "",
        "Targets, on the steady-state CPU per event medians above (Weir / Flink):",
        "",
        "| target | goal | measured | result |",
        "| --- | --- | --- | --- |",
        *(f"| {t['target']} | {t['goal']} | {t['value']} | {t['result']} |" for t in cpu_targets(document)),
    ]
    lines += [
        "",
        "Output, each run against the plain-Python reference, record for record:",
        "",
        "| query | Weir | Flink | runs under load (Weir, Flink) |",
        "| --- | --- | --- | ---: |",
    ]
    for query, entry in queries.items():
        runs, figures = entry.get("runs", {}), entry.get("figures", {})
        under = ", ".join(str((figures.get(side) or {}).get("runs_under_load", "–")) for side in SIDES)
        lines.append(f"| {query} | {_check(runs.get('weir', []))} | {_check(runs.get('flink', []))} | {under} |")
    notes = []
    if document.get("flink_unavailable"):
        notes.append(f"- Flink not run: {document['flink_unavailable']}")
    if document.get("skipped"):
        notes.append(f"- requested but without a Weir job file: {', '.join(document['skipped'])}")
    for query in queries:
        if query in UPDATING:
            weir_side = "its SQL's upsert-kafka sink" if sql else f"Weir's job with -D {query}.updates=true"
            notes.append(
                f"- {query} is an updating query: both sides write an upsert stream keyed by the row's key "
                f"({weir_side}); compared as the final table, upserts applied in order."
            )
    lines += ["", "Notes:", "", *notes, ""] if notes else [""]
    return "\n".join(lines)


def chart(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import StrMethodFormatter

    queries = list(document.get("queries", {}))
    entries = [document["queries"][q] for q in queries]

    def values(side: str, key: str) -> tuple[list[float], list[list[float]]]:
        medians, errors = [], [[], []]
        for e in entries:
            figure = (e.get("figures") or {}).get(side) or {}
            value = figure.get(key) if figure.get("ok") else None
            m = value["median"] if value else 0.0
            medians.append(m)
            errors[0].append(m - value["min"] if value else 0.0)
            errors[1].append(value["max"] - m if value else 0.0)
        return medians, errors

    sql = document.get("config", {}).get("weir_side") == "sql"
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.38
    xs = range(len(queries))
    for axis, key, ylabel, title in (
        (left, "steady_eps", "events/s, 10-90 % of the input", "Throughput, exactly-once (median, min-max)"),
        (right, "steady_cpu_s_per_million", "CPU s per million events, 10-90 %", "CPU per event"),
    ):
        weir, weir_err = values("weir", key)
        flink, flink_err = values("flink", key)
        axis.bar(
            [x - width / 2 for x in xs],
            weir,
            width,
            yerr=weir_err,
            label="Weir SQL" if sql else "Weir",
            color="#1f6fb2",
        )
        axis.bar([x + width / 2 for x in xs], flink, width, yerr=flink_err, label="Apache Flink (SQL)", color="#999999")
        axis.set_xticks(list(xs), queries)
        axis.set_ylabel(ylabel)
        axis.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}" if key == "steady_eps" else "{x:,.1f}"))
        axis.set_title(title)
        axis.legend(fontsize=8)
    kind = "quick run" if document.get("quick") else "full run"
    commit = provenance.commit_label(document.get("provenance")).replace("`", "")
    fig.suptitle(
        f"Nexmark, Weir vs Flink ({kind} {document['run_id']}, {document['events']:,} events, {commit})", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Running the contenders ------------------------------------------------------------------------------------


def read_output(endpoints: Any, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every committed record of ``topic``, once no transaction is open on it."""
    from bench import dataset
    from weir.connectors import kafka

    dataset.wait_output_settled(endpoints, topic)
    return [(p, o, k, v) for p, o, k, v, _ts in kafka.read_committed_records(endpoints, topic, timeout_s=300)]


@dataclass
class RunContext:
    """What every run of the benchmark shares."""

    env: BenchEnvironment
    input_topic: str
    events: int
    checkpoint_interval: str
    s3_pid: int | None
    flink_build: Path | None
    mini_batch: bool = True
    sql: bool = False
    """Weir runs the query's SQL (``weir_sql_script``, the text Flink runs), not examples/nexmark/qN.py."""


def _measure(
    sampler: ProcessSampler,
    progress: Callable[[], float],
    finished: Callable[[], bool],
    started: float,
    what: str,
) -> tuple[list[Sample], float, float]:
    """Sample progress and CPU until ``finished()``: the samples, the wall time, the CPU at the end."""
    samples = [Sample(0.0, 0.0, 0.0)]
    deadline = started + JOB_TIMEOUT_S
    while True:
        sampler.refresh()
        now = time.monotonic()
        samples.append(Sample(now - started, max(samples[-1].consumed, progress()), sampler.total_cpu_s()))
        if finished():
            break
        if now > deadline:
            raise BenchError(f"{what} did not finish in {JOB_TIMEOUT_S:.0f} s")
        time.sleep(SAMPLE_S)
    sampler.refresh()
    wall = time.monotonic() - started
    cpu = sampler.total_cpu_s()
    return samples, wall, cpu


def _figures(events: int, samples: list[Sample], wall: float, cpu: float, sampler: ProcessSampler) -> dict[str, Any]:
    observed = samples[-1].consumed / events if events else 0.0
    samples = [*samples, Sample(wall, float(events), cpu)]  # finished: every event was read
    steady = steady_state(samples, events) if observed >= 0.9 else None
    by_process = sampler.cpu_by_name()
    return {
        "whole_s": wall,
        "whole_eps": events / wall if wall > 0 else None,
        "whole_cpu_s": cpu,
        "whole_cpu_s_per_million": cpu / events * 1e6 if events else None,
        "steady_eps": steady.window.events_per_s if steady else None,
        "steady_cpu_s_per_million": steady.window.cpu_s_per_million if steady else None,
        "steady_state": steady.as_dict() if steady else None,
        "progress_observed": observed,
        "s3_cpu_s": by_process.get(S3_SERVER),
        "cpu_s_by_process": by_process,
        "peak_rss_bytes": {k: v for k, v in sampler.peak_rss_by_process().items() if k != S3_SERVER},
        "samples": len(samples),
    }


def run_weir(ctx: RunContext, query: str, output_topic: str, tag: str) -> dict[str, Any]:
    """A fresh cluster, the query's job on it, measured from the cluster's start to FINISHED."""
    from bench import dataset

    endpoints = ctx.env.endpoints
    dlq = f"{output_topic}-dlq"
    dataset.create_topics(endpoints, {output_topic: PARTITIONS, dlq: 1})
    params: dict[str, str] = {"checkpointing.interval": ctx.checkpoint_interval}
    if ctx.sql:
        from weir.tools.cli import sql_job_source

        job_file = ctx.env.run_root / f"sql-{tag}.py"
        script = weir_sql_script(
            query,
            topic=ctx.input_topic,
            output=output_topic,
            bootstrap=endpoints.kafka_bootstrap,
            group=output_topic,
            mini_batch=ctx.mini_batch,  # the same settings as Flink's (--no-mini-batch: neither side)
        )
        job_file.write_text(sql_job_source(script, SQL_FUNCTIONS_MODULE))
        source_uid = WEIR_SQL_SOURCE_UID
    else:
        job_file = EXAMPLES_DIR / f"{query}.py"
        source_uid = WEIR_SOURCE_UID
        params.update(
            {
                "source": "kafka",
                "source.topic": ctx.input_topic,
                "source.bounded": "true",
                "source.dlq_topic": dlq,
                "sink": "kafka",
                "sink.topic": output_topic,
                **WEIR_EXTRA_PARAMS.get(query, {}),
            }
        )
    sampler = ProcessSampler()
    if ctx.s3_pid is not None:
        sampler.add(S3_SERVER, ctx.s3_pid)
    started = time.monotonic()
    cluster = start_private_cluster(ctx.env, f"cluster-{tag}", quiet=True)
    try:
        sampler.track(cluster.process_pids(), from_birth=True)
        job_id = cluster.submit(job_file, params, PARALLELISM)
        marks: dict[str, float] = {}

        def finished() -> bool:
            """The job's status at every sample, as Flink's end is read from its stdout at once."""
            now = time.monotonic()
            status = cluster.status(job_id)
            if status is None:
                return False
            if status.summary.status in ("FAILED", "CANCELED"):
                raise BenchError(f"Weir {query} job {job_id} {status.summary.status}: {status.failure}")
            if "running" not in marks and status.tasks and all(t.state == "RUNNING" for t in status.tasks):
                marks["running"] = now - started
            return status.summary.status == "FINISHED"

        samples, wall, cpu = _measure(
            sampler, lambda: cluster.source_records_read(job_id, source_uid), finished, started, f"Weir {query}"
        )
    except BaseException:
        cluster.stop()
        raise
    cluster.stop()
    out = _figures(ctx.events, samples, wall, cpu, sampler)
    out.update(job_id=job_id, launch_to_running_s=marks.get("running"))
    return out


def flink_sql_argv(
    build_dir: Path,
    *,
    query: str,
    bootstrap: str,
    topic: str,
    output: str,
    group: str,
    checkpoint_uri: str,
    checkpoint_interval: str,
    rest_port: int,
    mini_batch: bool = True,
    side_input: Path | None = None,
) -> list[str]:
    """The JVM of one query (its REST port: NexmarkSql polls it for every task RUNNING, the benchmark
    for the source's progress)."""
    return [
        "java",
        "-cp",
        f"{build_dir / 'weir-bench-flink.jar'}:{build_dir / 'lib'}/*",
        FLINK_SQL_MAIN,
        "--query",
        query,
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--output",
        output,
        "--group",
        group,
        "--checkpoint-uri",
        checkpoint_uri,
        "--checkpoint-interval",
        checkpoint_interval,
        "--mini-batch",
        "true" if mini_batch else "false",
        "--parallelism",
        str(PARALLELISM),
        "--rest-port",
        str(rest_port),
        "--side-input",
        str(side_input or SIDE_INPUT),
        "--file-output",
        str(FILE_OUTPUTS),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_marker(line: str) -> tuple[str, str] | None:
    """``@job <id>``, ``@running <ms>`` or ``@done <ms>`` of NexmarkSql's stdout, else None."""
    parts = line.split()
    if len(parts) == 2 and parts[0] in ("@job", "@running", "@done"):
        return parts[0][1:], parts[1]
    return None


SOURCE_RECORDS_OUT: Final = re.compile(r"^Source__events.*\.numRecordsOut$")


class FlinkProgress:
    """Records the Flink job's source has emitted, from the MiniCluster's REST API: the metric
    ``Source__events[N].numRecordsOut`` of the source's vertex, summed over its subtasks (fetched
    from the tasks every 500 ms: ``metrics.fetcher.update-interval``)."""

    def __init__(self, rest_port: int) -> None:
        self._base = f"http://127.0.0.1:{rest_port}"
        self.job_id: str | None = None
        self._vertex: str | None = None
        self._metric: str | None = None
        self._last = 0.0

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self._base + path, timeout=1.0) as response:
            return json.loads(response.read())

    def __call__(self) -> float:
        if self.job_id is None:
            return self._last
        try:
            if self._vertex is None:
                vertices = self._get(f"/jobs/{self.job_id}").get("vertices", [])
                self._vertex = next((v["id"] for v in vertices if v["name"].startswith("Source: events")), None)
            if self._vertex is not None and self._metric is None:
                names = [m["id"] for m in self._get(f"/jobs/{self.job_id}/vertices/{self._vertex}/subtasks/metrics")]
                self._metric = next((n for n in names if SOURCE_RECORDS_OUT.match(n)), None)
            if self._metric is not None:
                query = urllib.parse.urlencode({"get": self._metric, "agg": "sum"})
                values = self._get(f"/jobs/{self.job_id}/vertices/{self._vertex}/subtasks/metrics?{query}")
                if values:
                    self._last = max(self._last, float(values[0]["sum"]))
        except (OSError, ValueError, KeyError, StopIteration):
            pass  # not up yet, or gone once the job finished: the last value stands
        return self._last


def run_flink(ctx: RunContext, query: str, output_topic: str, tag: str) -> dict[str, Any]:
    """A fresh JVM running the query, measured from its launch to the job finished."""
    from bench import dataset
    from bench.contenders import flink_checkpoint_uri, flink_environment

    assert ctx.flink_build is not None
    endpoints = ctx.env.endpoints
    dataset.create_topics(endpoints, {output_topic: PARTITIONS})
    log_path = ctx.env.run_root / f"flink-{tag}.log"
    rest_port = free_port()
    argv = flink_sql_argv(
        ctx.flink_build,
        query=query,
        bootstrap=endpoints.kafka_bootstrap,
        topic=ctx.input_topic,
        output=output_topic,
        group=f"{output_topic}-group",
        checkpoint_uri=flink_checkpoint_uri(ctx.env.checkpoint_uri, ctx.env.run_root, tag),
        checkpoint_interval=ctx.checkpoint_interval,
        rest_port=rest_port,
        mini_batch=ctx.mini_batch,
    )
    sampler = ProcessSampler()
    if ctx.s3_pid is not None:
        sampler.add(S3_SERVER, ctx.s3_pid)
    progress = FlinkProgress(rest_port)
    marks: dict[str, float] = {}
    ended = threading.Event()
    started = time.monotonic()
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
            cwd=ctx.env.run_root,
            env=flink_environment(ctx.flink_build, endpoints),
        )
        sampler.add("flink-jvm", proc.pid, from_birth=True)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                marker = parse_marker(line)
                if marker is None:
                    log_file.write(line)
                    continue
                name, value = marker
                if name == "job":
                    progress.job_id = value
                else:
                    marks[name] = time.monotonic() - started
            ended.set()

        reader = threading.Thread(target=read, name=f"flink-{tag}-stdout", daemon=True)
        reader.start()
        try:
            samples, wall, cpu = _measure(sampler, progress, lambda: "done" in marks or ended.is_set(), started, tag)
            if "done" not in marks:
                raise BenchError(f"Flink {query} exited without finishing the job (log: {log_path})")
        finally:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
            reaped = reap(proc, 30.0)
            if reaped is None:
                proc.kill()
                reaped = reap(proc, 10.0)
    out = _figures(ctx.events, samples, wall, cpu, sampler)
    out.update(
        launch_to_running_s=marks.get("running"),
        jvm_cpu_s_whole_life=reaped.cpu_s if reaped else None,
        jvm_peak_rss_bytes=reaped.peak_rss_bytes if reaped else None,
    )
    return out


def flink_ready() -> tuple[Path | None, str | None]:
    from bench.contenders import flink_available, flink_build_dir

    reason = flink_available()
    return (None, reason) if reason else (flink_build_dir(), None)


def load_events(endpoints: Any, topic: str, events: int, event_rate: int) -> float:
    from bench import dataset
    from weir import nexmark
    from weir.connectors import kafka
    from weir.tools import nexmark_load

    dataset.create_topics(endpoints, {topic: PARTITIONS})
    producer = kafka.producer(endpoints, linger_ms=50, batch_num_messages=10_000, enable_idempotence=True)
    started = time.monotonic()
    nexmark_load.load(producer, topic, PARTITIONS, events, config=nexmark.NexmarkConfig(events_per_second=event_rate))
    return time.monotonic() - started


@dataclass(frozen=True)
class Reference:
    """A query's expected output as whole records, and its ``Ties`` (applied to them already)."""

    records: list[tuple[Any, ...]]
    ties: Ties


def reference_records(events: int, event_rate: int, queries: Sequence[str]) -> dict[str, Reference]:
    """Each query's expected output over events 0..events-1 at ``event_rate``, as whole records."""
    from weir import nexmark
    from weir.tools import nexmark_reference

    config = nexmark.NexmarkConfig(events_per_second=event_rate)
    stream = [nexmark.event(n, config) for n in range(events)]
    references = {}
    for q in queries:
        tied = nexmark_reference.TIES.get(q)
        ties = tie_records(q, tied(stream)) if tied else {}
        references[q] = Reference(expected_records(q, nexmark_reference.QUERIES[q](stream), ties), ties)
    return references


def one_run(
    ctx: RunContext, round_: int, query: str, side: str, expected: Reference, load_wait_s: float
) -> dict[str, Any]:
    """One measured run: the load gate, the run, its output checked."""
    tag = f"r{round_}-{side}-{query}"
    output_topic = f"bench-{ctx.env.run_id}-{tag}"
    gate = load_gate(load_wait_s)
    load_before = list(os.getloadavg())
    weir = "Weir SQL" if ctx.sql else "Weir"
    log(f"round {round_}, {query}: {weir if side == 'weir' else 'Flink SQL'}")
    try:
        result = (run_weir if side == "weir" else run_flink)(ctx, query, output_topic, tag)
        diff = check_output(query, expected.records, read_output(ctx.env.endpoints, output_topic), expected.ties)
        result["check"] = diff.as_dict()
        log(
            f"  {_num(result['steady_eps'])} events/s at 10-90 % ({_num(result['whole_eps'])} whole run), "
            f"{_num(result['steady_cpu_s_per_million'], '{:.1f}')} CPU s / M "
            f"({_num(result['whole_cpu_s_per_million'], '{:.1f}')}); output {diff.summary()}"
        )
    except BenchError as exc:
        log(f"  failed: {exc}")
        result = {"error": str(exc)}
    result.update(round=round_, load={**gate.as_dict(), "before": load_before, "after": list(os.getloadavg())})
    return result


def main(argv: Sequence[str] | None = None) -> int:
    from bench import dataset

    parser = argparse.ArgumentParser(prog="python -m bench.nexmark_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EVENTS:,} events, q0-q2")
    parser.add_argument("--events", type=int, help=f"events to load (default {FULL_EVENTS:,}; quick {QUICK_EVENTS:,})")
    parser.add_argument("--queries", help="comma-separated, e.g. q0,q1 (default: every query with a job file)")
    parser.add_argument("--contenders", default="weir,flink", help="weir,flink (default both)")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"runs per query and contender (default {RUNS})")
    parser.add_argument(
        "--event-rate", type=int, default=EVENT_RATE, help=f"events per second of event time (default {EVENT_RATE:,})"
    )
    parser.add_argument(
        "--checkpoint-interval",
        default=CHECKPOINT_INTERVAL,
        help=f"both contenders' checkpoint interval (default {CHECKPOINT_INTERVAL}, the reference's)",
    )
    parser.add_argument("--no-mini-batch", action="store_true", help="Flink without the reference's mini-batch")
    parser.add_argument(
        "--sql",
        action="store_true",
        help="Weir runs each query's SQL, the text Flink runs (weir sql), not examples/nexmark/qN.py; "
        "results in nexmark-sql.{json,md,png}",
    )
    parser.add_argument(
        "--load-wait",
        type=float,
        help=f"seconds the load gate waits before each run (default {LOAD_WAIT_S:.0f}; quick {QUICK_LOAD_WAIT_S:.0f})",
    )
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="where nexmark.{json,md,png} go")
    args = parser.parse_args(argv)
    events = args.events or (QUICK_EVENTS if args.quick else FULL_EVENTS)
    load_wait_s = args.load_wait if args.load_wait is not None else (QUICK_LOAD_WAIT_S if args.quick else LOAD_WAIT_S)
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = sorted(set(contenders) - set(SIDES))
    if unknown or args.runs < 1:
        parser.error(f"--contenders takes weir and flink (not {', '.join(unknown)}); --runs at least 1")
    queries, skipped = select_queries(
        args.queries.split(",") if args.queries else None,
        quick=args.quick,
        present=measured_sql_queries() if args.sql else present_queries(),
    )
    if not queries:
        raise BenchError(f"no query to run (skipped, no job file: {skipped})")
    without_spec = [q for q in queries if q not in SPECS]
    if without_spec:
        raise BenchError(f"no output columns known for {', '.join(without_spec)} (bench/nexmark_bench.py SPECS)")
    with_flink_sql = flink_queries()
    build_dir, flink_unavailable = (None, "not asked (--contenders)")
    if "flink" in contenders:
        build_dir, flink_unavailable = flink_ready()
        if flink_unavailable:
            log(f"Flink not run: {flink_unavailable}")
            contenders.remove("flink")
    if args.runs < 3:
        log(f"{args.runs} run(s) per query and contender: no median of 3 (the results say so)")

    run_id = new_run_id()
    env = prepare_environment(run_id, checkpoints_in_s3=True)
    from bench.contenders import flink_s3_problem

    if "flink" in contenders and (problem := flink_s3_problem(env.checkpoint_uri, env.endpoints, os.environ)):
        raise BenchError(problem)
    ensure_services(env.endpoints, env.services_run_dir)
    document: dict[str, Any] = {
        "benchmark": "nexmark",
        "run_id": run_id,
        "quick": args.quick,
        "provenance": provenance.collect(REPO_ROOT),
        "events": events,
        "partitions": PARTITIONS,
        "parallelism": PARALLELISM,
        "config": {
            "runs": args.runs,
            "event_rate": args.event_rate,
            "checkpoint_interval": args.checkpoint_interval,
            "flink_mini_batch": "off" if args.no_mini_batch else "2 s / 50,000 rows",
            "load_wait_s": load_wait_s,
            "contenders": contenders,
            "weir_side": "sql" if args.sql else "job",
        },
        "selected": queries,
        "skipped": skipped,
        "flink_unavailable": flink_unavailable,
        "queries": {},
    }
    input_topic = f"bench-{run_id}-nexmark"
    failed = False
    try:
        log(f"loading {events:,} Nexmark events ({args.event_rate:,} events/s of event time) into {input_topic}")
        document["load_s"] = load_events(env.endpoints, input_topic, events, args.event_rate)
        log(f"  loaded in {document['load_s']:.1f} s; the reference's output over them (plain Python)")
        started = time.monotonic()
        expected = reference_records(events, args.event_rate, queries)
        document["reference_s"] = time.monotonic() - started
        document["reference_records"] = {q: len(reference.records) for q, reference in expected.items()}
        ctx = RunContext(
            env=env,
            input_topic=input_topic,
            events=events,
            checkpoint_interval=args.checkpoint_interval,
            s3_pid=s3_server_pid(env.endpoints, env.services_run_dir),
            flink_build=build_dir,
            mini_batch=not args.no_mini_batch,
            sql=args.sql,
        )
        document["s3_server_pid_found"] = ctx.s3_pid is not None
        results: dict[str, Any] = {q: {"runs": {side: [] for side in contenders}} for q in queries}
        for round_, query, side in schedule(queries, args.runs, contenders):
            if side == "flink" and query not in with_flink_sql:
                results[query]["runs"][side].append({"error": f"no Flink SQL for {query}", "round": round_})
                continue
            result = one_run(ctx, round_, query, side, expected[query], load_wait_s)
            failed = failed or "error" in result
            results[query]["runs"][side].append(result)
            with contextlib.suppress(Exception):  # the run's topics, as it goes: 920k records a q0 run
                dataset.delete_topics_containing(env.endpoints, f"{run_id}-r{round_}-{side}-{query}")
        for entry in results.values():
            summarize(entry)
        document["queries"] = results
    finally:
        with contextlib.suppress(Exception):
            dataset.delete_topics_containing(env.endpoints, run_id)
        with contextlib.suppress(Exception):
            remove_checkpoints(env)
        remove_run_root(env, keep=failed)
        provenance.finish(document["provenance"])
    name = "nexmark-sql" if args.sql else "nexmark"
    publish_results(name, document, render_markdown, args.results)
    chart(document, args.results / f"{name}.png")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        sys.exit(1)
