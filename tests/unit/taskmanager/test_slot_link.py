"""The control link between a TaskManager and a slot worker (``slot_link``), over a real socket pair:
calls get their replies, a refusal keeps the error's class where the servicer maps it, reports are
handed over in order, and the end of either side fails every call still waiting."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest

from weir.core.errors import JobDefinitionError, ProtocolError
from weir.taskmanager.reporter import StateReport
from weir.taskmanager.slot_link import (
    Call,
    CollectProgress,
    ControlLink,
    Deploy,
    LinkClosedError,
    Ready,
    Reply,
    Report,
    SlotWorkerError,
    StopWorker,
    refusal_of,
)
from weir.taskmanager.slot_worker import LinkReports
from weir.wire import jobmanager_pb2


class Pair:
    """Two ends of a link; the worker end answers calls with ``answer``."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.taskmanager = ControlLink(Connection(ours.detach()), "taskmanager end")
        self.worker = ControlLink(Connection(theirs.detach()), "worker end")
        self.received: list[object] = []
        self.closed = threading.Event()
        self.answer: dict[type, object] = {}
        threading.Thread(
            target=self.taskmanager.serve, args=(self.received.append, lambda _why: self.closed.set()), daemon=True
        ).start()
        threading.Thread(target=self.worker.serve, args=(self._answer, lambda _why: None), daemon=True).start()

    def _answer(self, message: object) -> None:
        assert isinstance(message, Call)
        outcome = self.answer.get(type(message.command))
        if isinstance(outcome, Exception):
            self.worker.send(refusal_of(message.call_id, outcome))
        elif outcome is not None:
            self.worker.send(Reply(message.call_id, outcome))
        # None: never answered


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.taskmanager.close("test over")
    p.worker.close("test over")


def test_a_call_gets_its_own_reply(pair: Pair) -> None:
    pair.answer[CollectProgress] = [b"one", b"two"]
    pair.answer[StopWorker] = "stopped"
    assert pair.taskmanager.call(CollectProgress(), 5) == [b"one", b"two"]
    assert pair.taskmanager.call(StopWorker(), 5) == "stopped"


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (JobDefinitionError("build() is missing"), JobDefinitionError),
        (ProtocolError("a buffer without credit"), ProtocolError),
        (KeyError("vertex"), SlotWorkerError),
    ],
)
def test_a_refused_deploy_raises_what_the_servicer_maps(pair: Pair, raised: Exception, expected: type) -> None:
    pair.answer[Deploy] = raised
    with pytest.raises(expected) as caught:
        pair.taskmanager.call(Deploy(b""), 5)
    assert str(raised) in str(caught.value)
    if expected is SlotWorkerError:
        assert caught.value.type_name == "KeyError" and str(caught.value).startswith("KeyError: ")  # type: ignore[attr-defined]


def test_an_unanswered_call_times_out_saying_what_it_waited_for(pair: Pair) -> None:
    with pytest.raises(SlotWorkerError, match="CollectProgress: no reply within 0.2 s"):
        pair.taskmanager.call(CollectProgress(), 0.2)


def test_reports_arrive_in_order_beside_the_replies(pair: Pair) -> None:
    pair.answer[CollectProgress] = []
    reports = [
        Report(StateReport(jobmanager_pb2.ReportTaskStateRequest(attempt=n, records_in=n))) for n in range(1, 51)
    ]
    pair.worker.send(Ready(123, "unix:/tmp/w.sock"))
    for report in reports:
        pair.worker.send(report)
    pair.taskmanager.call(CollectProgress(), 5)  # sent after the reports: its reply comes after them too
    assert pair.received == [Ready(123, "unix:/tmp/w.sock"), *reports]


def test_the_worker_gone_fails_every_waiting_call_and_ends_the_link(pair: Pair) -> None:
    waiting = pair.taskmanager.call_async(CollectProgress())  # never answered
    pair.worker.close("killed")
    assert pair.closed.wait(5), "the TaskManager's end saw the worker's end go"
    with pytest.raises(LinkClosedError, match="gone|closed"):
        waiting.result(5)
    with pytest.raises(LinkClosedError):
        pair.taskmanager.call(CollectProgress(), 1)
    with pytest.raises(LinkClosedError):
        pair.taskmanager.send(Ready(1, "x"))


def test_a_workers_failed_task_report_crosses_the_link_without_its_event_which_is_set_once_sent(pair: Pair) -> None:
    """A failed task waits on ``StateReport.sent`` before its outputs close; an event cannot be pickled
    across the link: the worker keeps it, sends the report without it, and sets it once sent."""
    pair.answer[CollectProgress] = []
    sent = threading.Event()
    request = jobmanager_pb2.ReportTaskStateRequest(attempt=4, records_in=9)
    LinkReports(pair.worker).put(StateReport(request, sent))
    assert sent.is_set()
    pair.taskmanager.call(CollectProgress(), 5)  # its reply comes after the report
    assert pair.received == [Report(StateReport(request))]
    received = pair.received[0]
    assert isinstance(received, Report) and isinstance(received.report, StateReport)
    assert received.report.sent is None


def test_closing_a_link_never_touches_a_socket_opened_after_it() -> None:
    """Both ends closed while their serving threads read: a link closed its socket's descriptor from
    the closing thread and again from the reading one (and shut it down through a dup of a descriptor
    already closed), so a socket the process opened a moment later, given the same descriptor number,
    was shut down or closed under its new owner (make test at 45b7f7b: a refused deploy's call failed
    with "the other end is gone"). Each new link right after must work."""
    broken: list[str] = []
    for _ in range(300):
        old = Pair()
        old.taskmanager.close("test over")
        old.worker.close("test over")
        new = Pair()
        new.answer[CollectProgress] = "answered"
        try:
            assert new.taskmanager.call(CollectProgress(), 5) == "answered"
        except SlotWorkerError as exc:
            broken.append(str(exc))
        finally:
            new.taskmanager.close("test over")
            new.worker.close("test over")
    assert not broken, f"{len(broken)} of 300 links opened after another was closed were broken: {broken[:3]}"
