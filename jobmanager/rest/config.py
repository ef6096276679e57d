"""Configuration in Flink's shapes: a job's checkpointing (``CheckpointConfigInfo``, ``GET
/jobs/{id}/checkpoints/config``)."""

from __future__ import annotations

from typing import Final

from weir.core.checkpointing import CheckpointingMode
from weir.jobmanager.messages import JobConfigView
from weir.jobmanager.rest.views import Model, ms

NEVER_MS: Final = 2**63 - 1  # Flink's interval of a job without periodic checkpoints (Long.MAX_VALUE)
STATE_BACKEND: Final = "rocksdb"  # every keyed state of a Weir job is in RocksDB


class Externalization(Model):
    """Flink's ``ExternalizedCheckpointInfo``: Weir keeps a job's retained checkpoints in storage when
    it is cancelled or fails (Flink's ``RETAIN_ON_CANCELLATION``, docs/operations.md)."""

    enabled: bool
    delete_on_cancellation: bool


class CheckpointConfigInfo(Model):
    """Flink's ``CheckpointConfigInfo``, with Weir's ``retained`` (how many completed checkpoints are
    kept, ``checkpointing.retained``) beside it."""

    mode: str  # exactly_once or at_least_once, lower case as Flink writes it
    interval: int  # ms; Long.MAX_VALUE without periodic checkpoints, as Flink
    timeout: int
    min_pause: int
    max_concurrent: int
    externalization: Externalization
    state_backend: str
    checkpoint_storage: str
    unaligned_checkpoints: bool
    aligned_checkpoint_timeout: int  # ms; unaligned only: a barrier goes unaligned after this long
    checkpoints_after_tasks_finish: bool  # a final checkpoint after bounded input ended (always in Weir)
    state_changelog_enabled: bool
    retained: int


def checkpoint_config(view: JobConfigView) -> CheckpointConfigInfo:
    settings = view.checkpointing
    trigger = settings.trigger
    unaligned = settings.mode is CheckpointingMode.UNALIGNED
    mode = CheckpointingMode.EXACTLY_ONCE if unaligned else settings.mode
    return CheckpointConfigInfo(
        mode=mode.value,
        interval=ms(trigger.interval_s) if trigger.interval_s is not None else NEVER_MS,
        timeout=ms(trigger.timeout_s),
        min_pause=ms(trigger.min_pause_s),
        max_concurrent=trigger.max_concurrent,
        externalization=Externalization(enabled=True, delete_on_cancellation=False),
        state_backend=STATE_BACKEND,
        checkpoint_storage=view.checkpoint_storage,
        unaligned_checkpoints=unaligned,
        aligned_checkpoint_timeout=ms(settings.aligned_checkpoint_timeout_s),
        checkpoints_after_tasks_finish=True,
        state_changelog_enabled=False,
        retained=settings.retained,
    )
