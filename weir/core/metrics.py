"""Prometheus metrics of a TaskManager (prometheus-client), labelled by job id and name, operator,
subtask, TaskManager.

The job's name stands beside its id as in Flink's task scope (``<job_id>``, ``<job_name>``): a job
submitted again gets a new id, and dashboards selecting it by name keep following it. Counters are
updated once per buffer, never per record.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

TASK_LABELS = ("job_id", "job_name", "operator_uid", "subtask", "taskmanager")

RECORDS_IN = Counter("weir_records_in_total", "Records taken in by a task", TASK_LABELS)
RECORDS_OUT = Counter("weir_records_out_total", "Records sent out by a task", TASK_LABELS)
SOURCE_RECORDS_READ = Counter(
    "weir_source_records_read_total",
    "Records a source task's source read (Flink's numRecordsIn of a source operator), chained or not",
    TASK_LABELS,
)
BYTES_IN = Counter("weir_bytes_in_total", "Serialized record bytes received by a task", TASK_LABELS)
BYTES_OUT = Counter("weir_bytes_out_total", "Serialized record bytes sent by a task", TASK_LABELS)
BACKPRESSURED_SECONDS = Counter(
    "weir_backpressured_seconds_total",
    "Time a task spent waiting for credit to send (rate() gives backpressured seconds per second)",
    TASK_LABELS,
)
BUSY_SECONDS = Counter("weir_busy_seconds_total", "Time a task spent processing records", TASK_LABELS)
IDLE_SECONDS = Counter("weir_idle_seconds_total", "Time a task spent waiting for input", TASK_LABELS)
INPUT_BUFFER_USAGE = Gauge("weir_input_buffer_usage_ratio", "Queued input buffers / input capacity", TASK_LABELS)
OUTPUT_CREDITS = Gauge("weir_output_credits", "Credits the task currently holds across its channels", TASK_LABELS)
CURRENT_WATERMARK = Gauge(
    "weir_current_watermark_seconds",
    "Last watermark a task's head operator received, as a Unix time in seconds (0: none yet)",
    TASK_LABELS,
)
DEAD_LETTERS = Counter("weir_dead_letter_records_total", "Malformed records sent to a dead-letter topic", TASK_LABELS)
LATE_RECORDS_DROPPED = Counter(
    "weir_late_records_dropped_total", "Records dropped because their window was past lateness", TASK_LABELS
)
TASKS_RUNNING = Gauge("weir_taskmanager_tasks_running", "Tasks running on this TaskManager", ("taskmanager",))
STATE_SIZE_BYTES = Gauge(
    "weir_taskmanager_state_size_bytes", "Live SST bytes of the TaskManager's keyed-state databases", ("taskmanager",)
)


# Two attempts of a subtask on one TaskManager share its series (the attempt is not a label): the
# latest one to resolve them owns them, and only the owner removes them, so an old attempt ending
# late does not take away the series of the attempt that replaced it.
_owners: dict[tuple[str, tuple[str, ...]], object] = {}
_owners_lock = threading.Lock()


def _claim(kind: str, labels: tuple[str, ...], owner: object) -> None:
    with _owners_lock:
        _owners[(kind, labels)] = owner


def _remove_if_owner(kind: str, labels: tuple[str, ...], owner: object, metrics: Iterable[MetricWrapperBase]) -> None:
    with _owners_lock:
        if _owners.get((kind, labels)) is not owner:
            return
        del _owners[(kind, labels)]
        for metric in metrics:
            try:
                metric.remove(*labels)
            except KeyError:
                pass


class TaskMetrics:
    """The metric children of one subtask, resolved once."""

    def __init__(self, job_id: str, job_name: str, operator_uid: str, subtask: int, taskmanager: str) -> None:
        labels = (job_id, job_name, operator_uid, str(subtask), taskmanager)
        self.labels = labels
        self.taskmanager = taskmanager  # where the task runs: the sinks and crash points name it
        _claim("task", labels, self)
        self.records_in = RECORDS_IN.labels(*labels)
        self.records_out = RECORDS_OUT.labels(*labels)
        self.source_records_read = SOURCE_RECORDS_READ.labels(*labels)
        self.bytes_in = BYTES_IN.labels(*labels)
        self.bytes_out = BYTES_OUT.labels(*labels)
        self.backpressured = BACKPRESSURED_SECONDS.labels(*labels)
        self.busy = BUSY_SECONDS.labels(*labels)
        self.idle = IDLE_SECONDS.labels(*labels)
        self.input_buffer_usage = INPUT_BUFFER_USAGE.labels(*labels)
        self.output_credits = OUTPUT_CREDITS.labels(*labels)
        self.watermark = CURRENT_WATERMARK.labels(*labels)
        self.dead_letters = DEAD_LETTERS.labels(*labels)
        self.late_dropped = LATE_RECORDS_DROPPED.labels(*labels)

    def show_watermark(self, watermark_ms: int) -> None:
        """Set the watermark gauge in seconds, Prometheus' base unit (watermarks are epoch milliseconds):
        ``time() - weir_current_watermark_seconds`` is the event-time lag."""
        self.watermark.set(watermark_ms / 1000.0)

    def remove(self) -> None:
        """Drop this subtask's series (its attempt ended), unless a newer attempt resolved them since."""
        _remove_if_owner("task", self.labels, self, _TASK_METRICS)


