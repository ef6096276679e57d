"""Prometheus metrics of a TaskManager (prometheus-client), labelled by job, operator, subtask, TaskManager.

Counters are updated once per buffer, never per record.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

TASK_LABELS = ("job", "operator_uid", "subtask", "taskmanager")

RECORDS_IN = Counter("weir_records_in_total", "Records taken in by a task", TASK_LABELS)
RECORDS_OUT = Counter("weir_records_out_total", "Records sent out by a task", TASK_LABELS)
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
    "weir_current_watermark_milliseconds", "Last watermark a task's head operator received", TASK_LABELS
)
DEAD_LETTERS = Counter("weir_dead_letter_records_total", "Malformed records sent to a dead-letter topic", TASK_LABELS)
LATE_RECORDS_DROPPED = Counter(
    "weir_late_records_dropped_total", "Records dropped because their window was past lateness", TASK_LABELS
)
TASKS_RUNNING = Gauge("weir_taskmanager_tasks_running", "Tasks running on this TaskManager", ("taskmanager",))
STATE_SIZE_BYTES = Gauge(
    "weir_taskmanager_state_size_bytes", "Live SST bytes of the TaskManager's RocksDB", ("taskmanager",)
)


class TaskMetrics:
    """The metric children of one subtask, resolved once."""

    def __init__(self, job: str, operator_uid: str, subtask: int, taskmanager: str) -> None:
        labels = (job, operator_uid, str(subtask), taskmanager)
        self.labels = labels
        self.records_in = RECORDS_IN.labels(*labels)
        self.records_out = RECORDS_OUT.labels(*labels)
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

    def remove(self) -> None:
        for metric in (
            RECORDS_IN,
            RECORDS_OUT,
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
        ):
            try:
                metric.remove(*self.labels)
            except KeyError:
                pass
