"""The job's ``execution.*`` settings (given with ``-D``), parsed once at submit.

``execution.buffer-timeout`` (Flink's name and default, 100 ms): how long a record may wait in a
partly filled output buffer before the buffer is sent anyway. Longer means fuller buffers and less
per-buffer work (gRPC messages, credits, watermark handling), shorter means lower latency; ``0``
sends every buffer at once, as soon as the task has handled its current input batch.

``scheduler-mode`` (Flink's name): ``default``, or ``reactive``: the JobManager runs the job at as many
slots as the cluster offers it (its own and the free ones, up to its max parallelism), rescaling it
when a TaskManager registers (``weir.jobmanager.rescaling.reactive_target``) and, when one is lost,
restarting it at what is left instead of waiting for slots.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from weir.jobmanager.errors import ConfigError
from weir.jobmanager.restart import parse_duration

BUFFER_TIMEOUT: Final = "execution.buffer-timeout"
DEFAULT_BUFFER_TIMEOUT_S: Final = 0.1
MAX_BUFFER_TIMEOUT_S: Final = 60.0
SCHEDULER_MODE: Final = "scheduler-mode"
SCHEDULER_MODES: Final = ("default", "reactive")
KEYS: Final = frozenset({BUFFER_TIMEOUT})


@dataclass(frozen=True)
class ExecutionSettings:
    buffer_timeout_s: float = DEFAULT_BUFFER_TIMEOUT_S
    reactive: bool = False  # scheduler-mode: reactive

    @property
    def buffer_timeout_ms(self) -> int:
        return round(self.buffer_timeout_s * 1000)


def parse_execution_settings(params: Mapping[str, str]) -> ExecutionSettings:
    for key in params:
        if key.startswith("execution.") and key not in KEYS:
            raise ConfigError(key, f"unknown setting; the execution settings are {', '.join(sorted(KEYS))}")
    mode = params.get(SCHEDULER_MODE, "default").strip().lower()
    if mode not in SCHEDULER_MODES:
        raise ConfigError(SCHEDULER_MODE, f"must be one of {', '.join(SCHEDULER_MODES)}, got {mode!r}")
    reactive = mode == "reactive"
    raw = params.get(BUFFER_TIMEOUT)
    if raw is None:
        return ExecutionSettings(reactive=reactive)
    timeout_s = parse_duration(BUFFER_TIMEOUT, raw)
    if not 0 <= timeout_s <= MAX_BUFFER_TIMEOUT_S:
        raise ConfigError(BUFFER_TIMEOUT, f"must be between 0 and {MAX_BUFFER_TIMEOUT_S:.0f}s, got {raw!r}")
    return ExecutionSettings(buffer_timeout_s=timeout_s, reactive=reactive)
