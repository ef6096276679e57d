"""The job's ``checkpointing.*`` settings (given with ``-D``), parsed once at submit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from weir.core.checkpointing import CheckpointingMode
from weir.jobmanager.checkpointing.trigger import CheckpointConfig
from weir.jobmanager.errors import ConfigError
from weir.jobmanager.restart import parse_duration

KEYS = frozenset(
    {
        "checkpointing.interval",
        "checkpointing.timeout",
        "checkpointing.min-pause",
        "checkpointing.max-concurrent",
        "checkpointing.retained",
        "checkpointing.mode",
        "checkpointing.unaligned",
        "checkpointing.aligned-checkpoint-timeout",
    }
)


@dataclass(frozen=True)
class CheckpointSettings:
    trigger: CheckpointConfig
    retained: int
    mode: CheckpointingMode
    aligned_checkpoint_timeout_s: float = 0.0
    """Unaligned mode only (Flink's ``execution.checkpointing.aligned-checkpoint-timeout``): a checkpoint
    starts aligned; a barrier still queued this long after the checkpoint's trigger goes on as an
    unaligned (priority) one. 0: every checkpoint is unaligned from its start."""

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
    mode = _parse_mode(params)
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
    return CheckpointSettings(
        trigger=trigger,
        retained=retained,
        mode=mode,
        aligned_checkpoint_timeout_s=_parse_aligned_timeout(params, mode),
    )


def _parse_aligned_timeout(params: Mapping[str, str], mode: CheckpointingMode) -> float:
    raw = params.get("checkpointing.aligned-checkpoint-timeout")
    if raw is None:
        return 0.0
    if mode is not CheckpointingMode.UNALIGNED:
        raise ConfigError(
            "checkpointing.aligned-checkpoint-timeout",
            "only applies to unaligned checkpoints: set -D checkpointing.unaligned=true as well",
        )
    timeout = parse_duration("checkpointing.aligned-checkpoint-timeout", raw)
    if timeout < 0:
        raise ConfigError("checkpointing.aligned-checkpoint-timeout", f"must be >= 0, got {raw!r}")
    return timeout


_ALIGNMENT_MODES = (CheckpointingMode.EXACTLY_ONCE, CheckpointingMode.AT_LEAST_ONCE)


def _parse_mode(params: Mapping[str, str]) -> CheckpointingMode:
    """``checkpointing.mode`` (exactly_once, at_least_once) and ``checkpointing.unaligned`` (Flink's
    ``execution.checkpointing.unaligned.enabled``): unaligned is exactly once only."""
    raw_mode = params.get("checkpointing.mode", CheckpointingMode.EXACTLY_ONCE.value)
    mode = CheckpointingMode.parse(raw_mode)
    if mode not in _ALIGNMENT_MODES:
        names = ", ".join(m.value for m in _ALIGNMENT_MODES)
        hint = (
            " (unaligned checkpoints: -D checkpointing.unaligned=true)" if mode is CheckpointingMode.UNALIGNED else ""
        )
        raise ConfigError("checkpointing.mode", f"must be one of {names}, got {raw_mode!r}{hint}")
    raw_unaligned = params.get("checkpointing.unaligned", "false").strip().lower()
    if raw_unaligned not in ("true", "false"):
        raise ConfigError("checkpointing.unaligned", f"must be true or false, got {raw_unaligned!r}")
    if raw_unaligned == "false":
        return mode
    if mode is CheckpointingMode.AT_LEAST_ONCE:
        raise ConfigError(
            "checkpointing.unaligned",
            "unaligned checkpoints are exactly once: they cannot run with checkpointing.mode=at_least_once",
        )
    return CheckpointingMode.UNALIGNED
