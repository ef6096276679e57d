"""The pure parts of bench/nexmark_bench.py: query selection and the run schedule, each query's
output as whole records (Weir's and Flink's encodings), the record-for-record check (an updating
query as its final table), the figures and their report."""

from __future__ import annotations

import importlib
import itertools
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from bench import nexmark_bench as nb
from bench.nexmark_bench import (
    FLINK_SQL_DIR,
    FLINK_SQL_MAIN,
    SPECS,
    check_output,
    cpu_targets,
    epoch_ms,
    expected_records,
    flink_queries,
    flink_sql_argv,
    parse_marker,
    present_queries,
    reference_records,
    render_markdown,
    schedule,
    select_queries,
    summarize,
)
from weir import nexmark
from weir.sql.functions import defined_in
from weir.tools import nexmark_reference as ref
from weir.tools.reference import run_reference

CONFIG = nexmark.NexmarkConfig(events_per_second=nb.EVENT_RATE)
EVENTS = 3_000


@pytest.fixture(scope="module")
def stream() -> list[nexmark.Event]:
    return [nexmark.event(n, CONFIG) for n in range(EVENTS)]


def _touch(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).write_text("")


# Selection and order -------------------------------------------------------------------------------------


def test_present_queries_are_the_job_files_in_query_order(tmp_path: Path) -> None:
    _touch(tmp_path, "q11.py", "q2.py", "q0.py", "q3.py", "common.py", "qx.py")
    assert present_queries(tmp_path) == ["q0", "q2", "q3", "q11"]


def test_quick_mode_runs_the_stateless_queries_and_requested_ones_are_checked() -> None:
    present = ["q0", "q1", "q2", "q5", "q7", "q11"]
    assert select_queries(None, quick=True, present=present) == (["q0", "q1", "q2"], [])
    assert select_queries(["q11", "q3", " q0", "q11"], quick=False, present=["q0", "q11"]) == (["q0", "q11"], ["q3"])


def test_every_weir_query_has_its_flink_sql_and_its_output_columns() -> None:
    assert set(present_queries()) <= flink_queries(FLINK_SQL_DIR)
    assert set(present_queries()) <= set(SPECS)
    assert set(ref.QUERIES) <= set(SPECS)


def test_the_schedule_alternates_the_contenders_abba_across_queries_and_rounds() -> None:
    runs = schedule(["q0", "q1"], 2)
    assert [side[0] for _r, _q, side in runs] == list("wffwfwwf")
    for (round_, query), group in itertools.groupby(runs, key=lambda x: x[:2]):
        assert sorted(side for _r, _q, side in group) == ["flink", "weir"], (round_, query)
    assert [(r, q) for r, q, _s in runs[::2]] == [(1, "q0"), (1, "q1"), (2, "q0"), (2, "q1")]
    assert schedule(["q0"], 2, ["weir"]) == [(1, "q0", "weir"), (2, "q0", "weir")]


# Whole records ------------------------------------------------------------------------------------------


def test_flink_timestamps_and_decimals_are_read_as_the_reference_writes_them() -> None:
    assert epoch_ms(1_700_000_000_001) == 1_700_000_000_001
    assert epoch_ms("2023-11-14 22:13:20.001") == 1_700_000_000_001  # Flink JSON, TIMESTAMP(3), SQL form
    assert epoch_ms("2023-11-14T22:13:20Z") == 1_700_000_000_000
    spec = SPECS["q1"]
    weir = nb.output_record(spec, json.dumps({**_q1_row(), "price": 1234 * 908 / 1000}).encode())
    flink = nb.output_record(
        spec,
        b'{"auction":1001,"bidder":1002,"price":1120.472,"dateTime":"2023-11-14 22:13:20.001","extra":"x"}',
    )
    assert weir == flink
    assert weir[2] == Decimal("1120.472")


def _q1_row() -> dict[str, Any]:
    return {"auction": 1001, "bidder": 1002, "price": 0, "dateTime": 1_700_000_000_001, "extra": "x"}


