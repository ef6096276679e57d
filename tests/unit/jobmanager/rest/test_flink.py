"""Flink's job ids and savepoint disposal (weir.jobmanager.rest.ids, weir.jobmanager.savepoint_disposal,
weir.jobmanager.rest.flink)."""

from __future__ import annotations

from pathlib import Path

import pytest

from weir.jobmanager.errors import SavepointDisposalError
from weir.jobmanager.rest.flink import Disposals
from weir.jobmanager.rest.ids import flink_job_id, weir_job_id
from weir.jobmanager.savepoint_disposal import dispose_savepoint


@pytest.mark.parametrize("job_id", ["0123456789abcdef", "ffffffffffffffff", "0000000000000000"])
def test_a_weir_id_goes_out_as_flink_s_32_hex_and_comes_back(job_id: str) -> None:
    flink = flink_job_id(job_id)
    assert len(flink) == 32 and flink.endswith(job_id) and flink.startswith("0" * 16)
    assert weir_job_id(flink) == job_id and weir_job_id(flink.upper()) == job_id
    assert weir_job_id(job_id) == job_id  # a path may name the job by Weir's id too


@pytest.mark.parametrize("other", ["job-1", "0123456789ABCDEF", "123", "1" * 32, "0" * 15 + "g" * 17])
def test_an_id_of_another_form_passes_unchanged(other: str) -> None:
    assert flink_job_id(other) == other
    assert weir_job_id(other) == other


def test_disposing_refuses_what_is_not_a_savepoint_and_deletes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "not-a-savepoint"
    folder.mkdir()
    (folder / "data").write_bytes(b"x")
    with pytest.raises(SavepointDisposalError, match="no _metadata"):
        dispose_savepoint(str(folder))
    checkpoint = tmp_path / "root" / "0123456789abcdef" / "checkpoints" / f"chk-{7:020d}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "_metadata").write_bytes(b"{}")
    with pytest.raises(SavepointDisposalError, match="checkpoint of a job"):
        dispose_savepoint(str(checkpoint))
    with pytest.raises(SavepointDisposalError, match="absolute path or a URI"):
        dispose_savepoint("relative/folder")
    assert (folder / "data").read_bytes() == b"x" and (checkpoint / "_metadata").exists()


def test_a_metadata_that_does_not_read_is_refused(tmp_path: Path) -> None:
    (tmp_path / "_metadata").write_bytes(b"not metadata")
    with pytest.raises(SavepointDisposalError, match="does not read"):
        dispose_savepoint(str(tmp_path))
    assert (tmp_path / "_metadata").exists()


def test_a_disposal_s_outcome_is_kept_by_its_trigger_id(tmp_path: Path) -> None:
    disposals = Disposals()
    with pytest.raises(SavepointDisposalError):
        disposals.dispose(str(tmp_path))
    assert disposals.status("0" * 32) is None
