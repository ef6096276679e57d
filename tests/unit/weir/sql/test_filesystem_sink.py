"""A partitioned ``'filesystem'`` sink table (Nexmark q10): ``CREATE TABLE t (...) PARTITIONED BY (dt,
hm) WITH ('connector' = 'filesystem', 'path' = ..., 'format' = 'csv')`` written by the job API's
exactly-once part-file sink, a folder ``dt=.../hm=...`` per partition (values escaped as Flink's),
each row a CSV line of the other columns. The pure pieces (folder, line) on their own; the q10 file
in this process compared, as a multiset of whole records, with the plain-Python query; the reader
the Flink comparison uses on a folder laid out as Flink lays it out; a refusal per construct, one
line with its line:column."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bench.nexmark_bench import SPECS, file_records, record_of
from tests.unit.weir.sql.test_nexmark_sql import CONFIG, EVENTS, script
from tests.unit.weir.sql.test_retract import job_file, sink_values
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir import nexmark as nx
from weir.sql import plan_script
from weir.sql.catalog import FilesystemTable
from weir.sql.errors import SqlError
from weir.sql.part_files import DEFAULT_PARTITION, CsvLine, PartitionFolder, escape_path_name
from weir.tools import nexmark_reference as ref

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

LOG = """CREATE TABLE log (id BIGINT, note STRING, ts TIMESTAMP(3), ok BOOLEAN, dt STRING, hm STRING)
  PARTITIONED BY (dt, hm)
  WITH ('connector' = 'filesystem', 'path' = 'file:///tmp/log/', 'format' = 'csv',
        'sink.rolling-policy.rollover-interval' = '1min', 'sink.rolling-policy.check-interval' = '1min');
"""


def test_a_partitioned_filesystem_table_is_read_with_its_partition_columns_and_rollover() -> None:
    table = plan_script(LOG).tables["log"]
    assert table.partition_by == ("dt", "hm")
    assert table.connector == FilesystemTable("/tmp/log/", rollover_ms=60_000)


def test_a_filesystem_table_in_s3_is_written_there() -> None:
    table = plan_script(LOG.replace("file:///tmp/log/", "s3://lake/log/")).tables["log"]
    assert table.connector == FilesystemTable("s3://lake/log/", rollover_ms=60_000)
    for bad in ("s3://", "s3:///log/", "log/"):
        with pytest.raises(SqlError, match="filesystem connector takes a local path .* or s3://bucket/prefix"):
            plan_script(LOG.replace("file:///tmp/log/", bad))


def test_a_rows_folder_and_line_are_flinks() -> None:
    table = plan_script(LOG).tables["log"]
    row = {"id": 7, "note": 'a "quoted", text', "ts": 1_700_000_000_008, "ok": True, "dt": "2023-11-14", "hm": "22:13"}
    assert PartitionFolder(table)(row, None) == "dt=2023-11-14/hm=22%3A13"
    assert CsvLine(table)(row) == b'7,"a ""quoted"", text","2023-11-14 22:13:20.008",true\n'
    empty = {"id": None, "note": None, "ts": None, "ok": None, "dt": None, "hm": ""}
    assert PartitionFolder(table)(empty, None) == f"dt={DEFAULT_PARTITION}/hm={DEFAULT_PARTITION}"
    assert CsvLine(table)(empty) == b",,,\n"


def test_a_partition_value_is_escaped_as_flink_escapes_it() -> None:
    assert escape_path_name("a/b=c:d%e f#") == "a%2Fb%3Dc%3Ad%25e f%23"
    assert escape_path_name("2023-11-14") == "2023-11-14"


def test_nexmark_q10_writes_every_bid_with_its_day_and_minute(tmp_path: Path, weir_job: RunJob) -> None:
    """The benchmark's q10 file (the suite's query text and columns, its path this test's folder)."""
    text = script("q10").replace("${FILE_OUTPUT}", f"file://{tmp_path / 'out'}")
    run = weir_job(job_file(tmp_path, text), checkpoint_every=400)
    spec = SPECS["q10"]
    expected = Counter(record_of(spec, r) for r in ref.q10([nx.event(n, CONFIG) for n in range(EVENTS)]))
    assert sum(expected.values()) >= 2_000
    assert Counter(record_of(spec, r) for r in sink_values(run, text)) == expected


