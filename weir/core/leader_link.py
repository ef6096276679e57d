"""Calling whichever JobManager leads, among the leader and its standbys (``WEIR_JOBMANAGER_ADDRESSES``).

Only the leader serves the JobManager's service: a standby has not opened its gRPC port yet, and a
deposed leader answers UNAVAILABLE until it starts over as a standby. So a caller keeps one current
address and moves on to the next one whenever a call ends UNAVAILABLE (nobody there, or not the
leader) or DEADLINE_EXCEEDED (a paused leader accepts connections but answers nothing), then lets
its own retry go to the new one. This is the role of Flink's ``LeaderRetrievalService`` with the
leader's address found by asking rather than read from the lease: the clients need no access to
the checkpoint storage. With one address it behaves as a plain stub."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, TypeVar

import grpc
import structlog

log = structlog.get_logger("weir.core")

_Stub = TypeVar("_Stub")

MOVE_ON: Final = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class LeaderLink(Generic[_Stub]):
    """``stub(channel)`` for each of ``addresses``; :attr:`stub` calls the current one and moves on
    to the next address after a call that says this one does not lead (or is gone)."""

    def __init__(
        self,
        addresses: Sequence[str],
        open_channel: Callable[[str], grpc.Channel],
        stub: Callable[[grpc.Channel], _Stub],
    ) -> None:
        if not addresses:
            raise ValueError("no JobManager address")
        self.addresses = tuple(addresses)
        self._open_channel = open_channel
        self._make_stub = stub
        self._lock = threading.Lock()
        self._index = 0
        self._channel = open_channel(self.addresses[0])
        self._stub = stub(self._channel)
        self.stub: Any = _Following(self)

    @property
    def address(self) -> str:
        with self._lock:
            return self.addresses[self._index]

    def current(self) -> tuple[int, _Stub]:
        with self._lock:
            return self._index, self._stub

    def move_on(self, from_index: int, code: grpc.StatusCode) -> None:
        """After a call to ``from_index`` failed with ``code``: the next address (once per failure,
        however many calls failed on the same one at once)."""
        if len(self.addresses) == 1 or code not in MOVE_ON:
            return
        with self._lock:
            if self._index != from_index:
                return
            old = self._channel
            self._index = (self._index + 1) % len(self.addresses)
            self._channel = self._open_channel(self.addresses[self._index])
            self._stub = self._make_stub(self._channel)
        old.close()
        log.info(
            "jobmanager_switched",
            previous=self.addresses[from_index],
            address=self.addresses[self._index],
            code=code.name,
        )

    def close(self) -> None:
        with self._lock:
            self._channel.close()


class _Following:
    """Stands in for the stub: each method calls the current JobManager's."""

    def __init__(self, link: LeaderLink[Any]) -> None:
        self._link = link

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            index, stub = self._link.current()
            try:
                return getattr(stub, name)(*args, **kwargs)
            except grpc.RpcError as exc:
                self._link.move_on(index, exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN)
                raise

        return call
