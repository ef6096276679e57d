"""Configuration in Flink's shapes: a job's checkpointing (``CheckpointConfigInfo``, ``GET
/jobs/{id}/checkpoints/config``), the web UI's (``DashboardConfiguration``, ``GET /config``), the
JobManager's settings (``ClusterConfigurationInfo``, ``GET /jobmanager/config``) and a job's
(``JobConfigInfo``, ``GET /jobs/{id}/config``).

No secret goes out: a settings field typed as a secret shows as Flink's ``******``
(``GlobalConfiguration.HIDDEN_CONTENT``), a URI's password too; a job parameter shows as given, which
for a secret is a reference (``${env:NAME}``, ``${file:/path}``: a literal one is refused at submit,
and would show as ``<redacted>``)."""

from __future__ import annotations

import datetime
import enum
import time
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr

from weir import __version__
from weir.core.checkpointing import CheckpointingMode
from weir.core.config import (
    Diagnostics,
    Directories,
    Endpoints,
    JobManagerSettings,
    SecuritySettings,
    WeirSettings,
    env_name,
)
from weir.core.kafka_config import redact
from weir.jobmanager.messages import JobConfigView
from weir.jobmanager.rest.ids import flink_job_id
from weir.jobmanager.rest.views import UNKNOWN_REVISION, Model, _api, ms

NEVER_MS: Final = 2**63 - 1  # Flink's interval of a job without periodic checkpoints (Long.MAX_VALUE)
UNLIMITED_FAILED_CHECKPOINTS: Final = 2**31 - 1  # Flink's "tolerate every failed checkpoint" (Integer.MAX_VALUE)
NO_MATERIALIZATION_MS: Final = -1  # Flink's materialization interval when it is off: Weir has no state changelog
STATE_BACKEND: Final = "rocksdb"  # every keyed state of a Weir job is in RocksDB


class Externalization(Model):
    """Flink's ``ExternalizedCheckpointInfo``: Weir keeps a job's retained checkpoints in storage when
    it is cancelled or fails (Flink's ``RETAIN_ON_CANCELLATION``, docs/operations.md)."""

    enabled: bool
    delete_on_cancellation: bool


class CheckpointConfigInfo(Model):
    """Flink's ``CheckpointConfigInfo``, with Weir's ``retained`` (how many completed checkpoints are
    kept, ``checkpointing.retained``) beside it. A failed checkpoint never fails a Weir job (the next one
    is triggered as usual), so ``tolerable_failed_checkpoints`` is Flink's unlimited; Weir has no state
    changelog, so no periodic materialization (Flink's -1: off) and no ``changelog_storage``."""

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
    tolerable_failed_checkpoints: int  # Integer.MAX_VALUE: a failed checkpoint never fails the job
    state_changelog_enabled: bool
    changelog_periodic_materialization_interval: int  # ms; -1: off (no state changelog)
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
        tolerable_failed_checkpoints=UNLIMITED_FAILED_CHECKPOINTS,
        state_changelog_enabled=False,
        changelog_periodic_materialization_interval=NO_MATERIALIZATION_MS,
        retained=settings.retained,
    )


# The web UI's configuration (Flink's DashboardConfiguration) ---------------------------------------

WEB_UI_REFRESH_MS: Final = 2000  # how often the web UI polls (web/app.js's POLL_MS)


class Features(Model):
    """What the web UI offers, as Flink's flags: Weir's cancels; it submits (``weir run``), rescales
    (by savepoint) and serves a history server through none of Flink's endpoints."""

    web_submit: bool = _api("web-submit")
    web_cancel: bool = _api("web-cancel")
    web_rescale: bool = _api("web-rescale")
    web_history: bool = _api("web-history")


class DashboardConfiguration(Model):
    refresh_interval: int = _api("refresh-interval")  # ms
    timezone_name: str = _api("timezone-name")
    timezone_offset: int = _api("timezone-offset")  # ms east of UTC, without daylight saving (Flink's raw offset)
    flink_version: str = _api("flink-version")  # Weir's version
    flink_revision: str = _api("flink-revision")
    features: Features


