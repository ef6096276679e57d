"""bench/provenance.py: the block every results file carries (commit, tree state, machine, load,
dates) and its Markdown line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import provenance

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz
processor\t: 1
model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz
"""


def test_the_machine_is_read_from_proc_and_java() -> None:
    assert provenance.parse_cpu_model(CPUINFO) == "Intel(R) Xeon(R) CPU @ 2.20GHz"
    assert provenance.parse_cpu_model("Hardware\t: BCM2835\n") == "BCM2835"
    assert provenance.parse_cpu_model("") is None
    assert provenance.parse_mem_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n") == 24576000 * 1024
    assert provenance.parse_mem_total("nothing") is None
    java = 'openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment (build 17.0.15+6)\n'
    assert provenance.parse_java_version(java) == "openjdk 17.0.15"
    assert provenance.parse_java_version("bash: java: command not found") is None


def test_uncommitted_changes_leave_out_the_benchmarks_own_output() -> None:
    porcelain = " M bench/run.py\n?? bench/results/nexmark.json\nR  old.py -> new.py\n M bench/results/results.md\n"
    assert provenance.dirty_paths(porcelain) == ["bench/run.py", "new.py"]
    assert provenance.dirty_paths(" M bench/results/x.json\n") == []
    # the pages the bench targets regenerate from the results (make bench-docs, bench-jm-scale)
    assert provenance.dirty_paths(" M docs/benchmarks.md\n M docs/benchmarks-jm-scale.md\n M docs/api.md\n") == [
        "docs/api.md"
    ]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_git_state_records_the_commit_and_whether_the_tree_was_dirty(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "x")
    clean = provenance.git_state(tmp_path)
    assert clean["commit"] is not None and len(clean["commit"]) == 40
    assert clean["commit_short"] == clean["commit"][:7]
    assert clean["dirty"] is False
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "out.json").write_text("{}")
    assert provenance.git_state(tmp_path)["dirty"] is False  # output only
    (tmp_path / "code.py").write_text("x = 1\n")
    dirty = provenance.git_state(tmp_path)
    assert dirty["dirty"] is True
    assert dirty["dirty_paths"] == ["code.py"]


def test_outside_a_repository_nothing_is_invented(tmp_path: Path) -> None:
    state = provenance.git_state(tmp_path)
    assert state["commit"] is None and state["dirty"] is None


def test_collect_and_finish_fill_the_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block = provenance.collect(tmp_path, java=None)
    assert block["results_format"] == provenance.RESULTS_FORMAT
    assert block["machine"]["cores"] >= 1
    assert block["machine"]["java"] is None
    assert len(block["load_average_before"]) == 3
    assert block["started_at"].endswith("Z")
    provenance.finish(block)
    assert len(block["load_average_after"]) == 3 and block["ended_at"].endswith("Z")


def test_the_markdown_line_names_commit_machine_dates_and_load() -> None:
    block = {
        "commit_short": "abc1234",
        "dirty": True,
        "started_at": "2026-12-03T10:00:00Z",
        "ended_at": "2026-12-03T10:20:00Z",
        "machine": {
            "cores": 2,
            "cpu_model": "Xeon",
            "memory_bytes": 8 * 2**30,
            "kernel": "Linux 6.1",
            "python": "3.11.7",
            "java": "openjdk 17.0.15",
        },
        "load_average_before": [0.5, 0.4, 0.3],
        "load_average_after": [1.5, 1.0, 0.5],
    }
    line = provenance.markdown_line(block)
    for part in (
        "`abc1234` + uncommitted changes",
        "2026-12-03T10:00:00Z to 2026-12-03T10:20:00Z",
        "2 cores (Xeon)",
        "8.0 GiB",
        "Linux 6.1",
        "Python 3.11.7",
        "Java openjdk 17.0.15",
        "0.50 / 0.40 / 0.30 before",
        "1.50 / 1.00 / 0.50 after",
    ):
        assert part in line
    assert provenance.commit_label({**block, "dirty": False}) == "`abc1234`"
    assert provenance.commit_label(None) == "not recorded"
    assert "not recorded" in provenance.markdown_line(None)
