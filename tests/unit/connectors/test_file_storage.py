"""FileCheckpointStorage: the checkpoint storage in a local folder, and storage URIs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from weir.connectors.object_storage import (
    FileCheckpointStorage,
    ObjectNotFoundError,
    S3CheckpointStorage,
    StorageUriError,
    open_storage,
)
from weir.core.config import Endpoints
from weir.core.errors import ServiceUnavailableError


@pytest.fixture
def storage(tmp_path: Path) -> FileCheckpointStorage:
    return FileCheckpointStorage(tmp_path / "store")


def test_put_and_get_bytes(storage: FileCheckpointStorage) -> None:
    storage.put_bytes("job/checkpoints/chk-1/_metadata", b"meta")
    assert storage.get_bytes("job/checkpoints/chk-1/_metadata") == b"meta"
    assert storage.exists("job/checkpoints/chk-1/_metadata")
    assert not storage.exists("job/checkpoints/chk-2/_metadata")


def test_put_replaces_an_existing_object(storage: FileCheckpointStorage) -> None:
    storage.put_bytes("a/b", b"first")
    storage.put_bytes("a/b", b"second")
    assert storage.get_bytes("a/b") == b"second"


def test_files_round_trip(storage: FileCheckpointStorage, tmp_path: Path) -> None:
    source = tmp_path / "000009.sst"
    source.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    storage.put_file("job/shared/tm/db/000009.sst", source)
    target = tmp_path / "restore" / "000009.sst"
    storage.get_file("job/shared/tm/db/000009.sst", target)
    assert target.read_bytes() == source.read_bytes()
    assert list(storage.list("job/shared/")) == [("job/shared/tm/db/000009.sst", source.stat().st_size)]


def test_list_returns_keys_under_a_prefix_in_order_with_sizes(storage: FileCheckpointStorage) -> None:
    for key in ("j/checkpoints/chk-2/_metadata", "j/checkpoints/chk-10/_metadata", "j/shared/x", "jj/y", "z"):
        storage.put_bytes(key, key.encode())
    assert list(storage.list("j/checkpoints/")) == [
        ("j/checkpoints/chk-10/_metadata", len("j/checkpoints/chk-10/_metadata")),
        ("j/checkpoints/chk-2/_metadata", len("j/checkpoints/chk-2/_metadata")),
    ]
    # A prefix need not end at a folder boundary: "j" matches "jj/y" too, as in S3.
    assert [k for k, _ in storage.list("j")] == [
        "j/checkpoints/chk-10/_metadata",
        "j/checkpoints/chk-2/_metadata",
        "j/shared/x",
        "jj/y",
    ]
    assert [k for k, _ in storage.list("")] == [
        "j/checkpoints/chk-10/_metadata",
        "j/checkpoints/chk-2/_metadata",
        "j/shared/x",
        "jj/y",
        "z",
    ]
    assert list(storage.list("nothing/")) == []


def test_delete_skips_missing_keys(storage: FileCheckpointStorage) -> None:
    storage.put_bytes("a/1", b"1")
    storage.put_bytes("a/2", b"2")
    storage.delete(["a/1", "a/never-written", "b/missing"])
    assert [k for k, _ in storage.list("a/")] == ["a/2"]
    with pytest.raises(ObjectNotFoundError) as raised:
        storage.get_bytes("a/1")
    assert "a/1" in str(raised.value)
    assert not raised.value.retriable


def test_a_failed_write_leaves_the_old_object_and_no_temp_file(storage: FileCheckpointStorage, tmp_path: Path) -> None:
    storage.put_bytes("job/_metadata", b"old")
    with pytest.raises(ServiceUnavailableError) as raised:
        storage.put_file("job/_metadata", tmp_path / "does-not-exist")
    assert "job/_metadata" in str(raised.value) and raised.value.retriable
    assert storage.get_bytes("job/_metadata") == b"old"
    assert list(storage.list("")) == [("job/_metadata", 3)]
    assert sorted(os.listdir(storage.root / "job")) == ["_metadata"]


def test_temp_files_of_an_unfinished_write_are_not_listed(storage: FileCheckpointStorage) -> None:
    storage.put_bytes("job/_metadata", b"done")
    (storage.root / "job" / ".tmp-123-_metadata").write_bytes(b"half")
    assert list(storage.list("job/")) == [("job/_metadata", 4)]


def test_get_file_of_a_missing_key_creates_nothing(storage: FileCheckpointStorage, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFoundError):
        storage.get_file("missing", tmp_path / "out" / "file")
    assert not (tmp_path / "out" / "file").exists()


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "./a", "a/.tmp-x"])
def test_keys_escaping_the_root_are_rejected(storage: FileCheckpointStorage, key: str) -> None:
    with pytest.raises(ValueError):
        storage.put_bytes(key, b"x")


def test_open_storage_understands_file_uris_and_paths(tmp_path: Path) -> None:
    by_uri = open_storage((tmp_path / "a b").as_uri())
    assert isinstance(by_uri, FileCheckpointStorage) and by_uri.root == tmp_path / "a b"
    by_path = open_storage(str(tmp_path / "c"))
    assert isinstance(by_path, FileCheckpointStorage) and by_path.root == tmp_path / "c"
    by_uri.put_bytes("k", b"v")
    assert open_storage(by_uri.uri).get_bytes("k") == b"v"


def test_open_storage_understands_s3_uris() -> None:
    storage = open_storage("s3://weir-checkpoints/cluster/a/", Endpoints.from_env({"WEIR_LOCAL_MODE": "true"}))
    assert isinstance(storage, S3CheckpointStorage)
    assert (storage.bucket, storage.prefix, storage.uri) == (
        "weir-checkpoints",
        "cluster/a/",
        "s3://weir-checkpoints/cluster/a/",
    )


@pytest.mark.parametrize("uri", ["s3:///prefix", "gs://bucket/x", "file://host/dir", ""])
def test_open_storage_rejects_other_uris(uri: str) -> None:
    with pytest.raises(StorageUriError):
        open_storage(uri, Endpoints.from_env({}))