def test_the_comparisons_reader_takes_the_rows_of_visible_files_with_their_folders_values(tmp_path: Path) -> None:
    """Flink's layout: part files without an extension, a _SUCCESS marker, hidden in-progress files."""
    folder = tmp_path / "dt=2023-11-14" / "hm=22%3A13"
    folder.mkdir(parents=True)
    (folder / "part-6a57-1-0").write_text('1000,1001,703,"2023-11-14 22:13:20.008","x,y"\n')
    (folder / "part-6a57-2-0").write_text('1003,1001,45,"2023-11-14 22:13:20.016",""\n')
    (folder / "_SUCCESS").write_text("")
    (folder / ".part-6a57-2-1.inprogress").write_text("9,9,9,x,x\n")
    assert Counter(file_records("q10", tmp_path)) == Counter(
        [
            (1000, 1001, 703, 1_700_000_000_008, "x,y", "2023-11-14", "22:13"),
            (1003, 1001, 45, 1_700_000_000_016, "", "2023-11-14", "22:13"),
        ]
    )


REFUSED = [
    (
        "CREATE TABLE k (a BIGINT, d STRING) PARTITIONED BY (d) "
        "WITH ('connector' = 'kafka', 'topic' = 't', 'format' = 'json');",
        "table k: PARTITIONED BY is supported for a 'filesystem' table only",
        "CREATE",
    ),
    (
        "CREATE TABLE f (a BIGINT) PARTITIONED BY (d) WITH ('connector' = 'filesystem', 'path' = '/tmp/f', "
        "'format' = 'csv');",
        "table f: PARTITIONED BY (d): no such column",
        "CREATE",
    ),
    (
        "CREATE TABLE f (a BIGINT, d STRING) PARTITIONED BY (d) WITH ('connector' = 'filesystem', "
        "'path' = '/tmp/f', 'format' = 'csv', 'sink.partition-commit.policy.kind' = 'metastore,success-file');",
        "option 'sink.partition-commit.policy.kind': policy 'metastore' is not supported (Weir writes the "
        "'success-file' policy's file; 'metastore' needs a Hive catalog, 'custom' a Java class)",
        "'sink.partition-commit",
    ),
    (
        "CREATE TABLE f (a BIGINT, d STRING) WITH ('connector' = 'filesystem', 'path' = '/tmp/f', 'format' = 'csv', "
        "'sink.partition-commit.trigger' = 'partition-time', 'sink.partition-commit.policy.kind' = 'success-file');",
        "table f: 'sink.partition-commit.trigger' = 'partition-time' needs PARTITIONED BY (...)",
        "'sink.partition-commit.trigger'",
    ),
    (
        "CREATE TABLE f (a BIGINT, d STRING) PARTITIONED BY (d) WITH ('connector' = 'filesystem', "
        "'path' = '/tmp/f', 'format' = 'csv', 'sink.partition-commit.delay' = 'later');",
        "option 'sink.partition-commit.delay' = 'later' is not a duration",
        "'sink.partition-commit.delay'",
    ),
    (
        "CREATE TABLE f (a BIGINT, d STRING) PARTITIONED BY (d) WITH ('connector' = 'filesystem', "
        "'path' = '/tmp/f', 'format' = 'csv', 'sink.partition-commit.watermark-time-zone' = 'Asia/Shanghai');",
        "option 'sink.partition-commit.watermark-time-zone' = 'Asia/Shanghai' is not supported (one of: UTC)",
        "'sink.partition-commit.watermark-time-zone'",
    ),
    (
        "CREATE TABLE f (a BIGINT) WITH ('connector' = 'filesystem', 'path' = '/tmp/f', 'format' = 'csv', "
        "'sink.rolling-policy.rollover-interval' = 'soon');",
        "option 'sink.rolling-policy.rollover-interval' = 'soon' is not a positive duration",
        "'sink.rolling-policy.rollover-interval'",
    ),
    (
        "CREATE TABLE f (a BIGINT) PARTITIONED BY a WITH ('connector' = 'filesystem', 'path' = '/tmp/f');",
        "table f: PARTITIONED BY takes (column, ...)",
        "PARTITIONED",
    ),
]


@pytest.mark.parametrize(("statement", "message", "at"), REFUSED, ids=[r[1][:40] for r in REFUSED])
def test_a_refused_construct_is_one_line_with_its_position(statement: str, message: str, at: str) -> None:
    with pytest.raises(SqlError) as raised:
        plan_script(statement)
    text = str(raised.value)
    assert "\n" not in text
    assert message in text, text
    assert text.startswith(f"SQL 1:{statement.index(at) + 1}: "), text
