"""The two installs of Weir: the client (``pip install weir-streaming``: the ``weir`` CLI and the job
API, enough to build a job's graph and submit it) and the server (``weir-streaming[server]``: what
the JobManager and the TaskManagers run on: RocksDB, Arrow, Kafka, PostgreSQL and S3 clients, the
REST API's server).

Flink splits its client (``flink-clients``: the job graph, submission) from its runtime the same way.
The client never imports a server library at import time; a feature that needs one says so in one
line, naming the extra, instead of a ``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import ClassVar, Final

from weir.core.errors import Fault, WeirError

SERVER_EXTRA: Final = "weir-streaming[server]"
POSTGRES_BINARY_EXTRA: Final = "weir-streaming[postgres-binary]"
EXIT_MISSING_EXTRA: Final = 2
"""A process that cannot start for want of the server install exits as one refusing its configuration."""

SERVER_MODULES: Final[Mapping[str, str]] = {
    "rocksdict": "rocksdict",
    "pyarrow": "pyarrow",
    "numpy": "numpy",
    "confluent_kafka": "confluent-kafka",
    "psycopg": "psycopg",
    "tenacity": "tenacity",
    "boto3": "boto3",
    "botocore": "botocore",
    "fastapi": "fastapi",
    "starlette": "fastapi",
    "uvicorn": "uvicorn",
    "grpc_health": "grpcio-health-checking",
    "cryptography": "cryptography",
}
"""Import name -> the distribution of the server extra that brings it."""


class MissingServerExtraError(WeirError):
    """A feature of the server install was used where only the client is installed."""

    fault: Fault = Fault.USER
    retriable: ClassVar[bool] = False

    def __init__(self, feature: str, module: str) -> None:
        distribution = SERVER_MODULES.get(module.split(".")[0], module)
        super().__init__(
            f"{feature} needs the server install, which this environment lacks ({distribution}, module {module}): "
            f"pip install '{SERVER_EXTRA}'"
        )
        self.module = module


class NoLibpqError(WeirError):
    """psycopg is installed but finds no libpq: neither the system's nor psycopg-binary's."""

    fault: Fault = Fault.USER
    retriable: ClassVar[bool] = False

    def __init__(self, feature: str, reason: str) -> None:
        super().__init__(
            f"{feature} needs PostgreSQL's client library and psycopg found none ({reason}): install the system's "
            f"libpq (Debian: libpq5) or pip install '{POSTGRES_BINARY_EXTRA}'"
        )


def server_module_of(error: ImportError) -> str | None:
    """The server module whose absence ``error`` reports, else None (another module is missing: a bug or
    a job's own import, reported as it is)."""
    name = error.name if isinstance(error, ModuleNotFoundError) else None
    if name is not None and name.split(".")[0] in SERVER_MODULES:
        return name
    return None


def require_server(feature: str) -> None:
    """Every module of the server install is there (found, not imported: a process imports what it
    uses), else :class:`MissingServerExtraError` naming the first missing one; psycopg is imported, and
    :class:`NoLibpqError` says when it finds no libpq to load (the system's, or psycopg-binary's)."""
    for module in SERVER_MODULES:
        if module not in sys.modules and importlib.util.find_spec(module) is None:
            raise MissingServerExtraError(feature, module)
    try:
        importlib.import_module("psycopg")
    except ModuleNotFoundError as exc:
        raise MissingServerExtraError(feature, exc.name or "psycopg") from None
    except ImportError as exc:  # psycopg's "no pq wrapper available", with what it tried
        raise NoLibpqError(feature, " ".join(str(exc).split())) from None


@contextmanager
def exit_without_server(program: str, feature: str) -> Iterator[None]:
    """For a server process's entry point: its imports and :func:`require_server` inside, so that a
    client-only environment ends it with ``PROGRAM: error: ...`` on stderr and exit code 2, no traceback."""
    try:
        require_server(feature)
        yield
    except (MissingServerExtraError, NoLibpqError) as exc:
        sys.stderr.write(f"{program}: error: {exc}\n")
        raise SystemExit(EXIT_MISSING_EXTRA) from None
    except ModuleNotFoundError as exc:
        module = server_module_of(exc)
        if module is None:
            raise
        sys.stderr.write(f"{program}: error: {MissingServerExtraError(feature, module)}\n")
        raise SystemExit(EXIT_MISSING_EXTRA) from None