_TASK_METRICS = (
    RECORDS_IN,
    RECORDS_OUT,
    SOURCE_RECORDS_READ,
    BYTES_IN,
    BYTES_OUT,
    BACKPRESSURED_SECONDS,
    BUSY_SECONDS,
    IDLE_SECONDS,
    INPUT_BUFFER_USAGE,
    OUTPUT_CREDITS,
    CURRENT_WATERMARK,
    DEAD_LETTERS,
    LATE_RECORDS_DROPPED,
)


# Transactional sinks: labelled by the sink's own operator uid (not its chain's head) -----------------

SINK_TRANSACTIONS_COMMITTED = Counter(
    "weir_sink_transactions_committed_total", "Sink transactions committed (one per epoch with output)", TASK_LABELS
)
SINK_TRANSACTIONS_ABORTED = Counter(
    "weir_sink_transactions_aborted_total",
    "Sink transactions rolled back on purpose (recovery rollbacks, aborts on close)",
    TASK_LABELS,
)
SINK_COMMIT_DURATION = Histogram(
    "weir_sink_commit_duration_seconds",
    "Time to commit one sink transaction (COMMIT PREPARED, Kafka commit_transaction)",
    TASK_LABELS,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
SINK_PREPARED_TRANSACTIONS = Gauge(
    "weir_sink_prepared_transactions",
    "PostgreSQL transactions this sink subtask prepared and has not committed yet",
    TASK_LABELS,
)
SINK_OPEN_TRANSACTION_AGE = Gauge(
    "weir_sink_open_transaction_age_seconds",
    "Age of the Kafka transaction this sink subtask holds open (0 when none is open)",
    TASK_LABELS,
)
SINK_RECORDS_COMMITTED = Counter(
    "weir_sink_records_committed_total", "Records (Kafka) or rows (PostgreSQL) a sink committed", TASK_LABELS
)


END_TO_END_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
END_TO_END_LATENCY = Histogram(
    "weir_end_to_end_latency_seconds",
    "Commit time minus event timestamp, per record a sink committed (records with a timestamp)",
    TASK_LABELS,
    buckets=END_TO_END_LATENCY_BUCKETS,
)


def observe_latencies(histogram: Histogram, timestamps_ms: Iterable[int], now_ms: float) -> None:
    """Observe ``now - timestamp`` (seconds, at least 0) for a whole commit's records at once.

    ``Histogram.observe`` costs about 3 us per value (0.3 s on the task thread for a commit of 100,000
    records). Here the timestamps are sorted once, each bucket's count is a bisection, and the child's
    bucket and sum values (prometheus-client's layout since 0.4: ``_upper_bounds``, one non-cumulative
    ``_buckets`` value per bound, ``_sum``) are incremented once each. A client without that layout
    gets the values one by one."""
    stamps = sorted(timestamps_ms)
    if not stamps:
        return
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for ts in stamps:
            histogram.observe(max(0.0, (now_ms - ts) / 1000.0))
        return
    past = bisect.bisect_right(stamps, now_ms)  # timestamps in the future count as latency 0
    total.inc((now_ms * past - sum(stamps[:past])) / 1000.0)
    n = len(stamps)
    below = 0  # values counted in the buckets so far (latency <= the previous bound)
    for bound, bucket in zip(bounds, buckets, strict=True):
        upto = n - bisect.bisect_left(stamps, now_ms - bound * 1000.0)  # latency <= bound
        if upto > below:
            bucket.inc(upto - below)
            below = upto


_SINK_METRICS = (
    SINK_TRANSACTIONS_COMMITTED,
    SINK_TRANSACTIONS_ABORTED,
    SINK_COMMIT_DURATION,
    SINK_PREPARED_TRANSACTIONS,
    SINK_OPEN_TRANSACTION_AGE,
    END_TO_END_LATENCY,
    SINK_RECORDS_COMMITTED,
)


class SinkMetrics:
    """The metric children of one transactional sink subtask, resolved once."""

    def __init__(self, job_id: str, job_name: str, operator_uid: str, subtask: int, taskmanager: str) -> None:
        labels = (job_id, job_name, operator_uid, str(subtask), taskmanager)
        self.labels = labels
        _claim("sink", labels, self)
        self.committed = SINK_TRANSACTIONS_COMMITTED.labels(*labels)
        self.aborted = SINK_TRANSACTIONS_ABORTED.labels(*labels)
        self.commit_duration = SINK_COMMIT_DURATION.labels(*labels)
        self.prepared = SINK_PREPARED_TRANSACTIONS.labels(*labels)
        self.open_transaction_age = SINK_OPEN_TRANSACTION_AGE.labels(*labels)
        self.end_to_end_latency = END_TO_END_LATENCY.labels(*labels)
        self.records_committed = SINK_RECORDS_COMMITTED.labels(*labels)

    def track_open_transaction_age(self, age_s: Callable[[], float]) -> None:
        """Compute the open transaction's age when Prometheus scrapes."""
        self.open_transaction_age.set_function(age_s)

    def on_commit(self, duration_s: float, records: int, timestamps_ms: Iterable[int], now_ms: float) -> None:
        """One transaction committed ``records`` records, taking ``duration_s``; observe each record's
        end-to-end latency from its event timestamp."""
        self.committed.inc()
        self.commit_duration.observe(duration_s)
        self.records_committed.inc(records)
        observe_latencies(self.end_to_end_latency, timestamps_ms, now_ms)

    def remove(self) -> None:
        _remove_if_owner("sink", self.labels, self, _SINK_METRICS)
