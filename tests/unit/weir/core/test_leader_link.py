"""LeaderLink: a caller among a leader and its standbys moves on when the one it calls does not lead."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from weir.core.leader_link import LeaderLink


class _Failed(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._code.name

    def initial_metadata(self) -> Any: ...
    def trailing_metadata(self) -> Any: ...
    def is_active(self) -> bool: ...  # type: ignore[empty-body]
    def time_remaining(self) -> float | None: ...
    def cancel(self) -> bool: ...  # type: ignore[empty-body]
    def add_callback(self, callback: Any) -> bool: ...  # type: ignore[empty-body]


class _Channel:
    def __init__(self, address: str) -> None:
        self.address = address
        self.closed = False

    def close(self) -> None:
        self.closed = True


class _Stub:
    """Answers like a JobManager at its address: ``leader`` answers, the others fail with ``code``."""

    leader = "b:2"
    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, channel: _Channel) -> None:
        self.address = channel.address

    def Heartbeat(self, request: str, timeout: float) -> str:  # noqa: N802
        if self.address != self.leader:
            raise _Failed(self.code)
        return f"{request} answered by {self.address}"


def link(*addresses: str) -> LeaderLink[_Stub]:
    return LeaderLink(addresses, _Channel, _Stub)  # type: ignore[arg-type]


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
def test_a_call_that_finds_no_leader_moves_the_next_call_to_the_next_address(code: grpc.StatusCode) -> None:
    _Stub.code = code
    jm = link("a:1", "b:2", "c:3")
    with pytest.raises(grpc.RpcError):
        jm.stub.Heartbeat("hb", timeout=1)
    assert jm.address == "b:2"
    assert jm.stub.Heartbeat("hb", timeout=1) == "hb answered by b:2"
    assert jm.address == "b:2"  # it stays with the leader


def test_other_errors_are_the_leaders_own_answer_and_do_not_move() -> None:
    _Stub.code = grpc.StatusCode.NOT_FOUND
    jm = link("a:1", "b:2")
    with pytest.raises(grpc.RpcError):
        jm.stub.Heartbeat("hb", timeout=1)
    assert jm.address == "a:1"


def test_calls_failing_at_once_on_one_address_move_on_once() -> None:
    _Stub.code = grpc.StatusCode.UNAVAILABLE
    jm = link("a:1", "b:2", "c:3")
    index, _ = jm.current()
    jm.move_on(index, grpc.StatusCode.UNAVAILABLE)
    jm.move_on(index, grpc.StatusCode.UNAVAILABLE)  # a second call that failed on a:1 too
    assert jm.address == "b:2"


def test_one_address_is_a_plain_stub() -> None:
    _Stub.code = grpc.StatusCode.UNAVAILABLE
    jm = link("a:1")
    for _ in range(3):
        with pytest.raises(grpc.RpcError):
            jm.stub.Heartbeat("hb", timeout=1)
    assert jm.address == "a:1"
