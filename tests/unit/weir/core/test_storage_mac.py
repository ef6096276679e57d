"""The keyed MAC over checkpoint objects (weir.core.storage_mac) and the sealed storage every reader goes
through: each byte flipped, a foreign key, no MAC, every truncation refused with one line naming the
object, before any decoding; a pickle that would run code is never loaded."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from weir.connectors.object_storage import FileCheckpointStorage, SealedStorage, open_storage
from weir.core.config import SecuritySettings
from weir.core.errors import ConfigurationError, Fault, StorageAuthenticationError
from weir.core.storage_mac import (
    MAGIC,
    TRAILER_SIZE,
    StorageKey,
    seal,
    seal_file,
    storage_key,
    unseal,
    unseal_file,
)

KEY = StorageKey(b"k" * 32)
OTHER = StorageKey(b"o" * 32)
WHERE = "s3://bucket/job/chk-7/task-0.state"
PAYLOAD = pickle.dumps({"counts": [1, 2, 3], "offset": 42})


class _Marker:
    """Unpickling this creates a file: the proof that a refused object's pickle never ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.path),))


def _evil(marker: Path) -> bytes:
    return pickle.dumps(_Marker(marker))


def _refused(data: bytes, key: StorageKey = KEY) -> str:
    with pytest.raises(StorageAuthenticationError) as refused:
        unseal(data, key, WHERE)
    error = refused.value
    assert error.fault is Fault.EXTERNAL and not error.retriable
    message = str(error)
    assert WHERE in message and "not decoded" in message and "\n" not in message
    return message


def test_a_sealed_object_opens_to_its_payload_and_the_trailer_is_versioned() -> None:
    sealed = seal(PAYLOAD, KEY)
    assert len(sealed) == len(PAYLOAD) + TRAILER_SIZE == len(PAYLOAD) + 48
    assert sealed[len(PAYLOAD) : len(PAYLOAD) + 8] == MAGIC == b"WEIRMAC\x01"
    assert sealed[len(PAYLOAD) + 8 : len(PAYLOAD) + 16] == KEY.key_id
    assert unseal(sealed, KEY, WHERE) == PAYLOAD
    assert unseal(seal(b"", KEY), KEY, WHERE) == b""


def test_every_single_flipped_bit_is_refused() -> None:
    sealed = seal(PAYLOAD, KEY)
    for position in range(len(sealed)):
        for bit in (0x01, 0x80):
            tampered = bytearray(sealed)
            tampered[position] ^= bit
            _refused(bytes(tampered))


def test_a_payload_swapped_under_a_kept_trailer_is_refused_as_changed() -> None:
    sealed = seal(PAYLOAD, KEY)
    assert "does not match" in _refused(pickle.dumps({"counts": [9]}) + sealed[-TRAILER_SIZE:])


def test_an_object_sealed_with_another_key_is_refused_as_foreign_naming_its_key_id() -> None:
    message = _refused(seal(PAYLOAD, OTHER))
    assert "another key" in message and OTHER.key_id.hex() in message
    assert KEY.secret.decode() not in message and OTHER.secret.decode() not in message


def test_an_object_without_a_mac_and_every_truncation_are_refused() -> None:
    assert "no Weir MAC" in _refused(PAYLOAD)
    assert "no Weir MAC" in _refused(b"")
    sealed = seal(PAYLOAD, KEY)
    for length in range(len(sealed)):
        _refused(sealed[:length])


def test_a_pickle_that_would_run_code_is_refused_and_never_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = _evil(marker)
    inner = FileCheckpointStorage(tmp_path / "storage")
    storage = SealedStorage(inner, KEY)
    storage.put_bytes("chk-1/op.state", PAYLOAD)
    inner.put_bytes("chk-1/op.state", evil + inner.get_bytes("chk-1/op.state")[-TRAILER_SIZE:])  # kept trailer
    inner.put_bytes("chk-1/plain.state", evil)  # no trailer at all
    inner.put_bytes("chk-1/foreign.state", seal(evil, OTHER))
    for name in ("op", "plain", "foreign"):
        with pytest.raises(StorageAuthenticationError, match=f"chk-1/{name}.state"):
            pickle.loads(storage.get_bytes(f"chk-1/{name}.state"))
    assert not marker.exists()
    pickle.loads(evil)  # the check itself: unpickled, this payload does leave the marker
    assert marker.exists()


