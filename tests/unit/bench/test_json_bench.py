"""bench/json_bench.py on a few records: every candidate gives the stdlib's values, and both files."""

from __future__ import annotations

import json
from pathlib import Path

from bench import json_bench


def test_a_small_run_writes_both_files_and_every_candidate_agrees(tmp_path: Path) -> None:
    assert json_bench.main(["--events", "2000", "--repeats", "1", "--out", str(tmp_path)]) == 0

    document = json.loads((tmp_path / "json.json").read_text())
    for way in ("decode", "encode"):
        rows = [r for r in document["results"][way] if "missing" not in r]
        assert any(r["name"].startswith("json (stdlib)") for r in rows)
        assert any(r["name"] == f"weir.core.json_codec.{way}" for r in rows)
        assert all(r["same_values_as_stdlib"] and r["us_per_event"] > 0 for r in rows), rows
    text = (tmp_path / "json.md").read_text()
    assert "## Decode" in text and "## Encode" in text and "weir.core.json_codec.encode" in text


def test_inputs_are_the_benchmark_events() -> None:
    raw = json_bench.inputs(3)
    assert [json.loads(r)["id"] for r in raw] == ["e0", "e1", "e2"]
