"""The pure parts of bench/nexmark_bench.py: query selection, output checks, figures, the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.nexmark_bench import (
    FLINK_SQL_DIR,
    FLINK_SQL_MAIN,
    add_ratios,
    bids_among,
    check_outputs,
    expected_count,
    figures,
    flink_queries,
    flink_sql_argv,
    parse_marker,
    present_queries,
    reference_counts,
    render_markdown,
    select_queries,
)
from weir import nexmark


def _touch(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).write_text("")


def test_present_queries_are_the_job_files_in_query_order(tmp_path: Path) -> None:
    _touch(tmp_path, "q11.py", "q2.py", "q0.py", "q3.py", "common.py", "qx.py")
    assert present_queries(tmp_path) == ["q0", "q2", "q3", "q11"]


def test_a_query_is_included_once_its_job_file_exists(tmp_path: Path) -> None:
    _touch(tmp_path, "q0.py", "q1.py")
    assert select_queries(None, quick=False, present=present_queries(tmp_path)) == (["q0", "q1"], [])
    _touch(tmp_path, "q8.py")
    assert select_queries(None, quick=False, present=present_queries(tmp_path)) == (["q0", "q1", "q8"], [])


def test_quick_mode_runs_the_stateless_queries_that_exist() -> None:
    present = ["q0", "q1", "q2", "q5", "q7", "q11"]
    assert select_queries(None, quick=True, present=present) == (["q0", "q1", "q2"], [])
    assert select_queries(None, quick=True, present=["q0", "q2"]) == (["q0", "q2"], ["q1"])


def test_requested_queries_without_a_job_file_are_skipped_and_reported() -> None:
    chosen, skipped = select_queries(["q11", "q3", " q0", "q11"], quick=False, present=["q0", "q11"])
    assert chosen == ["q0", "q11"]
    assert skipped == ["q3"]


def test_every_weir_query_of_the_repository_has_its_flink_sql() -> None:
    sql = flink_queries(FLINK_SQL_DIR)
    assert set(present_queries()) <= sql
    assert {"q3", "q4", "q8"} <= sql  # written ahead of their Weir jobs


def test_bids_among_matches_the_generator() -> None:
    for events in (0, 3, 4, 5, 50, 53, 54, 55, 1234):
        assert bids_among(events) == sum(nexmark.is_bid(nexmark.event(n)) for n in range(events))


def test_reference_counts_of_q0_and_q2() -> None:
    counts = reference_counts(500, ["q0", "q2", "q99"])
    assert counts["q0"] == bids_among(500)
    assert 0 <= counts["q2"] < counts["q0"]
    assert "q99" not in counts


def test_expected_count_prefers_the_reference_then_the_bids() -> None:
    assert expected_count("q0", 100, {"q0": 7}) == 7
    assert expected_count("q1", 100, {}) == bids_among(100)
    assert expected_count("q5", 100, {}) is None


def test_check_outputs_against_the_expected_count_and_each_other() -> None:
    ok = check_outputs("q0", 10, 10, 10)
    assert (ok["weir_check"], ok["flink_check"], ok["weir_equals_flink"]) == ("ok", "ok", True)
    short = check_outputs("q2", 10, 8, 12)
    assert (short["weir_check"], short["flink_check"], short["weir_equals_flink"]) == (
        "short by 2",
        "over by 2",
        False,
    )
    unknown = check_outputs("q5", None, 5, None)
    assert (unknown["weir_check"], unknown["flink_check"], unknown["weir_equals_flink"]) == (
        "no reference",
        "not measured",
        None,
    )
    updating = check_outputs("q4", 5, 5, 40)
    assert updating["flink_check"] == "updates (not compared)"
    assert updating["weir_equals_flink"] is None


def test_figures_and_ratios() -> None:
    weir = figures(1_000_000, 20.0, 30.0)
    assert weir["events_per_s"] == 50_000
    assert weir["cpu_s_per_million"] == 30.0
    entry = add_ratios({"weir": weir, "flink": figures(1_000_000, 10.0, 60.0)})
    assert entry["ratios"] == {"events_per_s_weir_vs_flink": 0.5, "cpu_per_event_weir_vs_flink": 0.5}
    missing = add_ratios({"weir": weir, "flink": {"error": "no Flink SQL for q9"}})
    assert missing["ratios"]["events_per_s_weir_vs_flink"] is None


def test_parse_marker() -> None:
    assert parse_marker("@running 1700000000000\n") == ("running", 1700000000000)
    assert parse_marker("@done 5") == ("done", 5)
    assert parse_marker("@progress 5") is None
    assert parse_marker("some log line") is None


def _document() -> dict[str, Any]:
    q0 = add_ratios(
        {"weir": figures(100_000, 2.0, 3.0), "flink": {**figures(100_000, 1.0, 4.0), "jvm_cpu_s_whole": 9.5}}
    )
    q0["check"] = check_outputs("q0", 92_000, 92_000, 92_000)
    q5 = add_ratios({"weir": figures(100_000, 4.0, 5.0), "flink": {"error": "boom"}})
    q5["check"] = check_outputs("q5", None, 12, None)
    return {
        "run_id": "r1",
        "quick": True,
        "commit": "abc1234",
        "measured_at": "2026-12-01 18:00 UTC",
        "host": {"cpus": 2},
        "load_average_at_start": [1.0, 1.0, 1.0],
        "load_average_at_end": [2.0, 1.5, 1.0],
        "events": 100_000,
        "partitions": 8,
        "parallelism": 3,
        "skipped": ["q3"],
        "flink_unavailable": None,
        "queries": {"q0": q0, "q5": q5},
    }


def test_render_markdown_has_a_row_per_query_with_ratios_and_checks() -> None:
    text = render_markdown(_document())
    assert "| q0 | 50,000 | 100,000 | 0.50x | 30.0 | 40.0 | 0.75x | 92,000 (ok) | 92,000 (ok) | 92,000 | yes |" in text
    assert "| q5 | 25,000 | – | – | 50.0 | – | – | 12 (no reference) | – | – | – |" in text
    assert "q5, flink: boom" in text
    assert "9.5 s" in text
    assert "without a Weir job file: q3" in text


def test_flink_sql_argv_runs_the_query_main_with_its_rest_port(tmp_path: Path) -> None:
    argv = flink_sql_argv(
        tmp_path,
        query="q5",
        bootstrap="b:9092",
        topic="in",
        output="out",
        group="g",
        checkpoint_dir=tmp_path / "ck",
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
        "--checkpoint-dir": str(tmp_path / "ck"),
        "--parallelism": "3",
        "--rest-port": "38181",
    }
