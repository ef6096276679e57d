"""Unaligned checkpoints (`-D checkpointing.unaligned=true`) on the session cluster: the keyed
aggregation at parallelism 3, a TaskManager SIGKILLed once a checkpoint completed; the job restores
from a checkpoint whose window tasks persisted the records in flight behind their first barrier,
replays them before any new input, and finishes with both sinks exact (`weir verify`: nothing
missing, duplicated, or left prepared or open)."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from tests.integration import polling
from tests.integration.checkpointing.test_recovery import process_running, wait_until
from tests.integration.checkpointing.test_rescale import events_read, retained
from tests.integration.conftest import (
    REPO_ROOT,
    WeirCluster,
    assert_sinks_exact,
    create_topics,
    keyed_aggregation_inputs,
    path_parameters,
)
from weir.core.checkpointing import CheckpointKind, CheckpointStatus
from weir.core.states import JobStatus, TaskState
from weir.tools.client import CheckpointInfo, JobDetails, TaskCheckpointStats
from weir.tools.supervisor import kill_process

pytestmark = pytest.mark.integration

JOB = REPO_ROOT / "examples" / "keyed_aggregation.py"
EVENTS = 60_000
ALIGNED_TIMEOUT_EVENTS = 400_000
"""The aligned-timeout test's input, read unthrottled (600,000 before; `weir verify`'s reference run
over it was most of the test): the windows had read 127,000-185,000 when a checkpoint a window task
switched had completed (four runs, load 7-11); a run that reads it all first fails, naming this."""


def split_off_the_final(completed: list[CheckpointInfo]) -> list[CheckpointInfo]:
    """The completed checkpoints before the last one, which is the bounded job's final checkpoint:
    forced aligned even in unaligned mode (its barrier never overtakes records), so it holds nothing
    in flight and none of its tasks is unaligned."""
    *earlier, final = sorted(completed, key=lambda c: c.checkpoint_id)
    assert not final.unaligned and final.inflight_bytes == 0, f"the final checkpoint was unaligned: {final}"
    return earlier


def kill_mid_run_until_finished(cluster: WeirCluster, job_id: str, victim: str | None, checkpoints: int) -> JobDetails:
    """SIGKILL ``victim`` (None: the TaskManager of the job's first running task) once ``checkpoints``
    checkpoints completed; the job's status once FINISHED."""
    if victim is None:
        running = wait_until(
            cluster,
            job_id,
            lambda s: s.summary.status == "RUNNING" and any(t.state is TaskState.RUNNING for t in s.tasks),
            "a running task",
        )
        victim = next(str(t.taskmanager_id) for t in running.tasks if t.state is TaskState.RUNNING)
    wait_until(
        cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING"
            and (s.last_completed_checkpoint or 0) >= checkpoints
            and process_running(cluster, victim)
        ),
        f"{checkpoints} completed checkpoint(s)",
    )
    kill_process(cluster.directory, victim)
    final = wait_until(cluster, job_id, lambda s: s.summary.status == "FINISHED", "the job to finish", 300)
    assert final.summary.status == "FINISHED", final.failure
    assert final.last_restore_at is not None, f"the job never restored after killing {victim}"
    return final