def test_conditional_writes_seal_and_conditional_reads_check(tmp_path: Path) -> None:
    inner = FileCheckpointStorage(tmp_path / "storage")
    storage = SealedStorage(inner, KEY)
    version = storage.put_if("_lease", b'{"term": 1}', None)
    assert storage.get_versioned("_lease") == (b'{"term": 1}', version)
    assert inner.get_bytes("_lease") == seal(b'{"term": 1}', KEY)
    inner.put_bytes("_lease", seal(b'{"term": 9}', OTHER))
    with pytest.raises(StorageAuthenticationError, match="_lease failed authentication"):
        storage.get_versioned("_lease")
    assert storage.get_versioned("absent") is None


def test_files_are_sealed_and_checked_in_a_stream_and_a_refused_download_leaves_nothing(tmp_path: Path) -> None:
    source = tmp_path / "000012.sst"
    source.write_bytes(os.urandom(3 * (1 << 20) + 17))  # more than one chunk
    sealed = tmp_path / "sealed"
    seal_file(source, sealed, KEY)
    assert sealed.read_bytes() == seal(source.read_bytes(), KEY)
    unseal_file(sealed, KEY, WHERE)
    assert sealed.read_bytes() == source.read_bytes()

    inner = FileCheckpointStorage(tmp_path / "storage")
    storage = SealedStorage(inner, KEY)
    storage.put_file("shared/000012.sst", source)
    assert dict(storage.list("shared/")) == {"shared/000012.sst": source.stat().st_size}
    storage.get_file("shared/000012.sst", tmp_path / "down" / "000012.sst")
    assert (tmp_path / "down" / "000012.sst").read_bytes() == source.read_bytes()
    stored = inner.root / "shared" / "000012.sst"
    data = bytearray(stored.read_bytes())
    data[1 << 20] ^= 0xFF
    stored.write_bytes(bytes(data))
    target = tmp_path / "again" / "000012.sst"
    with pytest.raises(StorageAuthenticationError, match="shared/000012.sst.*does not match"):
        storage.get_file("shared/000012.sst", target)
    assert list(target.parent.iterdir()) == []  # neither the file nor a temporary one


def test_the_key_comes_from_the_environment_and_open_storage_seals_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert storage_key(SecuritySettings.from_env({})) is None
    key_file = tmp_path / "key"
    key_file.write_text("k" * 32 + "\n")
    assert storage_key(SecuritySettings.from_env({"WEIR_STORAGE_MAC_KEY_FILE": str(key_file)})) == KEY
    with pytest.raises(ConfigurationError, match="WEIR_STORAGE_MAC_KEY is shorter than 16 bytes"):
        storage_key(SecuritySettings.from_env({"WEIR_STORAGE_MAC_KEY": "short"}))
    assert "k" * 32 not in repr(KEY)
    monkeypatch.delenv("WEIR_STORAGE_MAC_KEY", raising=False)
    monkeypatch.delenv("WEIR_STORAGE_MAC_KEY_FILE", raising=False)
    assert isinstance(open_storage(str(tmp_path / "plain")), FileCheckpointStorage)
    monkeypatch.setenv("WEIR_STORAGE_MAC_KEY", "k" * 32)
    storage = open_storage(str(tmp_path / "sealed"))
    assert isinstance(storage, SealedStorage)
    storage.put_bytes("a", b"x")
    assert (tmp_path / "sealed" / "a").read_bytes() == seal(b"x", KEY)


def test_a_reader_without_the_key_refuses_a_sealed_object_in_one_line_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process started without WEIR_STORAGE_MAC_KEY that meets a sealed object says so (one line,
    the object, the missing setting) instead of handing the trailer to a decoder; unsealed objects
    read as they are."""
    monkeypatch.setenv("WEIR_STORAGE_MAC_KEY", "k" * 32)
    open_storage(str(tmp_path)).put_bytes("job-1/_job", b'{"format": 1}')
    monkeypatch.delenv("WEIR_STORAGE_MAC_KEY")
    monkeypatch.delenv("WEIR_STORAGE_MAC_KEY_FILE", raising=False)
    keyless = open_storage(str(tmp_path))
    keyless.put_bytes("plain", b"as it is")
    assert keyless.get_bytes("plain") == b"as it is"
    reads = [
        lambda: keyless.get_bytes("job-1/_job"),
        lambda: keyless.get_versioned("job-1/_job"),
        lambda: keyless.get_file("job-1/_job", tmp_path / "out" / "copy"),
    ]
    for read in reads:
        with pytest.raises(StorageAuthenticationError) as refused:
            read()
        message = str(refused.value)
        assert "\n" not in message and "job-1/_job" in message
        assert "is sealed" in message and "WEIR_STORAGE_MAC_KEY or WEIR_STORAGE_MAC_KEY_FILE is not set here" in message
    assert not (tmp_path / "out" / "copy").exists()
