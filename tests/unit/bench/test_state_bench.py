"""The state benchmark end to end on a local folder (no services): every restore gives back exactly the
keys and latest values written into its key groups, and the run leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import state_report
from bench.state_bench import (
    AFTER_RESTORE_LABEL,
    CONTROL_LABEL,
    MAX_PARALLELISM,
    NAMESPACE,
    STATE_NAME,
    UNCHANGED_AFTER_RESTORE_LABEL,
    UPDATES,
    RestoreFigures,
    SizeFigures,
    figures_document,
    final_versions,
    key_of,
    measure_size,
    value_of,
)
from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.keygroups import key_group_for
from weir.taskmanager.state import RocksDBStateBackend

KEYS = 2000


def stored(backend: RocksDBStateBackend, first: int, last: int) -> dict[bytes, object]:
    store = backend.keyed_store(NAMESPACE)
    return {key: value for group in range(first, last + 1) for key, value in store.items(STATE_NAME, group)}


def written(first: int, last: int) -> dict[bytes, object]:
    versions = final_versions(KEYS, UPDATES)
    return {
        key_of(i): value_of(i, versions.get(i, 0))
        for i in range(KEYS)
        if first <= key_group_for(key_of(i), MAX_PARALLELISM) <= last
    }


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[SizeFigures, dict[tuple[str, int], bool], Path]:
    root = tmp_path_factory.mktemp("state-bench")
    matches: dict[tuple[str, int], bool] = {}

    def verify(figures: RestoreFigures, backend: RocksDBStateBackend) -> None:
        first, last = figures.key_groups
        matches[(figures.label, figures.subtask)] = stored(backend, first, last) == written(first, last)

    figures = measure_size(
        KEYS, FileCheckpointStorage(root / "storage"), root / "work", verify=verify, restore_repeats=2
    )
    return figures, matches, root


def test_every_restore_gives_back_the_keys_and_latest_values_written(
    measured: tuple[SizeFigures, dict[tuple[str, int], bool], Path],
) -> None:
    figures, matches, _root = measured
    by_kind = {(r.label, r.subtask): r for r in figures.restores}
    assert set(by_kind) == {("1->1", 0), ("1->2", 0), ("1->2", 1), ("2->1", 0), ("2->3", 1)}
    assert matches == dict.fromkeys(by_kind, True)
    for r in figures.restores:
        assert r.entries == r.expected_entries == len(written(*r.key_groups))
    assert by_kind[("1->1", 0)].entries == by_kind[("2->1", 0)].entries == KEYS
    assert by_kind[("1->2", 0)].entries + by_kind[("1->2", 1)].entries == KEYS
    assert by_kind[("2->1", 0)].handles_used == by_kind[("2->3", 1)].handles_used == 2
    # Opened as the database where the subtask owns at least half of a handle; the rest copied.
    adopted = {kind: (r.adopted, r.copied_entries) for kind, r in by_kind.items()}
    assert adopted[("1->1", 0)] == adopted[("1->2", 0)] == adopted[("1->2", 1)] == (True, 0)
    merged_copies = adopted[("2->1", 0)][1]
    assert adopted[("2->1", 0)][0] and 0 < merged_copies < KEYS
    assert adopted[("2->3", 1)] == (False, by_kind[("2->3", 1)].entries)
    assert all(len(r.samples) == 2 and r.usage in r.samples for r in figures.restores)


def test_incremental_checkpoints_reuse_the_first_ones_files(
    measured: tuple[SizeFigures, dict[tuple[str, int], bool], Path],
) -> None:
    figures, _matches, _root = measured
    first, *incremental, _control = [c for c in figures.checkpoints if c.subtask == "writer"]
    assert [c.label for c in incremental] == ["incremental 1%", "incremental 10%"]
    assert first.reused_files == 0 and first.uploaded_bytes == first.size_bytes
    for c in incremental:
        assert c.reused_files > 0 and c.uploaded_bytes < first.uploaded_bytes


def test_the_first_checkpoint_after_a_restore_reuses_the_restored_files(
    measured: tuple[SizeFigures, dict[tuple[str, int], bool], Path],
) -> None:
    figures, _matches, _root = measured
    restored_state = [c for c in figures.checkpoints if c.subtask == "writer"][-2].size_bytes
    (unchanged,) = [c for c in figures.checkpoints if c.label == UNCHANGED_AFTER_RESTORE_LABEL]
    (after,) = [c for c in figures.checkpoints if c.label == AFTER_RESTORE_LABEL]
    (control,) = [c for c in figures.checkpoints if c.label == CONTROL_LABEL]
    # Unchanged: every restored SST reused, only the snapshot's small private files uploaded.
    assert unchanged.reused_files > 0 and unchanged.uploaded_bytes < restored_state / 10
    assert after.reused_files > 0 and after.uploaded_bytes < restored_state / 4
    assert after.changed_keys == control.changed_keys


def test_the_run_leaves_no_object_and_no_database(
    measured: tuple[SizeFigures, dict[tuple[str, int], bool], Path],
) -> None:
    _figures, _matches, root = measured
    assert list(FileCheckpointStorage(root / "storage").list("")) == []
    assert not any((root / "work").iterdir())


def test_the_markdown_reports_each_figure_and_targets_not_measured_below_1m(
    measured: tuple[SizeFigures, dict[tuple[str, int], bool], Path],
) -> None:
    figures, _matches, _root = measured
    document = {
        "run_id": "r1",
        "quick": False,
        "measured_at": "2026-01-01T00:00:00+0000",
        "git": {"commit": "0123456789abcdef", "dirty": False},
        "host": {"cpus": 2, "cpu_model": "test", "memory_bytes": 2**33, "python": "3.11", "rocksdict": "0.3"},
        "storage": "file:///tmp/x",
        "layout": {
            "namespace": NAMESPACE,
            "key_bytes": 16,
            "value_bytes": 32,
            "max_parallelism": 128,
            "updates": list(UPDATES),
            "restore_repeats": 2,
        },
        "sizes": [figures_document(figures)],
        "errors": {},
    }
    text = state_report.markdown(document)
    assert "| 2,000 |" in text and "incremental 10%" in text and "2->3" in text
    assert [t["result"] for t in state_report.targets(document)] == ["not measured"] * 6


def test_targets_pass_or_miss_at_1m_keys() -> None:
    def usage(wall_s: float) -> dict[str, float | None]:
        return {"wall_s": wall_s, "cpu_s": wall_s, "s3_cpu_s": None}

    size = {
        "keys": 1_000_000,
        "checkpoints": [
            {"label": "incremental 1%", "usage": usage(0.4)},
            {"label": "unchanged after restore 1->1", "uploaded_bytes": 5, "size_bytes": 1000, "usage": usage(0.2)},
        ],
        "restores": [{"label": "1->1", "usage": usage(0.8)}, {"label": "2->1", "usage": usage(6.5)}],
    }
    # At 5M the restored database compacted before its first checkpoint: most of it uploaded again.
    large = {
        "keys": 5_000_000,
        "checkpoints": [
            {"label": "unchanged after restore 1->1", "uploaded_bytes": 960, "size_bytes": 1000, "usage": usage(2.6)}
        ],
        "restores": [{"label": "1->1", "usage": usage(3.5)}],
    }
    results = state_report.targets({"sizes": [size, large]})
    assert [(t["value"], t["result"]) for t in results] == [
        (0.4, "pass"),
        (0.8, "pass"),
        (3.5, "miss"),
        (6.5, "miss"),
        (0.005, "pass"),
        (0.96, "miss"),
    ]
    assert "5M keys" in results[-1]["target"]
