from __future__ import annotations

import json
from typing import Any

from bench.recovery_bench import (
    METRICS,
    Seen,
    exactness,
    first_committed_after,
    next_victim,
    parse_log_lines,
    recovery_phases,
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
            "kill_to_first_committed_any_s": 1.0 if n == 2 else 2.0 + n,
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
        "produced_eps": 23_950.4,
        "checkpoint_interval": "1s",
        "restart_delay": "100ms",
        "summary": {m: summarize([k.get(m) for k in kills]) for m in METRICS},
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
    assert "| kill -> first committed new output (Kafka, read_committed) | 4.00 s | 3.00 s | 5.00 s |" in text
    assert "24,000 events/s (half of 48,000; produced 23,950 events/s on average)" in text
    assert "**missed**" in text
    assert "Output after the run: exact" in text
    assert "| 2 | taskmanager-2 | 3.00 s | 4.00 s | 3.90 s | 1.00 s | 1 |" in text


def _line(second: float, event: str, **fields: Any) -> str:
    return json.dumps({"event": event, "timestamp": f"2026-12-01T14:00:{second:06.3f}Z", **fields})


def test_recovery_phases_from_structured_log_lines() -> None:
    lines = [
        "--- weir supervisor: restarting taskmanager-1",
        _line(9.0, "checkpoint_triggered", checkpoint_id=4),  # before the kill
        _line(10.05, "checkpoint_triggered", checkpoint_id=5),  # by the failing attempt: never completes
        _line(10.1, "job_restarting"),
        _line(10.4, "job_scheduled"),
        _line(10.6, "job_scheduled"),  # the dead TaskManager was unreachable: scheduled again
        _line(10.7, "task_deployed"),
        _line(10.8, "task_deployed"),
        _line(11.0, "task_restored"),
        _line(12.0, "task_restored"),
        _line(12.2, "postgres_sink_recovered"),
        _line(12.3, "sink_transaction_committed", operator_uid="postgres-sink"),  # in doubt, before the checkpoint
        _line(14.0, "kafka_sink_recovered"),
        _line(15.0, "checkpoint_triggered", checkpoint_id=6),
        _line(16.0, "checkpoint_completed", checkpoint_id=6),
        _line(16.1, "sink_transaction_committed", operator_uid="postgres-sink"),
        _line(16.2, "sink_transaction_committed", operator_uid="kafka-sink"),
        _line(25.0, "job_restarting"),  # the next kill's
        "{not json",
    ]
    entries = parse_log_lines(lines)
    assert len(entries) == 17
    killed_at = entries[0]["at"] + 1.0  # 14:00:10
    phases = recovery_phases(entries, killed_at, until=killed_at + 12)
    assert phases == {
        "detected": 0.1,
        "scheduled": 0.6,
        "deployed": 0.8,
        "tasks_restored": 2.0,
        "sinks_recovered": 4.0,
        "checkpoint_triggered": 5.0,
        "checkpoint_completed": 6.0,
        "kafka_committed": 6.2,
    }
    assert recovery_phases(entries, killed_at + 20, until=killed_at + 30)["checkpoint_triggered"] is None
