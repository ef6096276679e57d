"""One Kafka sink epoch larger than 64 MiB on a real cluster, with the sink's default memory bound.

80,000 records of 1 KiB (78 MiB of values) go from a bounded topic through the exactly-once Kafka sink
as ONE epoch: the checkpoint interval (5 min) is far longer than reading the input takes, so the first
barrier is the final checkpoint's, after the last record. The epoch spills past the default
``epoch_memory_bytes`` (64 MiB) and its snapshot goes to S3 as one task-state object of more than
64 MiB (never inline, never through a gRPC message). The TaskManager dies after the pre-commit and
before the commit (two crash points); the job recovers, commits the epoch once and finishes, and
``verify_job`` finds the output exact.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO_ROOT, assert_sinks_exact, create_topics, wait_for_job
from weir.connectors import kafka
from weir.connectors.object_storage import open_storage
from weir.core.config import Endpoints
from weir.core.errors import ServiceUnavailableError
from weir.core.ids import JobId
from weir.core.paths import CheckpointPaths
from weir.core.task_state import StoredOperatorState, decode_task_state
from weir.jobmanager.checkpointing.metadata import decode_metadata
from weir.operators.epoch_spill import DEFAULT_EPOCH_MEMORY_BYTES
from weir.operators.transactional_sinks import marker_topic_name
from weir.tools.client import JobManagerClient
from weir.tools.supervisor import read_state

pytestmark = pytest.mark.integration

JOB = REPO_ROOT / "tests" / "integration" / "sinks" / "jobs" / "big_epoch.py"
SINK_UID = "kafka-sink"
RECORDS = 80_000
VALUE_BYTES = 1024
MIB = 1 << 20
BIG = 64 * MIB
PATHS = CheckpointPaths()


def record_value(i: int) -> bytes:
    """Unique per record (so a duplicate or a missing record shows), 1 KiB long."""
    return f"record-{i:08d}|".encode().ljust(VALUE_BYTES, b"abcdefghijklmnopqrstuvwxyz"[i % 26 : i % 26 + 1])


def produce_records(endpoints: Endpoints, topic: str, count: int) -> None:
    producer = kafka.producer(endpoints, linger_ms=20, batch_num_messages=10_000, enable_idempotence=True)
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=record_value(i), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(60)
    if remaining or errors:
        raise ServiceUnavailableError(f"kafka: {remaining} records not delivered to {topic}: {errors[:3]}")


def log_events(directory: Path, *names: str) -> list[dict[str, Any]]:
    """The cluster's JSON log lines whose event is one of ``names``, process by process."""
    found: list[dict[str, Any]] = []
    for log in sorted(directory.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") in names:
                found.append({**entry, "log": log.name})
    return found


def peak_rss_mib(directory: Path, process: str) -> float | None:
    """A cluster process's peak resident memory so far (VmHWM), for the printed figures only."""
    state = read_state(directory)
    pids = [c.pid for c in state.children if c.name == process and c.pid] if state is not None else []
    try:
        status = Path(f"/proc/{pids[0]}/status").read_text()
    except (IndexError, OSError):
        return None
    kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), None)
    return kib / 1024 if kib is not None else None


@pytest.fixture
def topics(services: Endpoints, unique: str) -> Iterator[tuple[str, str]]:
    source, sink = f"big-records-{unique}", f"big-copy-{unique}"
    create_topics(services, {source: 1, sink: 1})
    yield source, sink
    kafka.delete_topics(services, [source, sink])  # 80 MiB each, or 160 with the aborted transaction


AFTER_COMPLETION = "after_checkpoint_complete_before_commit"
AFTER_PRE_COMMIT = "after_pre_commit"


