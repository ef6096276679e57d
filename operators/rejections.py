"""What a task does with a record one of its user functions raised on: fail with the record named,
or send it to the job's dead-letter topic and go on (``weir.core.rejections`` has the values).

An operator calls its function inside ``try`` (free in CPython until something raises) and hands
the exception to :meth:`StreamOperator.reject <weir.operators.base.StreamOperator.reject>`, which asks
:func:`rejected_by_function` whether the function itself raised (not a chained operator, a sink or
the network below it, whose errors pass on as they are) and then :class:`RecordRejections`. Only that
path names the record, looks up its source position and talks to Kafka.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType, TracebackType
from typing import Any, Protocol, assert_never

from prometheus_client import Counter

from weir.core import json_codec
from weir.core.config import Endpoints
from weir.core.errors import JobDefinitionError, NonRetriableError, ServiceUnavailableError, WeirError
from weir.core.kafka_config import KafkaClientConfig, kafka_client_config
from weir.core.metrics import TASK_LABELS
from weir.core.rejections import (
    NO_KEY,
    DeadLetterOnError,
    FailOnError,
    Firing,
    OnRecordError,
    RejectedRecord,
    SourcePosition,
    TimerFiring,
    UserFunctionError,
    WindowFiring,
)

REJECTED_RECORDS = Counter(
    "weir_rejected_records_total",
    "Records a user function raised on, by the operator and what was done with them (failed, dead_lettered)",
    (*TASK_LABELS, "handling"),
)
# The label values counted so far, by job id: removed when the job ends (forget_job_series).
_counted: dict[str, set[tuple[str, ...]]] = {}
_counted_lock = threading.Lock()

DEAD_LETTER_DELIVERY_TIMEOUT_S = 30.0

_RUNTIME_MODULES = ("weir.taskmanager.", "weir.connectors.")


def rejected_by_function(exc: BaseException, operator: object, operator_type: type) -> bool:
    """Whether ``exc``, caught by ``operator`` around its user function, was raised by that function
    on the record, rather than passed up through it: a record already rejected downstream (a
    :class:`UserFunctionError`), an error Weir raised on purpose (a ``WeirError`` other than the job's
    own ``NonRetriableError``), or one raised below a chained operator (``operator_type``: another
    operator of the chain, a sink) or in the runtime (the network output, the state backend)."""
    if isinstance(exc, UserFunctionError):
        return False
    if isinstance(exc, WeirError) and not isinstance(exc, NonRetriableError):
        return False
    tb: TracebackType | None = exc.__traceback__
    if tb is not None:
        tb = tb.tb_next  # the operator's own frame caught it
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self")
        if owner is not operator and isinstance(owner, operator_type):
            return False
        if str(frame.f_globals.get("__name__", "")).startswith(_RUNTIME_MODULES):
            return False
        tb = tb.tb_next
    return True


def letter_text(value: Any, firing: Firing | None) -> str | None:
    """What a dead letter carries as its ``value``: the record's text; a window firing's, the text of
    what its function was given; a timer firing carries none."""
    match firing:
        case None | WindowFiring():
            return record_text(value)
        case TimerFiring():
            return None
        case _:
            assert_never(firing)


def record_text(value: Any) -> str:
    """A rejected record as a dead letter carries it: its JSON when it has one, else its repr."""
    try:
        return json_codec.encode(value).decode("utf-8")
    except Exception:  # not JSON-encodable: a dead letter still says what the record was
        try:
            return repr(value)
        except Exception as exc:
            return f"<{type(value).__name__}: repr raised {type(exc).__name__}>"


class DeadLetterSink(Protocol):
    """Where dead letters go: ``send`` returns once the letter is durable (or raises)."""

    def send(self, topic: str, key: bytes | None, envelope: bytes) -> None: ...
    def close(self) -> None: ...


class KafkaDeadLetters:
    """Dead letters to Kafka, each one confirmed by the broker before the task goes on (so it is
    durable before any later checkpoint covers the record). The producer opens with the first letter;
    the first letter to a topic first looks the topic up: one that does not exist (deleted since the
    job was submitted) is a JobDefinitionError naming it, not a delivery that times out. The letters go
    to the job's Kafka cluster, with the job's settings (its ``-D kafka.*`` parameters)."""

    def __init__(
        self,
        parameters: Mapping[str, str] = MappingProxyType({}),
        endpoints_of: Callable[[], Endpoints] = Endpoints.from_env,
    ) -> None:
        self._parameters = parameters
        self._endpoints_of = endpoints_of
        self._cluster: KafkaClientConfig | None = None
        self._producer: Any = None
        self._topics_found: set[str] = set()

    def send(self, topic: str, key: bytes | None, envelope: bytes) -> None:
        # Kafka's client is the server install's: the job API imports this module on a client too.
        from weir.connectors import kafka

        if self._cluster is None:
            self._cluster = kafka_client_config(self._endpoints_of(), self._parameters)
        cluster = self._cluster
        if topic not in self._topics_found:
            if kafka.topic_partition_count(cluster, topic) is None:
                raise JobDefinitionError(
                    f"dead-letter topic {topic!r} does not exist at {cluster.bootstrap_servers}: create it, then "
                    "run the job again"
                )
            self._topics_found.add(topic)
        if self._producer is None:
            self._producer = kafka.producer(cluster, linger_ms=0)
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        self._producer.produce(topic, key=key, value=envelope, on_delivery=delivered)
        left = self._producer.flush(DEAD_LETTER_DELIVERY_TIMEOUT_S)
        if errors or left:
            why = errors[0] if errors else f"not acknowledged within {DEAD_LETTER_DELIVERY_TIMEOUT_S:g}s"
            raise ServiceUnavailableError(f"dead letter to Kafka topic {topic!r} not delivered: {why}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(DEAD_LETTER_DELIVERY_TIMEOUT_S)
            self._producer = None


class CapturedDeadLetters:
    """Keeps the dead letters instead of sending them (the reference run, tests)."""

    def __init__(self) -> None:
        self.letters: list[tuple[str, bytes | None, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def send(self, topic: str, key: bytes | None, envelope: bytes) -> None:
        with self._lock:
            self.letters.append((topic, key, json_codec.decode(envelope)))

    def close(self) -> None:
        return None


def _position_not_known() -> SourcePosition | None:
    return None


class RecordRejections:
    """One task's handling of rejected records: names them, fails or dead-letters them, counts them
    (``weir_rejected_records_total``) and logs each one (``record_rejected``)."""

    def __init__(
        self,
        job_id: str,
        subtask: int,
        sink: DeadLetterSink,
        log: Any,
        *,
        position_in_flight: Callable[[], SourcePosition | None] = _position_not_known,
        metric_labels: tuple[str, str, str] | None = None,
    ) -> None:
        self._job_id = job_id
        self._subtask = subtask
        self._sink = sink
        self._log = log
        self._position_in_flight = position_in_flight
        self._metric_labels = metric_labels  # (job_id, job_name, taskmanager); None: not counted
        self.failed = 0
        self.dead_lettered = 0

    def locate_with(self, position_in_flight: Callable[[], SourcePosition | None]) -> None:
        """Where the positions of rejected records come from: the task binds its chain's source once
        the chain is built (before it runs)."""
        self._position_in_flight = position_in_flight

    def reject(
        self,
        operator_uid: str,
        on_error: OnRecordError,
        function: Any,
        exc: Exception,
        value: Any,
        timestamp: int | None,
        key: Any = NO_KEY,
        *,
        firing: Firing | None = None,
    ) -> None:
        """``function`` of operator ``operator_uid`` raised ``exc`` on ``value``: raise a
        UserFunctionError naming the record, or dead-letter it and return.

        ``firing``: the function raised on a timer or window firing, not on a record (``value`` is
        what the firing gave it, ``timestamp`` None): it is named as that firing, with no source
        position (whatever record the source read last is not what the function raised on)."""
        rejected = RejectedRecord.of(
            operator_uid=operator_uid,
            subtask=self._subtask,
            function=function,
            exc=exc,
            value=value,
            timestamp=timestamp,
            key=key,
            position=None if firing is not None else self._position_in_flight(),
            firing=firing,
        )
        match on_error:
            case FailOnError():
                self.failed += 1
                self._count(operator_uid, "failed")
                self._log.error("record_rejected", handling="failed", **_log_fields(rejected))
                raise UserFunctionError(rejected) from exc
            case DeadLetterOnError(topic=topic):
                envelope, cut = rejected.envelope(self._job_id, letter_text(value, firing))
                key_bytes = None if rejected.key is None else rejected.key.encode("utf-8")
                try:
                    self._sink.send(topic, key_bytes, json_codec.encode(envelope))
                except JobDefinitionError as error:  # the topic is missing: the job cannot go on as it says
                    raise JobDefinitionError(
                        f"operator {operator_uid!r} (subtask {self._subtask}) could not dead-letter a rejected "
                        f"record: {error} (the record: {rejected.describe()})"
                    ) from error
                self.dead_lettered += 1
                self._count(operator_uid, "dead_lettered")
                self._log.warning(
                    "record_rejected", handling="dead_lettered", dlq=topic, value_truncated=cut, **_log_fields(rejected)
                )
            case _:
                assert_never(on_error)

    def close(self) -> None:
        self._sink.close()

    def _count(self, operator_uid: str, handling: str) -> None:
        if self._metric_labels is None:
            return
        job_id, job_name, taskmanager = self._metric_labels
        labels = (job_id, job_name, operator_uid, str(self._subtask), taskmanager, handling)
        with _counted_lock:
            _counted.setdefault(job_id, set()).add(labels)
        REJECTED_RECORDS.labels(*labels).inc()


def _log_fields(rejected: RejectedRecord) -> dict[str, Any]:
    position = rejected.position
    return {
        "operator_uid": rejected.operator_uid,
        "function": rejected.function,
        "reason": rejected.reason,
        "record": rejected.record,
        "key": rejected.key,
        "timestamp": rejected.timestamp,
        "origin": None if position is None else str(position),
        "firing": None if rejected.firing is None else rejected.firing.fields(),
    }


def forget_job_series(job_id: str) -> None:
    """The job ended (the TaskManager forgets it): remove the rejected-record series of its tasks
    here, as Flink closes a job's metric group. Not when a task ends: the count of the record a
    failing task raised on must stay to be scraped, and the attempt after it counts on."""
    with _counted_lock:
        labels = _counted.pop(job_id, set())
    for child in labels:
        try:
            REJECTED_RECORDS.remove(*child)
        except KeyError:
            pass
