"""bench/docs.py: docs/benchmarks.md's figures come from the results files, each block naming its
file and commit, and the page in the repository is what its results files say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import docs

BEGIN = "<!-- generated from bench/results/exchange.json by `python -m bench.docs`: do not edit -->"
PAGE = f"""# Benchmarks

How the data plane is measured (prose, kept as it is).

{BEGIN}
a stale figure: 1,234 records/s
{docs.END}

More prose.
"""


def _exchange(records_per_s: float) -> dict[str, Any]:
    return {
        "benchmark": "exchange",
        "quick": False,
        "provenance": {
            "results_format": 2,
            "commit_short": "abc1234",
            "dirty": False,
            "started_at": "2026-12-03T10:00:00Z",
            "ended_at": "2026-12-03T10:01:00Z",
            "machine": {"cores": 2, "cpu_model": "EPYC", "memory_bytes": 2**34, "kernel": "Linux 6", "python": "3.11"},
            "load_average_before": [0.1, 0.2, 0.3],
            "load_average_after": [1.0, 0.5, 0.4],
        },
        "figures": [
            {"name": "raw gRPC loopback", "records": 1000, "seconds": 0.5, "records_per_s": records_per_s, "note": "n"}
        ],
        "ratios": {"weir_channel_vs_raw_grpc": 0.1},
    }


def _repo(tmp_path: Path, document: dict[str, Any]) -> Path:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "exchange.json").write_text(json.dumps(document))
    return tmp_path


def test_a_block_is_rendered_from_its_results_file_naming_file_run_and_commit(tmp_path: Path) -> None:
    repo = _repo(tmp_path, _exchange(4_484_270.4))
    page = docs.regenerate(PAGE, repo)
    block = page[page.index(BEGIN) : page.index(docs.END)]
    assert "**From `bench/results/exchange.json`**" in block
    assert "Commit `abc1234`" in block and "2026-12-03T10:00:00Z" in block and "2 cores (EPYC)" in block
    assert "| raw gRPC loopback | 1,000 | 0.50 | 4,484,270 | n |" in block
    assert "1,234" not in page  # the hand-written figure is gone
    assert page.startswith("# Benchmarks\n\nHow the data plane is measured (prose, kept as it is).\n")
    assert page.endswith(f"{docs.END}\n\nMore prose.\n")
    assert docs.regenerate(page, repo) == page  # generating again changes nothing


def test_a_new_results_file_rewrites_its_block(tmp_path: Path) -> None:
    repo = _repo(tmp_path, _exchange(100.0))
    first = docs.regenerate(PAGE, repo)
    (repo / "bench" / "results" / "exchange.json").write_text(json.dumps(_exchange(200.0)))
    second = docs.regenerate(first, repo)
    assert "| 100 |" in first and "| 200 |" in second and "| 100 |" not in second


def test_check_fails_on_a_page_that_is_not_what_the_files_say(tmp_path: Path) -> None:
    repo = _repo(tmp_path, _exchange(100.0))
    page = tmp_path / "benchmarks.md"
    page.write_text(docs.regenerate(PAGE, repo))
    assert docs.main(["--check", "--doc", str(page), "--repo", str(repo)]) == 0
    page.write_text(page.read_text().replace("| 100 |", "| 150 |"))  # a figure edited by hand
    assert docs.main(["--check", "--doc", str(page), "--repo", str(repo)]) == 1


def test_a_block_without_its_end_or_of_an_unknown_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(docs.DocsError, match="has no"):
        docs.regenerate(f"{BEGIN}\nno end\n", tmp_path)
    unknown = BEGIN.replace("exchange.json", "mystery.json")
    with pytest.raises(docs.DocsError, match="no renderer"):
        docs.regenerate(f"{unknown}\n{docs.END}\n", tmp_path)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    assert "is not there" in docs.regenerate(PAGE, tmp_path)


def test_a_file_of_the_old_format_names_the_commit_it_recorded() -> None:
    legacy = docs.legacy_provenance(
        {"commit": "301780bdeadbeef", "measured_at": "2026-12-01 19:53 UTC", "host": {"cpus": 2, "python": "3.11"}}
    )
    assert legacy["commit_short"] == "301780b" and legacy["dirty"] is None and legacy["results_format"] == 1
    state = docs.legacy_provenance({"git": {"commit": "7877f1ec5a4c", "dirty": False}, "load_average": "1 / 2 / 3"})
    assert state["commit_short"] == "7877f1e" and state["dirty"] is False
    assert state["load_average_before"] == [1.0, 2.0, 3.0]
    line = docs.source_line("bench/results/json.json", {"commit": "dce8222"})
    assert "results format 1" in line and "Commit `dce8222` (tree state not recorded)" in line
    assert (
        docs.source_line("bench/results/x.json", {"run_id": "r9", "quick": True, "provenance": {"results_format": 2}})[
            :64
        ]
        == "**From `bench/results/x.json`** (run `r9`, quick run, results format 2)."[:64]
    )


def test_headings_move_under_the_pages_section() -> None:
    assert docs.demote("# Title\n\nText\n\n## Ratios\n\n| a |\n") == "\nText\n\n#### Ratios\n\n| a |".lstrip("\n")


def test_the_repositorys_page_is_what_its_results_files_say() -> None:
    """docs/benchmarks.md holds no figure that its results files do not: run ``make bench-docs``
    after a benchmark (the bench targets do)."""
    page = docs.DOC.read_text()
    assert docs.BEGIN.search(page), "docs/benchmarks.md has no generated block"
    assert docs.regenerate(page) == page


def test_the_results_files_own_provenance_line_is_not_repeated_under_the_blocks_opening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renderer opens its Markdown with the run and the provenance line; the block's opening line
    says the same, so the block carries it once."""
    from bench import provenance

    document = _exchange(100.0)

    def with_provenance(doc: dict[str, Any]) -> str:
        line = f"Run `r1` (quick run). {provenance.markdown_line(doc['provenance'])}"
        return f"# Title\n\n{line}\n\n| table |\n"

    monkeypatch.setitem(docs.RENDERERS, "exchange.json", with_provenance)  # type: ignore[index]
    block = docs.render_block("bench/results/exchange.json", _repo(tmp_path, document))
    assert block.count("Commit `abc1234`") == 1, block
    assert block.startswith("**From `bench/results/exchange.json`**") and block.endswith("| table |")
