"""LocalDisks: the fill-disk fault's tmpfs, filled to the last byte and freed (needs the right to mount)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.chaos.faults import LocalDisks
from tests.chaos.schedule import TASKMANAGERS

WHY_NOT = LocalDisks.unavailable()


def test_a_filled_local_disk_refuses_writes_until_freed_and_unmounts(tmp_path: Path) -> None:
    assert WHY_NOT is None, f"no tmpfs can be mounted here (the fill-disk fault needs root): {WHY_NOT}"
    disks = LocalDisks(tmp_path, size="8m")
    disks.mount()
    try:
        mounted = Path("/proc/mounts").read_text()
        assert all(str(disks.directory(tm)) in mounted for tm in TASKMANAGERS)
        taken = disks.fill("taskmanager-2")
        assert taken >= 8 * 2**20 - 4096
        with pytest.raises(OSError) as full:
            with (disks.directory("taskmanager-2") / "state.db").open("wb", buffering=0) as out:
                out.write(b"x" * 8192)
        assert full.value.errno == errno.ENOSPC
        (disks.directory("taskmanager-1") / "state.db").write_bytes(b"x" * 8192)  # the others have room
        disks.free("taskmanager-2")
        (disks.directory("taskmanager-2") / "state.db").write_bytes(b"x" * 8192)
    finally:
        disks.unmount()
    assert str(tmp_path) not in Path("/proc/mounts").read_text()
