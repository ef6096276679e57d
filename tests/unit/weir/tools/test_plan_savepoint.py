"""`weir plan --savepoint`'s measure of a keyed operator, over the genuine checkpoint the savepoint
inspector's tests build: record keys and entry sizes come from ``weir.core.state_layout``."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tests.unit.weir.tools.test_savepoint_inspect import DEDUPE, KEYS, WINDOW, Built, build_checkpoint, expected_windows
from weir.tools.plan_measure import measure_savepoint


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_checkpoint(tmp_path_factory.mktemp("checkpoint"))


def test_a_window_operators_keys_count_once_per_record_key(built: Built, tmp_path: Path) -> None:
    measure = measure_savepoint(built.path, WINDOW, work_dir=tmp_path)
    windows = expected_windows()
    assert (measure.active_keys, measure.entries, dict(measure.entries_by_state)) == (
        len(KEYS),
        len(windows),
        {"win": len(windows)},
    )
    # each entry: "<uid>\0" + 2 bytes of key group + "win\0" + the key (4-byte length, bytes) and
    # both bounds (8 bytes each), and its pickled (key, sum)
    expected = sum(
        len(WINDOW) + 1 + 2 + len("win") + 1 + 4 + len(key.encode()) + 16 + len(pickle.dumps((key, total), 5))
        for (_kg, key, _start, _end), (_key, total) in windows.items()
    )
    assert measure.serialized_bytes == expected


def test_a_state_the_layout_does_not_name_counts_its_whole_key(built: Built, tmp_path: Path) -> None:
    measure = measure_savepoint(built.path, DEDUPE, work_dir=tmp_path)
    # "seen" and the sequences are keyed by k (the sequences' keys are prefixed, read whole: the
    # layout does not name that state), "last" by ("a", k): three distinct keys per k
    assert (measure.entries, measure.active_keys) == (15, 15)
