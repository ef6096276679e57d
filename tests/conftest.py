"""Session-wide fixtures: the real local services are started once per test session.

Under pytest-xdist (``make test`` runs the integration tests with ``-n 2``) each worker is a test
session of its own, with a Weir cluster of its own on ports of its own (``pytest_configure``,
``tests/integration/ports.py``); the services are shared: ``deploy/local/infra.sh up`` takes a lock, so
the workers' calls at once start each service once."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.ports import worker_index, worker_ports
from weir.connectors import kafka
from weir.core.config import LOCAL_MODE, Endpoints
from weir.tools.client import JobManagerClient

REPO_ROOT = Path(__file__).resolve().parent.parent

# The tests run in the local mode (the local S3 server and its development keys; `make` sets the same),
# and no test asks the instance metadata service of whatever machine runs them for credentials.
os.environ.setdefault(LOCAL_MODE, "true")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, before anything reads the endpoints: this worker's session cluster gets
    ports of its own (worker N: the base ports + 10 × N, ``tests/integration/ports.py``) and, when
    ``WEIR_CHECKPOINT_DIR`` is given, a checkpoint prefix of its own under it (the session cluster
    otherwise makes a unique one)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    os.environ.update(worker_ports(Endpoints.from_env(), worker_index(os.environ)))
    checkpoints = os.environ.get("WEIR_CHECKPOINT_DIR")
    if checkpoints:
        os.environ["WEIR_CHECKPOINT_DIR"] = f"{checkpoints.rstrip('/')}/{worker}"


@dataclass
class SessionTopics:
    """The Kafka topics this test session made: those this process created (``connectors.kafka``'s
    create functions, recorded) and those its jobs' sinks created (named after the job id: the marker
    topics). Other test sessions share the broker and run meanwhile: only these are this session's to
    delete."""

    created: set[str] = field(default_factory=set)
    job_ids: set[str] = field(default_factory=set)

    def owns(self, topic: str) -> bool:
        return topic in self.created or any(job_id in topic for job_id in self.job_ids)


SESSION_TOPICS = SessionTopics()


@pytest.fixture(scope="session", autouse=True)
def record_session_topics() -> Iterator[SessionTopics]:
    """Record every topic this process creates and every job it submits, for ``services``' cleanup."""
    patch = pytest.MonkeyPatch()
    create_topics, create_topic = kafka.create_topics, kafka.create_topic
    submit_job = JobManagerClient.submit_job

    def recording_create_topics(endpoints: Endpoints, topics: Mapping[str, int], *args: Any, **kwargs: Any) -> None:
        SESSION_TOPICS.created.update(topics)
        create_topics(endpoints, topics, *args, **kwargs)

    def recording_create_topic(endpoints: Endpoints, topic: str, *args: Any, **kwargs: Any) -> Any:
        SESSION_TOPICS.created.add(topic)
        return create_topic(endpoints, topic, *args, **kwargs)

    def recording_submit_job(self: JobManagerClient, *args: Any, **kwargs: Any) -> str:
        job_id = submit_job(self, *args, **kwargs)
        SESSION_TOPICS.job_ids.add(job_id)
        return job_id

    patch.setattr(kafka, "create_topics", recording_create_topics)
    patch.setattr(kafka, "create_topic", recording_create_topic)
    patch.setattr(JobManagerClient, "submit_job", recording_submit_job)
    try:
        yield SESSION_TOPICS
    finally:
        patch.undo()


@pytest.fixture(scope="session")
def endpoints() -> Endpoints:
    return Endpoints.from_env()


@pytest.fixture(scope="session")
def services(endpoints: Endpoints) -> Iterator[Endpoints]:
    """Kafka, PostgreSQL, the S3 server and Prometheus, up and healthy (idempotent start).

    The topics the session creates (its own and those its jobs create) are deleted when it ends:
    the local Kafka outlives sessions, and a broker holding thousands of partitions from earlier
    sessions takes minutes to start after an unclean shutdown. Only this session's (``SessionTopics``):
    another session running meanwhile creates topics too, and deleting those failed its jobs (their
    sinks' topics gone, their cancel stuck resolving transactions on them). The same holds for the
    workers of one pytest-xdist run: each deletes its own."""
    result = subprocess.run(
        [str(REPO_ROOT / "deploy/local/infra.sh"), "up"], capture_output=True, text=True, timeout=1800
    )
    if result.returncode != 0:
        pytest.fail(f"local services did not start:\n{result.stderr[-3000:]}", pytrace=False)
    _roll_back_leftover_transactions(endpoints)
    topics_before = set(kafka.list_topic_names(endpoints, timeout_s=30.0))
    yield endpoints
    created = set(kafka.list_topic_names(endpoints, timeout_s=30.0)) - topics_before
    kafka.delete_topics(endpoints, sorted(t for t in created if SESSION_TOPICS.owns(t)), timeout_s=120.0)


LEFTOVER_PREPARED_AGE_S = 600.0
"""A prepared transaction older than this (seconds) at a session's start is a leftover of an ended session."""


def _roll_back_leftover_transactions(endpoints: Endpoints) -> None:
    """Jobs cancelled by earlier test sessions leave prepared transactions (no recovery follows a
    cancel); the local cluster keeps them across sessions, so clear Weir's before this one starts.
    Only those prepared more than ``LEFTOVER_PREPARED_AGE_S`` ago: a test session running beside this one on
    the same PostgreSQL commits its own within a checkpoint or two, and rolling one of those back
    would fail that session's sink (SinkTransactionLostError)."""
    import psycopg

    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        leftovers = conn.execute(
            # %% is a literal % in a query with parameters (psycopg refuses a lone % there)
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'weir:%%' "
            "AND prepared < now() - make_interval(secs => %s)",
            (LEFTOVER_PREPARED_AGE_S,),
        ).fetchall()
        for (gid,) in leftovers:
            try:
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
            except psycopg.errors.UndefinedObject:
                pass  # another session starting meanwhile (an xdist worker) rolled it back first
