"""bench/cpu_bench.py's comparison of two trees' alternating rounds (no run: result files in, one document out)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.cpu_bench import compare


def round_file(
    tmp_path: Path, name: str, figures: dict[str, float], *, outputs: int = 10, loaded: bool = False
) -> Path:
    document: dict[str, Any] = {
        "commit": name,
        "note": "",
        "at": "2026-12-04T00:00:00Z",
        "load_average": [1.0, 1.0, 1.0],
        "under_load": loaded,
        "events": 1000,
        "parallelism": 3,
        "cases": {
            case: {"runs_us_per_event": [us], "runs_under_load": int(loaded), "output_records": outputs}
            for case, us in figures.items()
        },
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(document))
    return path


def test_each_case_gets_its_rounds_medians_and_ratio(tmp_path: Path) -> None:
    before = [round_file(tmp_path, f"b{i}", {"q0": us, "q5": 2 * us}) for i, us in enumerate((4.0, 6.0, 5.0))]
    after = [round_file(tmp_path, f"a{i}", {"q0": us, "q5": us}, loaded=i == 1) for i, us in enumerate((2.0, 3.0, 2.5))]
    document = compare(before, after)
    assert document["cases"]["q0"] == {
        "before_runs_us_per_event": [4.0, 6.0, 5.0],
        "after_runs_us_per_event": [2.0, 3.0, 2.5],
        "before_median": 5.0,
        "after_median": 2.5,
        "ratio": 0.5,
        "runs_under_load": 1,
        "output_records": 10,
    }
    assert document["cases"]["q5"]["ratio"] == 0.25
    assert document["under_load"] is True
    assert [side["commit"] for side in document["sides"]["after"]] == ["a0", "a1", "a2"]


def test_trees_whose_outputs_differ_in_size_are_not_compared(tmp_path: Path) -> None:
    before = [round_file(tmp_path, "b", {"q0": 1.0}, outputs=10)]
    after = [round_file(tmp_path, "a", {"q0": 1.0}, outputs=11)]
    with pytest.raises(SystemExit, match=r"q0: the trees' outputs differ in size \(\[10, 11\]\)"):
        compare(before, after)


@pytest.mark.parametrize("query", ["q5", "q11-tumble"])
def test_a_sql_query_is_measured_per_record_and_columnar(query: str) -> None:
    from bench.cpu_bench import SQL_JOB, cases
    from bench.jobs.nexmark_sql import script
    from weir.sql import explain

    chosen = cases([], [], [query])
    assert [(c.name, c.job_file, c.parameters) for c in chosen] == [
        (f"sql/{query}/record", SQL_JOB, {"query": query, "columnar": "false", "mini_batch": "false"}),
        (f"sql/{query}/columnar", SQL_JOB, {"query": query, "columnar": "true", "mini_batch": "false"}),
    ]
    per_record, columnar = explain(script(query, False)), explain(script(query, True))
    assert "[columnar: pre-aggregated per key and" not in per_record
    assert "[columnar: pre-aggregated per key and" in columnar
    assert "'connector' = 'kafka'" in script(query, True)  # the benchmark's stand-in consumer feeds it


def test_a_sql_query_is_also_measured_in_mini_batches_when_asked() -> None:
    from bench.cpu_bench import SQL_JOB, cases
    from bench.jobs.nexmark_sql import script
    from weir.sql import explain

    chosen = cases([], [], ["q15"], sql_mini_batch=True)
    assert [(c.name, c.parameters) for c in chosen][-1] == (
        "sql/q15/minibatch",
        {"query": "q15", "columnar": "false", "mini_batch": "true"},
    )
    assert all(c.job_file == SQL_JOB for c in chosen) and len(chosen) == 3
    assert "mini-batch 2000 ms / 50000 rows" in explain(script("q15", False, mini_batch=True))
    assert "mini-batch" not in explain(script("q15", False))


def test_what_a_snapshot_emits_reaches_the_next_vertex_before_its_snapshot() -> None:
    """q4 in mini-batches: the inner GROUP BY's last batch is applied by the final checkpoint's
    snapshot and crosses a network edge to the outer GROUP BY, which must see it before its own
    snapshot (records before the barrier), else the job's last changes never reach the sink."""
    from bench.cpu_bench import cases, run_once

    per_record, _columnar, batched = cases([], [], ["q4"], sql_mini_batch=True)
    messages = per_record.make_input(3_000)
    every_row = run_once(per_record, messages, 2, 0)["output"]
    in_batches = run_once(batched, messages, 2, 0)["output"]  # no checkpoint but the final one
    assert 0 < in_batches < every_row


def test_every_source_subtask_flushes_its_buffers_and_watermark_every_few_of_its_polls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each source subtask's outputs are flushed every FLUSH_EVERY_POLLS of its own polls (a buffer
    timeout's stand-in), so the window's watermark advances as the sources read, not only at
    checkpoints (one poll counter for all three sources flushed only the third one's)."""
    import weir.operators.columnar as columnar_ops
    from bench.cpu_bench import FLUSH_EVERY_POLLS, cases, run_once

    seen: list[int] = []
    process_watermark = columnar_ops.ColumnarWindowAggregateOperator.process_watermark

    def recording(self: Any, watermark: int) -> None:
        seen.append(watermark)
        process_watermark(self, watermark)

    monkeypatch.setattr(columnar_ops.ColumnarWindowAggregateOperator, "process_watermark", recording)
    (columnar,) = cases(["columnar"], [])
    events = 150_000  # 50,000 rows a source subtask: 25 polls of 2,000
    run_once(columnar, columnar.make_input(events), 3, 0)  # no checkpoint but the final one
    polls_per_source = events // 3 // 2_000
    assert len(seen) >= 3 * (polls_per_source // FLUSH_EVERY_POLLS)
    assert len(set(seen)) > 3  # the watermark moved before the end of input (MAX_WATERMARK)