@pytest.mark.parametrize("path", ["records", "columnar"])
def test_unaligned_checkpoints_survive_a_taskmanager_kill_with_exact_sinks(
    weir_cluster: WeirCluster, unique: str, path: str
) -> None:
    endpoints = weir_cluster.endpoints
    params = keyed_aggregation_inputs(endpoints, unique, EVENTS, records_per_second=4000, checkpoint_interval="500ms")
    params |= path_parameters(path)
    params |= {"checkpointing.unaligned": "true", "restart.strategy": "fixed-delay", "restart.delay": "1s"}
    job_id = weir_cluster.submit("examples/keyed_aggregation.py", params, parallelism=3)

    victim = "taskmanager-2"
    status = wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING"
            and (s.last_completed_checkpoint or 0) >= 2
            and process_running(weir_cluster, victim)
        ),
        "two completed unaligned checkpoints",
    )
    killed_at = status.last_completed_checkpoint or 0
    kill_process(weir_cluster.directory, victim)
    wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING"
            and s.last_restore_at is not None
            and s.last_restore_at > time.time() - 60
            and (s.last_completed_checkpoint or 0) >= killed_at
        ),
        f"recovery after killing {victim}",
    )
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the job to finish", 300)
    assert final.summary.status == "FINISHED", final.failure

    assert_sinks_exact(JOB, params, job_id, endpoints)

    completed = split_off_the_final(
        [
            c
            for c in weir_cluster.client.list_checkpoints(job_id)
            if c.status is CheckpointStatus.COMPLETED and c.kind is CheckpointKind.CHECKPOINT
        ]
    )
    assert completed, "no checkpoint completed before the final one"
    windows = [t for c in completed for t in c.tasks if t.vertex_uid == "window-count-sum"]
    # Unaligned: a window task snapshots on its first barrier, so it never waits for alignment, and
    # each of its acks says it persisted in-flight records (some of them non-empty).
    assert windows and all(t.alignment_duration_s == 0.0 for t in windows), windows
    assert all(c.unaligned for c in completed), [(c.checkpoint_id, c.tasks) for c in completed]
    assert all(t.unaligned for t in windows), windows
    assert sum(c.inflight_bytes for c in completed) > 0, "no checkpoint captured a record in flight"
    # A source's barrier overtakes what its output channels still queue: that is its in-flight state.
    sources = [t for c in completed for t in c.tasks if t.vertex_uid == "events-source"]
    assert sources and all(t.unaligned for t in sources), sources


def test_a_two_input_operator_does_not_align_in_unaligned_mode(weir_cluster: WeirCluster, tmp_path: Path) -> None:
    """The two-input example's barriers arrive late on its slow input (test_alignment: it waits when
    aligned); unaligned, it snapshots on the first barrier and its checkpoints say so."""
    job_id = weir_cluster.submit(
        "examples/two_inputs.py",
        {
            "checkpointing.interval": "500ms",
            "checkpointing.unaligned": "true",
            "orders.rate": "3000",
            "payments.rate": "30",
            "output": str(tmp_path / "out"),
        },
        parallelism=2,
    )
    completed = polling.settle(
        120,
        lambda: [c for c in weir_cluster.client.list_checkpoints(job_id) if c.status == "COMPLETED"],
        lambda done: len(done) >= 4,
    )
    weir_cluster.client.cancel_job(job_id)
    assert len(completed) >= 4, "unaligned checkpoints did not complete"
    match_stats = [t for c in completed for t in c.tasks if t.vertex_uid == "match"]
    assert match_stats and all(t.unaligned and t.alignment_duration_s == 0.0 for t in match_stats), match_stats
    assert weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=60).summary.status == "CANCELED"


