"""What the scenarios' drivers share: waiting for a condition with a deadline, threads that watch a
topic or produce the input while a job runs, the ``weir`` CLI as a user runs it, and leaving no job
of a broken run behind.

Every wait polls a condition against a deadline (never a sleep that hopes); a thread's failure is
raised in the driver's thread when it is stopped, so a watcher that died cannot pass for one that saw
nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from rich.console import Console

from weir.connectors import kafka
from weir.core.config import Endpoints
from weir.core.errors import WeirError
from weir.scenarios.framework import ScenarioError
from weir.tools.client import JobManagerClient
from weir.tools.events import EventSpec, produce_events

POLL_S = 0.05

T = TypeVar("T")


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = POLL_S) -> None:
    """Poll ``condition`` until it holds; ScenarioError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise ScenarioError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def wait_for(answer: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = POLL_S) -> T:
    """Poll ``answer`` until it gives something (not None); ScenarioError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (found := answer()) is None:
        if time.monotonic() > deadline:
            raise ScenarioError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)
    return found


def poll(condition: Callable[[], T | None], timeout_s: float, interval_s: float) -> T | None:
    """``condition()``'s first truthy answer within ``timeout_s``; None after it (the caller decides
    whether that is a failure or a try to repeat)."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = condition()
        if answer:
            return answer
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval_s)


def cancel_unless_ended(client: JobManagerClient, job_id: str) -> None:
    """The scenario failed with its job still running: cancel it (a cluster shared with others keeps no
    stray job holding slots); the failure that got here is the one to report."""
    try:
        if not client.job_status(job_id).summary.status.terminal:
            client.cancel_job(job_id)
    except WeirError:
        pass


def run_weir(console: Console, args: Sequence[str], timeout_s: float) -> str:
    """Run ``weir ARGS`` (this Python's CLI) as a user would, show the command and what it printed;
    answer its stdout, ScenarioError when it fails."""
    console.print("$ weir " + " ".join(args), soft_wrap=True, markup=False, highlight=False)
    done = subprocess.run(
        [sys.executable, "-m", "weir.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={**os.environ, "COLUMNS": str(console.width)},
    )
    for line in (done.stdout + done.stderr).rstrip().splitlines():
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    if done.returncode != 0:
        raise ScenarioError(f"weir {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


# Threads that run while the job does --------------------------------------------------------------------


class Background:
    """A thread that runs :meth:`body` until stopped; a failure in it is raised by :meth:`stop` or
    :meth:`finish`, in the driver's thread."""

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def body(self, stop: threading.Event) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self.body(self._stop)
        except BaseException as exc:  # raised in the driver's thread by stop() or finish()
            self._error = exc

    def stop(self, timeout_s: float = 70.0) -> None:
        """Ask the thread to stop, wait for it, raise what it failed with."""
        self._stop.set()
        self._thread.join(timeout_s)
        self._raise()

    def finish(self, timeout_s: float) -> None:
        """Wait for the thread to end on its own; ScenarioError when it has not within ``timeout_s``."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise ScenarioError(f"{self._thread.name} did not finish within {timeout_s:.0f}s")
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise ScenarioError(f"{self._thread.name} failed: {self._error}") from self._error


class EventProducer(Background):
    """The keyed events (``weir.tools.events``) produced in a thread at a steady pace: live input while
    the job runs. ``produced`` counts what was written so far."""

    def __init__(self, endpoints: Endpoints, topic: str, spec: EventSpec, records_per_second: float) -> None:
        super().__init__(f"scenario-producer-{topic}")
        self._endpoints, self._topic, self._spec, self._rate = endpoints, topic, spec, records_per_second
        self.produced = 0
        self._result: int | None = None

    def _advance(self, n: int) -> None:
        self.produced += n

    def body(self, stop: threading.Event) -> None:
        self._result = produce_events(
            self._endpoints,
            self._topic,
            self._spec,
            on_progress=self._advance,
            records_per_second=self._rate,
            progress_every=max(1, int(self._rate) // 10),
            stop=stop,
        )

    def written(self, timeout_s: float) -> int:
        """Wait until every event was produced; how many records were written."""
        self.finish(timeout_s)
        assert self._result is not None
        return self._result


@dataclass(frozen=True)
class Arrival:
    """A record as a watching consumer received it: where it is, when it came (this host's wall clock,
    seconds), and its value."""

    topic: str
    partition: int
    offset: int
    at: float
    value: bytes | None


class TopicWatch(Background):
    """A consumer at one isolation level on some topics, in a group of its own from the earliest
    offsets, noting when each record arrived; ``ready`` once it holds ``partitions`` partitions."""

    def __init__(
        self, endpoints: Endpoints, isolation_level: str, topics: Sequence[str], partitions: int, group: str
    ) -> None:
        super().__init__(f"scenario-{isolation_level}-{'+'.join(topics)}")
        self.isolation_level = isolation_level
        self._endpoints, self._topics, self._partitions, self._group = endpoints, tuple(topics), partitions, group
        self._lock = threading.Lock()
        self._arrivals: list[Arrival] = []
        self.ready = threading.Event()

    def body(self, stop: threading.Event) -> None:
        reader = kafka.consumer(
            self._endpoints,
            group_id=self._group,
            isolation_level=self.isolation_level,
            enable_partition_eof=False,
            fetch_wait_max_ms=10,
        )
        try:
            reader.subscribe(list(self._topics))
            while not stop.is_set():
                messages = reader.consume(num_messages=1000, timeout=0.01)
                now = time.time()
                if not self.ready.is_set() and len(reader.assignment()) >= self._partitions:
                    self.ready.set()
                with self._lock:
                    for m in messages:
                        if m.error():
                            raise ScenarioError(f"{self.isolation_level} consumer: {m.error()}")
                        self._arrivals.append(Arrival(m.topic(), m.partition(), m.offset(), now, m.value()))
        finally:
            reader.close()

    def wait_ready(self, timeout_s: float) -> None:
        """Started and holding its partitions; ScenarioError (the thread stopped) after ``timeout_s``."""
        if not self.ready.wait(timeout_s):
            self.stop()
            raise ScenarioError(f"the {self.isolation_level} consumer got no partitions within {timeout_s:.0f}s")

    def arrivals(self, topic: str | None = None) -> list[Arrival]:
        with self._lock:
            return [a for a in self._arrivals if topic is None or a.topic == topic]

    def count(self) -> int:
        with self._lock:
            return len(self._arrivals)
