"""The REST tests' JobManager and client: a JobManager built without network (``make_harness``,
nothing in storage, so ready at once) and a FastAPI test client over its REST app."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

from tests.unit.jobmanager.conftest import Harness, MakeHarness
from weir.jobmanager.rest.app import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fastapi.testclient import TestClient


@pytest.fixture
def harness(make_harness: MakeHarness) -> Harness:
    h = make_harness()
    h.jm.recover_jobs()  # nothing in storage: ready at once
    return h


@pytest.fixture
def client(harness: Harness) -> Iterator[TestClient]:
    with TestClient(create_app(harness.jm)) as client:
        yield client