def test_the_aligned_checkpoint_timeout_switches_to_unaligned_and_survives_a_kill(
    weir_cluster: WeirCluster, unique: str
) -> None:
    """`-D checkpointing.aligned-checkpoint-timeout`: checkpoints start aligned (the sources' barriers
    go in order); a barrier that waits in a backpressured window task's queue past the timeout is
    turned into a priority one there and the checkpoint goes on unaligned. With the source unthrottled
    the windows are backpressured, so the switch engages; a TaskManager killed once a checkpoint a
    window task switched completed, while its tasks still run and the windows have not read the whole
    input (polled: a run that read it all first fails, naming it), and both sinks exact."""
    endpoints = weir_cluster.endpoints
    params = keyed_aggregation_inputs(
        endpoints, unique, ALIGNED_TIMEOUT_EVENTS, records_per_second=0, checkpoint_interval="200ms"
    )
    params |= {
        "checkpointing.unaligned": "true",
        "checkpointing.aligned-checkpoint-timeout": "1ms",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = weir_cluster.submit("examples/keyed_aggregation.py", params, parallelism=3)
    victim = "taskmanager-1"

    def switched_mid_run(status: JobDetails) -> bool:
        if windows_read(status) >= ALIGNED_TIMEOUT_EVENTS:
            pytest.fail(
                f"the windows read all {ALIGNED_TIMEOUT_EVENTS:,} events before a checkpoint switched to "
                "unaligned: the kill would not land mid-run (raise ALIGNED_TIMEOUT_EVENTS)"
            )
        return (
            status.summary.status == "RUNNING"
            and any(t.taskmanager_id == victim and t.state is TaskState.RUNNING for t in status.tasks)
            and process_running(weir_cluster, victim)
            and any(t.unaligned for t in completed_windows(weir_cluster, job_id))
        )

    wait_until(weir_cluster, job_id, switched_mid_run, "a completed checkpoint a window task switched to unaligned")
    kill_process(weir_cluster.directory, victim)
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the job to finish", 300)
    assert final.summary.status == "FINISHED", final.failure
    assert final.last_restore_at is not None, f"the job never restored after killing {victim}"
    assert_sinks_exact(JOB, params, job_id, endpoints)

    completed = [
        c
        for c in weir_cluster.client.list_checkpoints(job_id)
        if c.status is CheckpointStatus.COMPLETED and c.kind is CheckpointKind.CHECKPOINT
    ]
    sources = [t for c in completed for t in c.tasks if t.vertex_uid == "events-source"]
    assert sources and not any(t.unaligned for t in sources), "a source started a checkpoint unaligned"
    switched = [t for t in completed_windows(weir_cluster, job_id) if t.unaligned]
    assert switched, f"no window task switched to unaligned: {completed_windows(weir_cluster, job_id)}"


def windows_read(status: JobDetails) -> int:
    """The events the window tasks took in, replays included (as their last heartbeats reported)."""
    return sum(t.records_in_all_attempts for t in status.tasks if t.vertex_uid == "window-count-sum")


def completed_windows(cluster: WeirCluster, job_id: str) -> list[TaskCheckpointStats]:
    """The window tasks' stats in the job's completed periodic checkpoints."""
    return [
        t
        for c in cluster.client.list_checkpoints(job_id)
        if c.status is CheckpointStatus.COMPLETED and c.kind is CheckpointKind.CHECKPOINT
        for t in c.tasks
        if t.vertex_uid == "window-count-sum"
    ]


@pytest.mark.parametrize(
    ("old_parallelism", "new_parallelism", "path"), [(3, 2, "records"), (2, 3, "records"), (3, 2, "columnar")]
)
def test_an_unaligned_checkpoint_with_records_in_flight_restores_at_another_parallelism(
    weir_cluster: WeirCluster, unique: str, old_parallelism: int, new_parallelism: int, path: str
) -> None:
    """The in-flight records of a retained unaligned checkpoint move with their keys: a keyed edge's
    input records to the subtask owning their key group now, the output records a barrier overtook
    emitted anew through the new partitioners. Both sinks exact across the two jobs."""
    endpoints = weir_cluster.endpoints
    client = weir_cluster.client
    # The columnar path reads its backlog several times faster, so it is given more of one to read.
    events = 400_000 if path == "columnar" else 150_000
    params = keyed_aggregation_inputs(endpoints, unique, events, records_per_second=0, checkpoint_interval="100ms")
    params |= {"checkpointing.unaligned": "true", "window.size_ms": "200"} | path_parameters(path)
    # The first job is unbounded, and keeps every checkpoint it completes: bounded, the columnar path
    # read all its events and FINISHED before the poll below saw a retained checkpoint holding
    # records in flight (in CI); with 3 retained, those taken while the backlog was read are subsumed
    # a second after it was. The restored job is bounded: it reads to the end and finishes. (A
    # checkpoint whose capture held nothing once reported its empty in-flight document's 53 bytes.)
    first = params | {"source.bounded": "false", "checkpointing.retained": "1000"}
    old = client.submit_job(JOB, first, old_parallelism)

    def with_records_in_flight() -> tuple[list[CheckpointInfo], JobStatus]:
        status = client.job_status(old).summary.status
        return [c for c in retained(weir_cluster, old) if c.inflight_bytes > 0], status

    found, status = polling.settle(
        120, with_records_in_flight, lambda answer: bool(answer[0]) and answer[1] is JobStatus.RUNNING
    )
    assert found and status is JobStatus.RUNNING, f"no retained checkpoint with records in flight; the job is {status}"
    client.cancel_job(old)
    polling.until(
        "the first job to be CANCELED", 120, lambda: client.job_status(old).summary.status is JobStatus.CANCELED
    )
    # The restore starts from the first job's last completed checkpoint: its sinks committed the output of
    # every checkpoint it completed, so a restore from an earlier one (one the poll above saw, before others
    # completed until the cancellation) would emit that output again (seen once: 1,333 window results twice).
    chosen = retained(weir_cluster, old)[-1]
    assert chosen.inflight_bytes > 0, (
        f"the first job's last checkpoint {chosen.checkpoint_id} held no records in flight "
        f"(earlier ones did: {[c.checkpoint_id for c in found]}); the backlog was read before the cancellation"
    )

    new = client.submit_job(JOB, params, new_parallelism, from_checkpoint=chosen.external_path)
    done = polling.settle(300, lambda: client.job_status(new), lambda s: s.summary.status.terminal)
    assert done.summary.status is JobStatus.FINISHED, done.failure
    assert events_read(done) > 0, "the restored job replayed and read nothing"
    # A record replayed into a subtask that does not own its key would reach two sink subtasks (whose
    # Postgres transactions then lock each other out): the job must not have needed a restart.
    assert done.summary.restarts == 0, f"the restored job restarted: {done.failure}"
    assert_sinks_exact(JOB, params, new, endpoints, earlier_job_ids=(old,))


def test_the_two_input_example_in_unaligned_mode_survives_a_taskmanager_kill_with_exact_sinks(
    weir_cluster: WeirCluster, unique: str
) -> None:
    """The two-input operator's inputs differ in rate, so unaligned checkpoints persist records in
    flight on the slow input's channels; a TaskManager killed mid-run, both sinks exact."""
    endpoints = weir_cluster.endpoints
    topic, table = f"two-inputs-{unique}", f"two_inputs_{unique}"
    create_topics(endpoints, {topic: 2})
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (kind text, key text, id bigint, PRIMARY KEY (kind, id))")
    params = {
        "count": "20000",
        "orders.rate": "3000",
        "payments.rate": "1000",
        "sink.topic": topic,
        "sink.table": table,
        "checkpointing.interval": "500ms",
        "checkpointing.unaligned": "true",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = weir_cluster.submit("examples/two_inputs.py", params, parallelism=2)
    final = kill_mid_run_until_finished(weir_cluster, job_id, None, checkpoints=2)
    assert final.summary.restarts >= 1, "the kill did not restart the job"
    assert_sinks_exact(REPO_ROOT / "examples" / "two_inputs.py", params, job_id, endpoints)
    completed = split_off_the_final(
        [
            c
            for c in weir_cluster.client.list_checkpoints(job_id)
            if c.status is CheckpointStatus.COMPLETED and c.kind is CheckpointKind.CHECKPOINT
        ]
    )
    matches = [t for c in completed for t in c.tasks if t.vertex_uid == "match"]
    assert matches and all(t.unaligned for t in matches), matches
    assert sum(t.inflight_bytes for t in matches) > 0, "no checkpoint held records in flight"
