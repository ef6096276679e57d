"""Endpoints of the services Weir talks to, read from the environment.

The defaults live in ``weir/core/endpoints.env`` (shared with the shell scripts under ``deploy/local``);
a variable set in the environment wins. ``weir infra`` and ``make infra-status`` print them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template


def _read_defaults() -> list[tuple[str, str]]:
    text = resources.files("weir.core").joinpath("endpoints.env").read_text(encoding="utf-8")
    pairs: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition("=")
        pairs.append((name.strip(), value.strip()))
    return pairs


def resolve_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every ``WEIR_*`` endpoint variable: the environment's value, else the expanded default."""
    env = os.environ if environ is None else environ
    resolved: dict[str, str] = {}
    for name, default in _read_defaults():
        value = env.get(name)
        resolved[name] = value if value else Template(default).safe_substitute(resolved)
    return resolved


@dataclass(frozen=True)
class Endpoints:
    kafka_bootstrap: str
    postgres_dsn: str
    s3_endpoint: str
    s3_bucket: str
    s3_access_key: str
    s3_secret_key: str
    prometheus_url: str
    jobmanager_address: str
    jobmanager_metrics_port: int
    jobmanager_rest_port: int  # the REST API and web UI
    taskmanager_metrics_base_port: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Endpoints:
        env = resolve_environment(environ)
        return cls(
            kafka_bootstrap=env["WEIR_KAFKA_BOOTSTRAP"],
            postgres_dsn=env["WEIR_POSTGRES_DSN"],
            s3_endpoint=env["WEIR_S3_ENDPOINT"],
            s3_bucket=env["WEIR_S3_BUCKET"],
            s3_access_key=env["WEIR_S3_ACCESS_KEY"],
            s3_secret_key=env["WEIR_S3_SECRET_KEY"],
            prometheus_url=env["WEIR_PROMETHEUS_URL"],
            jobmanager_address=env["WEIR_JOBMANAGER_ADDRESS"],
            jobmanager_metrics_port=int(env["WEIR_JOBMANAGER_METRICS_PORT"]),
            jobmanager_rest_port=int(env["WEIR_JOBMANAGER_REST_PORT"]),
            taskmanager_metrics_base_port=int(env["WEIR_TASKMANAGER_METRICS_BASE_PORT"]),
        )


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$WEIR_CACHE_DIR``, else ``$XDG_CACHE_HOME/weir``, else ``~/.cache/weir`` (as deploy/local/lib.sh)."""
    env = os.environ if environ is None else environ
    if env.get("WEIR_CACHE_DIR"):
        return Path(env["WEIR_CACHE_DIR"])
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "weir"


def run_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where local processes keep logs, pids and data: ``$WEIR_RUN_DIR``, else ``cache_dir()/run``."""
    env = os.environ if environ is None else environ
    return Path(env["WEIR_RUN_DIR"]) if env.get("WEIR_RUN_DIR") else cache_dir(env) / "run"


def checkpoint_dir(environ: Mapping[str, str] | None = None) -> str:
    """Checkpoint storage URI: ``$WEIR_CHECKPOINT_DIR`` (``s3://bucket/prefix`` or ``file:///dir``), else
    ``file://`` under the run dir (the embedded default)."""
    env = os.environ if environ is None else environ
    explicit = env.get("WEIR_CHECKPOINT_DIR")
    return explicit if explicit else f"file://{run_dir(environ) / 'checkpoints'}"
