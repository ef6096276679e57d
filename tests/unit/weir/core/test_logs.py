"""Every event carries the process name, whichever thread logs it."""

from __future__ import annotations

import threading
from typing import Any

from weir.core import logs


def test_events_from_other_threads_carry_the_process_name(monkeypatch: Any) -> None:
    monkeypatch.setattr(logs, "_process", "taskmanager-7")
    seen: list[Any] = []
    thread = threading.Thread(target=lambda: seen.append(logs.add_process(None, "info", {"event": "x"})))
    thread.start()
    thread.join(10)
    assert seen == [{"event": "x", "process": "taskmanager-7"}]
    assert logs.add_process(None, "info", {"event": "y", "process": "bound"})["process"] == "bound"
    assert logs.process_name() == "taskmanager-7"