def dashboard_configuration() -> DashboardConfiguration:
    """The JobManager's time zone, as Flink's (the process's local zone)."""
    return DashboardConfiguration(
        refresh_interval=WEB_UI_REFRESH_MS,
        timezone_name=datetime.datetime.now().astimezone().tzname() or "UTC",
        timezone_offset=-time.timezone * 1000,
        flink_version=__version__,
        flink_revision=UNKNOWN_REVISION,
        features=Features(web_submit=False, web_cancel=True, web_rescale=False, web_history=False),
    )


# The JobManager's settings (Flink's ClusterConfigurationInfo) --------------------------------------

HIDDEN: Final = "******"  # Flink's GlobalConfiguration.HIDDEN_CONTENT
JOBMANAGER_SETTINGS: Final[tuple[type[WeirSettings], ...]] = (
    Endpoints,
    Directories,
    JobManagerSettings,
    SecuritySettings,
    Diagnostics,
)
"""The settings classes a JobManager process reads (weir.core.config; docs/configuration.md)."""


class ConfigEntry(Model):
    key: str
    value: str


def hide_uri_password(value: str) -> str:
    """A URI with its password (``scheme://user:password@host``) hidden; any other text unchanged."""
    parts = urlsplit(value)
    if not parts.password:
        return value
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{HIDDEN}@{host}"))


def _shown(value: object) -> str:
    match value:
        case SecretStr():
            return HIDDEN
        case bool():
            return "true" if value else "false"
        case enum.Enum():
            return str(value.value)
        case _:
            return hide_uri_password(str(value))


def jobmanager_settings(
    environ: Mapping[str, str] | None = None, overrides: Mapping[str, str] | None = None
) -> list[ConfigEntry]:
    """The JobManager's ``WEIR_*`` settings with their values (defaults applied, unset ones left out),
    ``overrides`` (what its command line chose) over them, sorted by name; secrets hidden."""
    values: dict[str, str] = {}
    for settings_class in JOBMANAGER_SETTINGS:
        settings = settings_class.from_env(environ)
        for name in type(settings).model_fields:
            value = getattr(settings, name)
            if value is not None:
                values[env_name(name)] = _shown(value)
    values.update({key: hide_uri_password(value) for key, value in (overrides or {}).items()})
    return [ConfigEntry(key=key, value=values[key]) for key in sorted(values)]


# A job's configuration (Flink's JobConfigInfo) -----------------------------------------------------


class ExecutionConfigInfo(Model):
    """Flink 2.2's ``ExecutionConfigInfo``, which Flink's client reads strictly: these four fields and
    no other (Flink 2.2 dropped ``execution-mode``), so Weir's own job settings sit beside it."""

    restart_strategy: str = _api("restart-strategy")  # its name (restart.strategy)
    job_parallelism: int = _api("job-parallelism")
    object_reuse_mode: bool = _api("object-reuse-mode")  # Flink's default, false: Weir has no such switch
    user_config: dict[str, str] = _api("user-config")  # the job's -D parameters, as given


class JobConfigInfo(Model):
    jid: str
    name: str
    execution_config: ExecutionConfigInfo = _api("execution-config")
    max_parallelism: int  # Weir's: its key groups
    buffer_timeout: int  # Weir's: ms (execution.buffer-timeout)


def job_config(view: JobConfigView) -> JobConfigInfo:
    return JobConfigInfo(
        jid=flink_job_id(view.job_id),
        name=view.job_name,
        execution_config=ExecutionConfigInfo(
            restart_strategy=view.restart_strategy,
            job_parallelism=view.parallelism,
            object_reuse_mode=False,
            user_config={key: redact(key, value) for key, value in sorted(view.parameters.items())},
        ),
        max_parallelism=view.max_parallelism,
        buffer_timeout=ms(view.buffer_timeout_s),
    )
