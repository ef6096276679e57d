"""The job's ``checkpointing.*`` settings (given with ``-D``), parsed once at submit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from jobmanager.checkpointing.trigger import CheckpointConfig
from jobmanager.errors import ConfigError
from jobmanager.restart import parse_duration
from weir.core.checkpointing import CheckpointingMode

KEYS = frozenset(
    {
        "checkpointing.interval",
        "checkpointing.timeout",
        "checkpointing.min-pause",
        "checkpointing.max-concurrent",
        "checkpointing.retained",
        "checkpointing.mode",
    }
)


@dataclass(frozen=True)
class CheckpointSettings:
    trigger: CheckpointConfig
    retained: int
    mode: CheckpointingMode

    @property
    def enabled(self) -> bool:
        """Periodic checkpoints run (``checkpointing.interval`` is set)."""
        return self.trigger.interval_s is not None


def parse_checkpoint_settings(params: Mapping[str, str]) -> CheckpointSettings:
    """Checkpointing is off unless ``checkpointing.interval`` is set (as in Flink)."""
    for key in params:
        if key.startswith("checkpointing.") and key not in KEYS:
            raise ConfigError(key, f"unknown setting; the checkpointing settings are {', '.join(sorted(KEYS))}")
    interval = params.get("checkpointing.interval")
    raw_mode = params.get("checkpointing.mode", CheckpointingMode.EXACTLY_ONCE.value)
    mode = CheckpointingMode.parse(raw_mode)
    if mode is None:
        names = ", ".join(m.value for m in CheckpointingMode)
        raise ConfigError("checkpointing.mode", f"must be one of {names}, got {raw_mode!r}")
    try:
        retained = int(params.get("checkpointing.retained", "3"))
        max_concurrent = int(params.get("checkpointing.max-concurrent", "1"))
    except ValueError as exc:
        raise ConfigError("checkpointing.retained/max-concurrent", f"not an integer: {exc}") from None
    if retained < 1:
        raise ConfigError("checkpointing.retained", "must be >= 1")
    trigger = CheckpointConfig(
        interval_s=parse_duration("checkpointing.interval", interval) if interval else None,
        timeout_s=parse_duration("checkpointing.timeout", params.get("checkpointing.timeout", "600s")),
        min_pause_s=parse_duration("checkpointing.min-pause", params.get("checkpointing.min-pause", "0s")),
        max_concurrent=max_concurrent,
    )
    return CheckpointSettings(trigger=trigger, retained=retained, mode=mode)