def test_a_record_that_is_not_a_row_of_the_query_matches_nothing() -> None:
    spec = SPECS["q2"]
    assert nb.output_record(spec, b'{"auction": 1}')[0] == nb.NOT_A_RECORD  # a column missing
    assert nb.output_record(spec, b"not json")[0] == nb.NOT_A_RECORD
    assert nb.output_record(spec, b'{"auction": "1", "price": 2}')[0] == nb.NOT_A_RECORD  # a string id


def _weir_output(rows: list[dict[str, Any]]) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Rows as Weir's Kafka sink writes them (JSON, epoch ms), spread over 2 partitions."""
    return [(i % 2, i // 2, None, json.dumps(row).encode()) for i, row in enumerate(rows)]


def test_an_exact_output_passes_record_for_record(stream: list[nexmark.Event]) -> None:
    for query in ("q0", "q1", "q2", "q3", "q5", "q7", "q8", "q11"):
        rows = ref.QUERIES[query](stream)
        diff = check_output(query, expected_records(query, rows), _weir_output(list(reversed(rows))))
        assert diff.ok, (query, diff.summary())


def test_a_duplicated_a_missing_and_a_changed_record_fail_the_check(stream: list[nexmark.Event]) -> None:
    rows = ref.q0(stream)
    expected = expected_records("q0", rows)
    changed = {**rows[2], "price": rows[2]["price"] + 1}
    output = _weir_output([rows[0], rows[0], changed, *rows[3:]])  # rows[1] missing
    diff = check_output("q0", expected, output)
    assert not diff.ok
    assert [record for record, _n in diff.duplicated] == [expected[0]]
    assert [record for record, _n in diff.missing] == [expected[1]]
    assert [pair[0] for pair in diff.changed] == [expected[2]]
    summary = diff.summary()
    assert "1 duplicated" in summary and "1 missing" in summary and "1 changed" in summary


def test_the_same_count_with_another_sum_fails_a_check_that_counts_would_pass(stream: list[nexmark.Event]) -> None:
    rows = ref.q2(stream)
    assert len(rows) >= 2
    expected = expected_records("q2", rows)
    wrong = [{**rows[0], "price": rows[0]["price"] + 1}, *rows[1:]]
    diff = check_output("q2", expected, _weir_output(wrong))
    assert diff.actual == diff.expected  # the old count check passed this
    assert not diff.ok


# An updating query: the final table -------------------------------------------------------------------------


def _upsert(partition: int, offset: int, category: int, final: int | None) -> tuple[int, int, bytes, bytes | None]:
    key = b'{"id":%d}' % category
    return partition, offset, key, None if final is None else b'{"id":%d,"final":%d}' % (category, final)


def _q18_choosing(stream: list[nexmark.Event], pick: int) -> list[dict[str, Any]]:
    """q18's rows with each tied group's ``pick``-th bid chosen (0: the first to arrive, as another
    read order of the partitions gives; -1: the last, as the reference)."""
    chosen_rows = {(r["bidder"], r["auction"]): r for r in ref.q18(stream)}
    for group in ref.q18_ties(stream):
        chosen_rows[(group[0]["bidder"], group[0]["auction"])] = group[pick]
    return list(chosen_rows.values())


def test_q18_s_choice_among_bids_of_one_millisecond_is_any_of_them_but_nothing_else() -> None:
    stream = [nexmark.event(n, CONFIG) for n in range(20_000)]  # the suite's 10M events/s: ties
    groups = ref.q18_ties(stream)
    assert groups and all(len({r["dateTime"] for r in g}) == 1 and len(g) > 1 for g in groups)
    reference = reference_records(20_000, nb.EVENT_RATE, ["q18"])["q18"]
    first_of_ties = _weir_output(_q18_choosing(stream, 0))
    assert check_output("q18", reference.records, first_of_ties, reference.ties).ok
    assert not check_output("q18", expected_records("q18", ref.q18(stream)), first_of_ties).ok  # ties ignored
    # a bid that is not of its key's latest millisecond is not a choice
    latest = {(r["bidder"], r["auction"]): r["dateTime"] for r in ref.q18(stream)}
    earlier = next(b for b in ref.bids(stream) if b.date_time < latest[(b.bidder, b.auction)])
    rows = [
        r if (r["bidder"], r["auction"]) != (earlier.bidder, earlier.auction) else ref.q18([earlier])[0]
        for r in _q18_choosing(stream, 0)
    ]
    assert not check_output("q18", reference.records, _weir_output(rows), reference.ties).ok


def test_q19_s_choice_among_bids_tied_at_its_tenth_price_is_any_of_them_but_nothing_else() -> None:
    stream = [nexmark.event(n, CONFIG) for n in range(100_000)]
    groups = ref.q19_ties(stream)
    assert groups  # in 100,000 events some auction's 10th and 11th highest bids tie
    reference = reference_records(100_000, nb.EVENT_RATE, ["q19"])["q19"]
    # the other end of each tied group in the top 10 (as another arrival order chooses)
    rows = ref.q19(stream)
    for group in groups:
        auction, price = group[0]["auction"], group[0]["price"]
        kept = [r for r in rows if (r["auction"], r["price"]) == (auction, price)]
        rest = [r for r in rows if (r["auction"], r["price"]) != (auction, price)]
        others = [{**g, "rank_number": k["rank_number"]} for g, k in zip(reversed(group), kept, strict=False)]
        assert {g["extra"] for g in others} != {k["extra"] for k in kept}
        rows = [*rest, *others]
    output = _weir_output(rows)
    assert check_output("q19", reference.records, output, reference.ties).ok
    assert not check_output("q19", expected_records("q19", ref.q19(stream)), output).ok  # ties ignored
    # a row at the tied price that is none of its bids is no choice
    swapped = [*rows[:-1], {**rows[-1], "bidder": -1}]
    assert not check_output("q19", reference.records, _weir_output(swapped), reference.ties).ok


def test_an_updating_output_is_compared_as_its_final_table() -> None:
    expected = expected_records("q4", [{"id": 10, "final": 30}, {"id": 11, "final": 7}])
    updates = [
        _upsert(0, 0, 10, 10),
        _upsert(1, 0, 11, 5),
        _upsert(0, 1, 10, 20),
        _upsert(1, 1, 12, 1),
        _upsert(1, 2, 12, None),  # a tombstone: row 12 deleted
        _upsert(0, 2, 10, 30),
        _upsert(1, 3, 11, 7),
    ]
    assert check_output("q4", expected, updates).ok
    assert check_output("q4", expected, list(reversed(updates))).ok  # read order does not matter
    stale = check_output("q4", expected, updates[:-1])
    assert [(a, b) for a, b in stale.changed] == [((11, 7), (11, 5))]


def test_an_updating_key_in_two_partitions_fails_the_check() -> None:
    expected = expected_records("q4", [{"id": 10, "final": 30}])
    diff = check_output("q4", expected, [_upsert(0, 0, 10, 20), _upsert(3, 0, 10, 30)])
    assert not diff.ok and "several partitions" in diff.summary()


def test_weirs_q4_in_updates_mode_leaves_the_references_final_table() -> None:
    """examples/nexmark/q4.py with -D q4.updates=true (what the benchmark runs, Flink SQL's updating
    program): its updates, keyed by examples' row_key as its Kafka sink keys them, applied in order."""
    config = nexmark.NexmarkConfig(events_per_second=50)  # 100 s of event time: auctions close during it
    params = {"events": "5000", "events_per_second": "50", "q4.updates": "true"}
    result = run_reference(nb.EXAMPLES_DIR / "q4.py", params)
    updates = result["kafka-sink"]
    expected_rows = ref.q4([nexmark.event(n, config) for n in range(5000)])
    assert len(updates) > len(expected_rows)  # an update per closing, not one row per category
    records = [(0, offset, b'{"id":%d}' % row["id"], json.dumps(row).encode()) for offset, row in enumerate(updates)]
    assert check_output("q4", expected_records("q4", expected_rows), records).ok
    assert nb.WEIR_EXTRA_PARAMS["q4"] == {"q4.updates": "true"}


def test_the_reference_follows_the_event_time_rate() -> None:
    reference = reference_records(300, nb.EVENT_RATE, ["q0"])["q0"]
    expected = reference.records
    stream = [nexmark.event(n, CONFIG) for n in range(300)]
    assert expected == expected_records("q0", ref.q0(stream))
    assert reference.ties == {}  # q0 chooses nothing
    assert max(r[3] for r in expected) - min(r[3] for r in expected) < 1  # 300 events in 30 µs of event time


# Figures and the report -------------------------------------------------------------------------------------


def _run(eps: float, cpu: float, ok: bool = True, round_: int = 1) -> dict[str, Any]:
    return {
        "round": round_,
        "steady_eps": eps,
        "steady_cpu_s_per_million": cpu,
        "whole_eps": eps / 2,
        "whole_cpu_s_per_million": cpu * 2,
        "s3_cpu_s": 0.1,
        "steady_state": {"warmup_ratio": 1.0},
        "check": {"ok": ok, "summary": "ok" if ok else "1 missing", "actual_records": 92_000},
        "load": {"under_load": False},
    }


def _entry() -> dict[str, Any]:
    return summarize(
        {
            "runs": {
                "weir": [_run(50_000, 30.0, round_=1), _run(40_000, 32.0, round_=2), _run(60_000, 28.0, round_=3)],
                "flink": [_run(100_000, 40.0, round_=1), _run(90_000, 44.0, round_=2), _run(80_000, 42.0, round_=3)],
            }
        }
    )


def test_figures_are_medians_with_their_spread_and_ratios_of_the_medians() -> None:
    entry = _entry()
    assert entry["figures"]["weir"]["steady_eps"] == {"median": 50_000, "min": 40_000, "max": 60_000, "runs": 3}
    assert entry["ratios"]["steady_eps_weir_vs_flink"] == pytest.approx(50_000 / 90_000)
    assert entry["ratios"]["steady_cpu_weir_vs_flink"] == pytest.approx(30.0 / 42.0)
    assert entry["ratios"]["whole_cpu_weir_vs_flink"] == pytest.approx(60.0 / 84.0)


def test_a_mismatching_run_fails_the_contenders_figure_and_its_ratios() -> None:
    entry = summarize({"runs": {"weir": [_run(50_000, 30.0), _run(99_999, 1.0, ok=False)], "flink": [_run(1, 1)]}})
    assert entry["figures"]["weir"]["ok"] is False
    assert entry["figures"]["weir"]["steady_eps"] is None
    assert entry["ratios"]["steady_eps_weir_vs_flink"] is None
    failed = summarize({"runs": {"weir": [{"error": "timed out", "round": 1}]}})
    assert failed["figures"]["weir"]["failed"] == ["run 1: timed out"]


def _document() -> dict[str, Any]:
    broken = summarize({"runs": {"weir": [_run(10.0, 1.0, ok=False)], "flink": [{"error": "boom", "round": 1}]}})
    return {
        "run_id": "r1",
        "quick": True,
        "provenance": {"commit_short": "abc1234", "dirty": False, "machine": {"cores": 2}},
        "events": 100_000,
        "partitions": 8,
        "parallelism": 3,
        "config": {"runs": 3, "event_rate": 10_000_000, "checkpoint_interval": "180s", "load_wait_s": 60},
        "skipped": ["q9"],
        "flink_unavailable": None,
        "queries": {"q0": _entry(), "q4": broken},
    }


def test_the_report_shows_spreads_failures_and_provenance() -> None:
    text = render_markdown(_document())
    assert "Commit `abc1234`" in text
    assert "10,000,000 events/s of event time" in text
    assert "| q0 | 50,000 (40,000-60,000) | 90,000 (80,000-100,000) | 0.56x |" in text
    assert "| q4 | **failed** | **failed** |" in text
    assert "ok (3/3; 92,000 records)" in text
    assert "**FAILED** run 1: 1 missing" in text and "**FAILED** run 1: boom" in text
    assert "without a Weir job file: q9" in text
    assert "q4 is an updating query" in text


def test_flink_sql_argv_runs_the_query_as_configured(tmp_path: Path) -> None:
    argv = flink_sql_argv(
        tmp_path,
        query="q5",
        bootstrap="b:9092",
        topic="in",
        output="out",
        group="g",
        checkpoint_uri="s3://bucket/bench-r1/flink/r1-flink-q5",
        checkpoint_interval="180s",
        rest_port=38181,
    )
    assert argv[:4] == ["java", "-cp", f"{tmp_path / 'weir-bench-flink.jar'}:{tmp_path / 'lib'}/*", FLINK_SQL_MAIN]
    flags = dict(zip(argv[4::2], argv[5::2], strict=True))
    assert flags == {
        "--query": "q5",
        "--bootstrap": "b:9092",
        "--topic": "in",
        "--output": "out",
        "--group": "g",
        "--checkpoint-uri": "s3://bucket/bench-r1/flink/r1-flink-q5",
        "--checkpoint-interval": "180s",
        "--mini-batch": "true",
        "--parallelism": "3",
        "--rest-port": "38181",
        "--side-input": str(nb.SIDE_INPUT),
        "--file-output": str(nb.FILE_OUTPUTS),
    }


def test_the_flink_sql_job_is_configured_as_the_nexmark_reference() -> None:
    java = (FLINK_SQL_DIR.parents[1] / "java" / "weir" / "bench" / "NexmarkSql.java").read_text()
    for setting in (
        '"table.exec.mini-batch.enabled", "true"',
        '"table.exec.mini-batch.allow-latency", "2s"',
        '"table.exec.mini-batch.size", "50000"',
        '"table.optimizer.distinct-agg.split.enabled", "true"',
        'args.getOrDefault("checkpoint-interval", "180s")',
        "'sink.delivery-guarantee' = 'exactly-once'",
        "BenchConf.checkpointing(conf, checkpointUri, checkpointInterval)",
    ):
        assert setting in java, setting
    upsert = java[java.index("String upsertSink") :]
    assert "'sink.delivery-guarantee' = 'exactly-once'" in upsert[: upsert.index(";")]
    assert nb.CHECKPOINT_INTERVAL == "180s" and nb.EVENT_RATE == 10_000_000


def test_parse_marker() -> None:
    assert parse_marker("@running 1700000000000\n") == ("running", "1700000000000")
    assert parse_marker("@job 00482a4d729ccd9a993b6443f8ab1c59") == ("job", "00482a4d729ccd9a993b6443f8ab1c59")
    assert parse_marker("@progress 5") is None
    assert parse_marker("some log line") is None


def test_a_nexmark_figure_measured_in_fewer_runs_than_were_made_says_in_how_many() -> None:
    one = {"median": 5.0, "min": 5.0, "max": 5.0, "runs": 1}
    assert nb._spread({"ok": True, "runs": 3, "x": one}, "x") == "5 (1 of 3 runs)"
    assert nb._spread({"ok": True, "runs": 1, "x": one}, "x") == "5"


SQL_QUERIES = [
    *("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q9", "q10", "q11", "q12", "q13", "q14", "q15", "q16"),
    "q17",
    *("q18", "q19", "q20", "q21", "q22"),
]


def test_weirs_sql_mode_runs_every_sql_file() -> None:
    assert nb.sql_queries() == SQL_QUERIES
    assert nb.flink_queries() == set(SQL_QUERIES) - {"q13"}  # Flink 2.2.1 refuses q13's lookup join
    # q10 writes files, not Kafka; q12's output depends on the wall clock
    assert nb.measured_sql_queries() == [q for q in SQL_QUERIES if q not in ("q10", "q12")]


def test_the_side_input_is_the_suites_file_written_once(tmp_path: Path) -> None:
    path = nb.write_side_input(tmp_path / "side" / "side_input.txt")
    lines = path.read_text().splitlines()
    assert len(lines) == 10_000 and lines[:2] == ["0,0", "1,1"] and lines[-1] == "9999,9999"
    written = path.stat().st_mtime_ns
    assert nb.write_side_input(path) == path and path.stat().st_mtime_ns == written
    text = nb.query_sql("q13", output="o", bootstrap="b", group="g", side_input=path)
    assert f"'path' = '{path}'" in text and "${" not in text


def test_an_upsert_source_is_the_upsert_kafka_topic_beside_the_events_as_nexmark_sql_reads_it() -> None:
    """``${UPSERT_SOURCE}`` (join_upsert_table.sql): the topic ``<events topic>-upsert``, JSON key and
    value, bounded at its latest offsets, as NexmarkSql.java writes it for Flink."""
    text = nb.query_sql("join_upsert_table", output="o", bootstrap="b:1", group="g", topic="events-7")
    assert "${" not in text
    assert (
        "'connector' = 'upsert-kafka', 'topic' = 'events-7-upsert', 'properties.bootstrap.servers' = 'b:1', "
        "'key.format' = 'json', 'value.format' = 'json', 'scan.bounded.mode' = 'latest-offset'"
    ) in text
    java = (nb.REPO_ROOT / "bench/flink/src/main/java/weir/bench/NexmarkSql.java").read_text()
    assert "+ \"-upsert', 'properties.bootstrap.servers' = '\"" in java


def test_a_debezium_source_and_sink_are_the_debezium_json_tables_nexmark_sql_gives_flink() -> None:
    """``${DEBEZIUM_SOURCE}`` (the topic ``<events topic>-debezium``, bounded at its latest offsets)
    and ``${DEBEZIUM_SINK}`` (``${SINK}`` in 'debezium-json'), as NexmarkSql.java writes them."""
    from weir.sql import plan_script
    from weir.sql.catalog import DebeziumJson, KafkaTable

    script = nb.weir_sql_statement_set(
        ("debezium_group_by", "debezium_sink"), topic="events-7", output="o", bootstrap="b:1", group="g"
    )
    assert "${" not in script
    tables = plan_script(script).tables
    for name in ("account_changes", "account_history"):
        source = tables[name].connector
        assert isinstance(source, KafkaTable)
        assert (source.topic, source.bounded, source.startup_mode, source.debezium) == (
            "events-7-debezium",
            True,
            "earliest-offset",
            DebeziumJson(),
        )
    sink = tables["nexmark_debezium_sink"].connector
    assert isinstance(sink, KafkaTable) and (sink.topic, sink.debezium) == ("o-debezium_sink", DebeziumJson())
    assert nb.debezium_sink_options("o", "b", "g") == nb.sink_options("o", "b", "g").replace(
        "'format' = 'json'", "'format' = 'debezium-json'"
    )
    java = (nb.REPO_ROOT / "bench/flink/src/main/java/weir/bench/NexmarkSql.java").read_text()
    assert "+ \"-debezium', 'properties.bootstrap.servers' = '\"" in java
    assert "'format' = 'debezium-json', 'scan.startup.mode' = 'earliest-offset'," in java
    assert "sink.replace(\"'format' = 'json'\", \"'format' = 'debezium-json'\")" in java


@pytest.mark.parametrize("query", SQL_QUERIES)
def test_weirs_sql_script_is_the_ddl_and_the_query_text_flink_runs(query: str) -> None:
    """The script Weir runs in ``--sql`` (and tests/integration/sql/test_nexmark_vs_flink.py): the
    DDL of examples/sql/nexmark-ddl.sql over the topic with NexmarkSql.java's options (bounded,
    earliest, read_committed, JSON), then the query's file itself with NexmarkSql's sink."""
    from weir.sql import plan_script
    from weir.sql.catalog import KafkaTable

    script = nb.weir_sql_script(query, topic="in-topic", output="out-topic", bootstrap="127.0.0.1:19092", group="g")
    sink = nb.sink_options("out-topic", "127.0.0.1:19092", "g")
    upsert_sink = nb.upsert_sink_options("out-topic", "127.0.0.1:19092", "g")
    text = (FLINK_SQL_DIR / f"{query}.sql").read_text()
    text = text.replace("${SIDE_INPUT}", str(nb.SIDE_INPUT))
    text = text.replace("${FILE_OUTPUT}", f"file://{nb.file_output('out-topic')}")
    assert script.endswith(text.replace("${SINK}", sink).replace("${UPSERT_SINK}", upsert_sink))
    planned = plan_script(script, defined_in(importlib.import_module(nb.SQL_FUNCTIONS_MODULE)))
    events = planned.tables["events"].connector
    assert isinstance(events, KafkaTable)
    assert (events.topic, events.bounded, events.startup_mode, events.group_id) == (
        "in-topic",
        True,
        "earliest-offset",
        "g",
    )
    (insert,) = planned.inserts
    java = (FLINK_SQL_DIR.parents[1] / "java" / "weir" / "bench" / "NexmarkSql.java").read_text()
    for option in [*nb.events_options("T", "B", "G").split(",\n"), *sink.split(", "), *upsert_sink.split(", ")]:
        key = option.strip().split(" = ")[0]
        assert key in java, key  # every option NexmarkSql gives Flink, and no other
    ddl = nb.NEXMARK_DDL.read_text()
    columns = ddl[ddl.index("CREATE TABLE events (") : ddl.index(") WITH (")].splitlines()[1:]
    assert len(columns) == 8
    for line in columns:  # the events table's columns, watermark and views are NexmarkSql.java's
        assert line.strip() in java, line


def test_the_statement_set_of_every_sql_query_is_one_script_each_query_to_its_topic() -> None:
    """tests/integration/sql/test_nexmark_vs_flink.py's Weir side: the INSERTs of every query in one
    job, each sink the topic ``<output>-<query>``, as ``NexmarkSql --query q0,q1,...`` names them."""
    from weir.sql import plan_script
    from weir.sql.catalog import FilesystemTable, KafkaTable

    queries = nb.sql_queries()
    planned = plan_script(
        nb.weir_sql_statement_set(queries, topic="in", output="out", bootstrap="b", group="g"),
        defined_in(importlib.import_module(nb.SQL_FUNCTIONS_MODULE)),
    )
    assert len(planned.inserts) == len(queries)
    sinks = {name: table.connector for name, table in planned.tables.items() if name != "events"}
    assert {name: c.topic for name, c in sinks.items() if isinstance(c, KafkaTable)} == {
        f"nexmark_{q}": f"out-{q}" for q in queries if q in nb.WALL_CLOCK_QUERIES or not nb.SPECS[q].files
    }
    assert {name: c.path for name, c in sinks.items() if isinstance(c, FilesystemTable) and name != "side_input"} == {
        "nexmark_q10": str(nb.file_output("out-q10"))
    }
    java = (FLINK_SQL_DIR.parents[1] / "java" / "weir" / "bench" / "NexmarkSql.java").read_text()
    assert 'output + "-" + name' in java and 'group + "-" + name' in java


def test_a_top_ns_tied_rows_are_compared_with_one_row_number() -> None:
    spec = nb.QuerySpec((("k", "int"), ("v", "int"), ("r", "int")), rank_ties=("k", "v", "r"))
    records = [(1, 9, 1), (1, 5, 2), (1, 5, 3), (2, 5, 1), (1, 4, 4)]
    assert nb.untied(spec, records) == [(1, 9, 1), (1, 5, 2), (1, 5, 2), (2, 5, 1), (1, 4, 4)]
    assert nb.untied(nb.SPECS["q0"], records) == records


def test_cpu_targets_judge_every_query_and_the_geometric_mean_of_the_steady_ratios() -> None:
    def doc(**ratios: float | None) -> dict[str, Any]:
        return {"queries": {q: {"ratios": {"steady_cpu_weir_vs_flink": r}} for q, r in ratios.items()}}

    every, geomean = cpu_targets(doc(q0=0.5, q4=0.8, q7=0.3))
    assert (every["result"], every["value"]) == ("pass", "highest q4 0.80x")
    assert (geomean["result"], geomean["value"]) == ("pass", "0.49x")  # (0.5 * 0.8 * 0.3) ** (1/3)
    every, geomean = cpu_targets(doc(q0=0.5, q4=1.52))
    assert (every["result"], every["value"]) == ("miss", "highest q4 1.52x; above: q4")
    assert geomean["result"] == "miss"  # 0.87x
    every, geomean = cpu_targets(doc(q0=0.1, q5=None))  # a failed figure passes nothing
    assert every["result"] == geomean["result"] == "miss"
    assert geomean["value"] == "0.10x; not measured: q5"
    assert [t["result"] for t in cpu_targets(doc(q1=None))] == ["not measured", "not measured"]
    text = render_markdown(_document())
    assert "Targets, on the steady-state CPU per event medians" in text
    assert "| every query's CPU per event <= Flink's | <= 1.0x |" in text