@pytest.mark.parametrize("crash_cluster", [AFTER_COMPLETION, AFTER_PRE_COMMIT], indirect=True)
def test_an_epoch_above_64_mib_is_checkpointed_to_storage_and_recovered_exactly(
    crash_cluster: tuple[Endpoints, JobManagerClient], topics: tuple[str, str], tmp_path: Path
) -> None:
    """``after_checkpoint_complete_before_commit``: the big epoch's checkpoint completed; recovery
    restores it from its S3 object and re-produces the epoch from there. ``after_pre_commit``: killed
    at the barrier with the epoch flushed into its open transaction, before its snapshot existed; no
    checkpoint completed, so the job starts over, fencing aborts that transaction, the source reads the
    input again and the next attempt's big epoch is the one checkpointed and committed."""
    endpoints, client = crash_cluster
    point = os.environ["WEIR_CRASH_POINT"]
    source, sink = topics
    started = time.monotonic()
    produce_records(endpoints, source, RECORDS)
    produced_s = time.monotonic() - started
    params = {
        "source.topic": source,
        "sink.topic": sink,
        "checkpointing.interval": "5min",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = client.submit_job(JOB, params, 1)
    storage = open_storage(os.environ["WEIR_CHECKPOINT_DIR"], endpoints)
    try:
        status = wait_for_job(client, job_id, timeout_s=150.0)
        ran_s = time.monotonic() - started - produced_s
        assert status.summary.status == "FINISHED", status.failure

        fired = list(Path(os.environ["WEIR_CRASH_ONCE_DIR"]).glob("*"))
        assert fired, "the crash point never fired: the test would prove nothing"
        assert status.summary.restarts >= 1

        logs = tmp_path / "run" / "cluster"
        attempts = 1 if point == AFTER_COMPLETION else 2  # sink instances that built the epoch from the source
        # Every record of the input in one epoch, pre-committed at the job's first barrier.
        precommits = [e for e in log_events(logs, "sink_transaction_precommitted") if e["job_id"] == job_id]
        assert [e["records"] for e in precommits] == [RECORDS] * attempts, precommits
        hits = log_events(logs, "crash_point_hit")
        assert [(e["point"], e["checkpoint_id"]) for e in hits] == [(point, precommits[0]["checkpoint_id"])]
        big_checkpoint = precommits[-1]["checkpoint_id"]  # the one that completed
        # The epoch went past the default bound in memory and moved to its spill file.
        spilled = log_events(logs, "epoch_spilled")
        assert [(e["job_id"], e["bound_bytes"]) for e in spilled] == [(job_id, DEFAULT_EPOCH_MEMORY_BYTES)] * attempts

        # The checkpoint's metadata names the sink task's state as an object, and that object is in S3.
        objects = dict(storage.list(PATHS.checkpoint_dir(JobId(job_id), big_checkpoint)))
        metadata_key = PATHS.metadata(JobId(job_id), big_checkpoint)
        assert metadata_key in objects, sorted(objects)
        checkpoint = decode_metadata(storage.get_bytes(metadata_key), metadata_key)
        (task,) = checkpoint.task_states
        document = decode_task_state(task.inline_payload, metadata_key)
        handle = document.operator_state
        assert isinstance(handle, StoredOperatorState), "the big epoch's state stayed inline"
        assert objects.get(handle.key) == handle.size_bytes > BIG
        assert f"/tasks/{document.vertex_uid}/" in handle.key
        (sink_slice,) = [s for s in handle.slices if s.operator_uid == SINK_UID]
        assert sink_slice.length > BIG
        assert len(task.inline_payload) < 4096  # the acknowledgement carries the handle, not the state

        recovered = [e for e in log_events(logs, "kafka_sink_recovered") if e["job_id"] == job_id]
        restored = [e for e in log_events(logs, "task_restored") if e["job_id"] == job_id]
        if point == AFTER_COMPLETION:
            # The restarted sink restored that checkpoint and re-produced the epoch from it, once.
            assert [(e["pending"], e["reproduced"]) for e in recovered] == [([big_checkpoint], [big_checkpoint])]
            assert [(e["checkpoint_id"], e["operator_state_bytes"]) for e in restored] == [
                (big_checkpoint, handle.size_bytes)
            ]
        else:
            assert recovered == [] and restored == []  # nothing completed before the crash: a fresh start
        restored_rss = peak_rss_mib(logs, hits[0]["process"])  # the restarted process: measured, not asserted

        # Nothing of the epoch is left on disk: the crashed instance's spill file (the whole epoch) was
        # removed when its successor opened, even one that re-produced the epoch from its snapshot.
        removed = [e for e in log_events(logs, "epoch_spill_abandoned_removed") if e["job_id"] == job_id]
        assert len(removed) == 1, removed
        spill_root = tmp_path / "run" / "epoch-spill"
        left = sorted(str(p.relative_to(spill_root)) for p in spill_root.rglob("*")) if spill_root.exists() else []
        assert left == [], f"spill files left after the job finished: {left}"

        report = assert_sinks_exact(JOB, params, job_id, endpoints)
        (sink_report,) = report.to_json()["sinks"]
        exact = {k: sink_report[k] for k in ("expected", "found", "duplicates", "missing", "unexpected", "mismatched")}
        assert exact == {
            "expected": RECORDS,
            "found": RECORDS,
            "duplicates": 0,
            "missing": 0,
            "unexpected": 0,
            "mismatched": 0,
        }
        assert sink_report["open_transactions"]["transactions"] == []
        # The epoch is in the log twice: the crashed attempt's transaction (aborted by the fencing,
        # invisible to read_committed consumers) and the committed one.
        ((_low, _stable, high),) = kafka.partition_offsets(endpoints, sink, 1).values()
        assert high >= 2 * RECORDS
        print(
            f"\n{point}: {RECORDS} records, {RECORDS * VALUE_BYTES / MIB:.1f} MiB of values "
            f"({RECORDS * (VALUE_BYTES + 160) / MIB:.1f} MiB as the spill counts it), spilled at record "
            f"{spilled[0]['records']} ({spilled[0]['memory_bytes'] / MIB:.1f} MiB held); checkpoint {big_checkpoint}'s "
            f"task state object {handle.size_bytes} bytes ({handle.size_bytes / MIB:.1f} MiB; sink slice "
            f"{sink_slice.length}); restarts {status.summary.restarts}; produced in {produced_s:.1f}s, "
            f"job in {ran_s:.1f}s; peak RSS of the restarted TaskManager {restored_rss} MiB; sink partition high "
            f"watermark {high}; verify {exact}"
        )
    finally:
        storage.delete(key for key, _size in list(storage.list(PATHS.job_dir(JobId(job_id)))))
        kafka.delete_topics(endpoints, [marker_topic_name(job_id, SINK_UID)])
