from __future__ import annotations

from typing import Any

from bench.recovery_bench import (
    METRICS,
    Seen,
    exactness,
    first_committed_after,
    next_victim,
    render_markdown,
    summarize,
)


def test_first_committed_after_skips_offsets_written_before_the_kill_and_records_seen_before_it() -> None:
    ends = {0: 10, 1: 5}
    records = [
        Seen(0, 9, 100.5),  # a transaction of before the kill, committed late
        Seen(1, 4, 100.8),
        Seen(0, 3, 99.0),
        Seen(1, 5, 102.4),  # the first new output
        Seen(0, 10, 103.0),
        Seen(2, 0, 101.9),  # a partition empty at the kill
    ]
    assert first_committed_after(records, ends, after=100.0) == 101.9
    assert first_committed_after(records[:3], ends, after=100.0) is None
    assert first_committed_after(records, ends, after=102.5) == 103.0


def test_summarize_ignores_missing_measurements() -> None:
    assert summarize([3.0, None, 1.0, 2.0]) == {"n": 3, "median": 2.0, "min": 1.0, "max": 3.0}
    assert summarize([None]) == {"n": 0, "median": None, "min": None, "max": None}


def test_next_victim_rotates_over_the_taskmanagers_that_host_tasks() -> None:
    every = {"taskmanager-1", "taskmanager-2", "taskmanager-3"}
    assert [next_victim(every, n) for n in range(4)] == [
        "taskmanager-1",
        "taskmanager-2",
        "taskmanager-3",
        "taskmanager-1",
    ]
    assert next_victim({"taskmanager-1", "taskmanager-3"}, 1) == "taskmanager-3"
    assert next_victim(set(), 1) == "taskmanager-2"


def _sink(**overrides: Any) -> dict[str, Any]:
    return {"duplicates": 0, "unexpected": 0, "mismatched": 0, "open_transactions": [], "missing": 6} | overrides


def test_exactness_allows_only_the_flush_windows_missing() -> None:
    assert exactness([_sink(), _sink()], flush_windows=6)
    assert not exactness([_sink(), _sink(missing=7)], flush_windows=6)
    assert not exactness([_sink(duplicates=1)], flush_windows=6)
    assert not exactness([_sink(open_transactions=["p0 open"])], flush_windows=6)
    assert not exactness([], flush_windows=6)


def test_render_markdown_reports_figures_and_the_target() -> None:
    kills = [
        {
            "victim": f"taskmanager-{n}",
            "kill_to_running_s": 1.0 + n,
            "kill_to_first_committed_s": 2.0 + n,
            "kill_to_first_checkpoint_s": 1.9 + n,
            "restarts": 1,
        }
        for n in (1, 2, 3)
    ]
    document = {
        "run_id": "r1",
        "host": {"machine": "x86_64", "cpus": 2},
        "commit": "abc123",
        "date": "2026-12-01T00:00:00Z",
        "rate_eps": 24_000,
        "sustained_eps": 48_000,
        "checkpoint_interval": "1s",
        "restart_delay": "100ms",
        "summary": {m: summarize([k[m] for k in kills]) for m in METRICS},
        "target_met": False,
        "kills": kills,
        "verify": {
            "exact": True,
            "events": 1000,
            "flush_windows": 6,
            "sinks": [
                {
                    "uid": "kafka-sink",
                    "found": 10,
                    "duplicates": 0,
                    "missing": 6,
                    "unexpected": 0,
                    "mismatched": 0,
                    "open_transactions": [],
                }
            ],
        },
    }
    text = render_markdown(document)
    assert "| kill -> first committed output (Kafka, read_committed) | 4.00 s | 3.00 s | 5.00 s |" in text
    assert "24,000 events/s (half of 48,000)" in text
    assert "**missed**" in text
    assert "Output after the run: exact" in text
    assert "| 2 | taskmanager-2 | 3.00 s | 4.00 s | 3.90 s | 1 |" in text
