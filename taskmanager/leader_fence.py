"""The TaskManager's side of the JobManager fencing (Flink's ``FencedRpcEndpoint``: a call carries its
sender's fencing token and is refused unless the token is current).

Every JobManager call that changes what tasks do (deploy, cancel, trigger a barrier, notify a
checkpoint complete or aborted) carries the caller's leader term (gRPC metadata
``weir-leader-term``; none: term 0, a JobManager without high availability). The fence remembers the
highest term it admitted and refuses a lower one: once a TaskManager has heard from a new leader, a
deposed leader (paused and woken, or partitioned and healed) can no longer commit, deploy or cancel
anything here."""

from __future__ import annotations

import threading
from collections.abc import Iterable


class StaleLeaderError(Exception):
    """A call from a JobManager whose term is below the highest this TaskManager has seen."""


def term_of(metadata: Iterable[tuple[str, str | bytes]], key: str) -> int:
    """The term in a call's metadata; 0 without one. A malformed value is a stale leader's (refused)."""
    for name, value in metadata:
        if name == key:
            text = value.decode() if isinstance(value, bytes) else value
            return int(text) if text.isdigit() else -1
    return 0


class LeaderTermFence:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._highest = 0

    @property
    def highest(self) -> int:
        with self._lock:
            return self._highest

    def admit(self, term: int, what: str) -> None:
        """Admit a call at ``term`` (remembering it if higher), or raise StaleLeaderError."""
        with self._lock:
            if term < self._highest:
                raise StaleLeaderError(
                    f"{what} refused: it comes from a JobManager at leader term {term}, "
                    f"and this TaskManager already follows term {self._highest}"
                )
            self._highest = term
