"""The ports of the test session's Weir cluster and of the private clusters beside it.

A test session's cluster runs on the ports of ``WEIR_JOBMANAGER_PORT`` (or ``WEIR_JOBMANAGER_ADDRESS``),
``WEIR_JOBMANAGER_METRICS_PORT``, ``WEIR_JOBMANAGER_REST_PORT`` and ``WEIR_TASKMANAGER_METRICS_BASE_PORT``
(TaskManager N listens on base + N), their defaults in weir/core/endpoints.env. Under pytest-xdist
(``make test`` runs the integration tests with ``-n 2``) each worker has a session cluster of its own:
worker N's ports are those shifted by ``WORKER_PORT_STEP`` × N, set in its environment before anything
reads them (``tests/conftest.py``, ``pytest_configure``). A test's private cluster runs on its session's
ports shifted by ``PRIVATE_PORT_SHIFT`` (``private_ports``); one at a time per session, since a worker
runs its tests one after the other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from weir.core.config import Endpoints

WORKER_PORT_STEP: Final = 10
"""Worker N's session ports are the base ports + 10 × N: the defaults' TaskManager ports (base + 1..3)
and every other port of the set stay apart for any N, and a port set laid out as 26X23, 26X49, 26X60,
26X81 keeps two workers inside its own hundred."""

PRIVATE_PORT_SHIFT: Final = 100
"""A private cluster's ports: its session's + 100."""

_WORKER_ID: Final = re.compile(r"gw(\d+)")


def worker_index(environ: Mapping[str, str]) -> int:
    """The number of this pytest-xdist worker (``PYTEST_XDIST_WORKER=gw1``: 1); 0 without xdist."""
    worker = environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return 0
    match = _WORKER_ID.fullmatch(worker)
    if match is None:
        raise ValueError(f"PYTEST_XDIST_WORKER={worker!r} is not a pytest-xdist worker id (gw0, gw1, ...)")
    return int(match.group(1))


def shifted_ports(endpoints: Endpoints, shift: int) -> dict[str, str]:
    """The cluster port variables of ``endpoints`` shifted by ``shift``; a port 0 (any free port) stays 0."""

    def moved(port: int) -> str:
        return str(port + shift) if port else "0"

    host, _, port = endpoints.jobmanager_address.rpartition(":")
    return {
        "WEIR_JOBMANAGER_PORT": moved(int(port)),
        "WEIR_JOBMANAGER_ADDRESS": f"{host}:{moved(int(port))}",
        "WEIR_JOBMANAGER_METRICS_PORT": moved(endpoints.jobmanager_metrics_port),
        "WEIR_JOBMANAGER_REST_PORT": moved(endpoints.jobmanager_rest_port),
        "WEIR_TASKMANAGER_METRICS_BASE_PORT": moved(endpoints.taskmanager_metrics_base_port),
    }


def worker_ports(endpoints: Endpoints, index: int) -> dict[str, str]:
    """The session cluster's port variables of xdist worker ``index``, from the base ports of ``endpoints``."""
    return shifted_ports(endpoints, WORKER_PORT_STEP * index)


def private_ports(endpoints: Endpoints) -> dict[str, str]:
    """The ports of a private cluster: the session's shifted by ``PRIVATE_PORT_SHIFT``, so that it runs
    beside the session's cluster, and sessions (or xdist workers) given different port sets keep their
    private clusters apart too."""
    return shifted_ports(endpoints, PRIVATE_PORT_SHIFT)
