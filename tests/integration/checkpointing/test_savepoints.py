"""Savepoints on a real cluster (Flink's resume-savepoint matrix): stop the keyed aggregation with a
savepoint, start a new job from it at the same or another parallelism, and both sinks end exact across
the two jobs (`weir verify`), with nothing prepared or open after the stop. A savepoint holds all its
files, so a copy of it in another prefix restores too; a failed savepoint leaves the job running; a
savepoint whose operator uid the new job lacks is refused unless --allow-non-restored-state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.integration import polling
from tests.integration.conftest import (
    REPO_ROOT,
    WeirCluster,
    assert_sinks_exact,
    keyed_aggregation_inputs,
    path_parameters,
)
from weir.connectors.object_storage import copy_folder, open_storage
from weir.core.checkpointing import CheckpointStatus
from weir.core.errors import JobDefinitionError, WeirError
from weir.core.paths import locate_state
from weir.core.states import JobStatus
from weir.tools.client import JobDetails, SavepointFailedError
from weir.tools.supervisor import kill_process

pytestmark = pytest.mark.integration

JOB = REPO_ROOT / "examples" / "keyed_aggregation.py"
EVENTS = 30_000
FULL_CHECKPOINT_EVENTS = 18_000
UNTHROTTLED = {"source.records_per_second": "0"}


def weir_cli(*args: str) -> str:
    """The `weir` command's stdout (it must succeed)."""
    done = subprocess.run([sys.executable, "-m", "weir.tools.cli", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def events_read(status: JobDetails) -> int:
    return sum(t.records_in_all_attempts for t in status.tasks if t.vertex_uid != "events-source")


def start_job(
    cluster: WeirCluster, unique: str, parallelism: int, extra: dict[str, str] | None = None
) -> tuple[str, dict[str, str]]:
    endpoints = cluster.endpoints
    params = keyed_aggregation_inputs(endpoints, unique, EVENTS, records_per_second=3000, checkpoint_interval="1s")
    params |= extra or {}
    job_id = cluster.client.submit_job(JOB, params, parallelism)
    polling.until(
        "the first job to be part of the way through its input",
        120,
        lambda: events_read(cluster.client.job_status(job_id)) > EVENTS // 4,
    )
    return job_id, params


def prepared_of(cluster: WeirCluster, job_id: str) -> list[tuple[str]]:
    with psycopg.connect(cluster.endpoints.postgres_dsn, autocommit=True) as conn:
        return conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{job_id}%",)).fetchall()


def stop_with_savepoint(cluster: WeirCluster, job_id: str, target: str | None = None) -> str:
    client = cluster.client
    savepoint_id = client.trigger_savepoint(job_id, target, stop=True)
    info = client.wait_for_savepoint(job_id, savepoint_id, timeout_s=120.0)
    status = polling.until(
        "the stopped job to end", 120, lambda: (s := client.job_status(job_id)).summary.status.terminal and s
    )
    assert status.summary.status is JobStatus.FINISHED, status.failure
    assert events_read(status) < EVENTS, "the job read all its input before the savepoint: it would prove nothing"
    assert prepared_of(cluster, job_id) == [], "a stopped job left prepared transactions"
    return info.external_path


def resume_and_verify(
    cluster: WeirCluster, old: str, params: dict[str, str], path: str, parallelism: int
) -> JobDetails:
    client = cluster.client
    # The resumed job reads the rest at full speed: the throttle only kept the first one mid-run.
    new = client.submit_job(JOB, params | UNTHROTTLED, parallelism, from_checkpoint=path)
    done = polling.until(
        "the resumed job to end", 180.0, lambda: (s := client.job_status(new)).summary.status.terminal and s
    )
    assert done.summary.status is JobStatus.FINISHED, done.failure
    assert 0 < events_read(done) < EVENTS, "the resumed job did not start where the savepoint left off"
    assert_sinks_exact(JOB, params, new, cluster.endpoints, earlier_job_ids=(old,))
    return done


@pytest.mark.parametrize(("old_parallelism", "new_parallelism"), [(2, 2), (2, 3), (3, 2)])
def test_stop_with_savepoint_then_resume_keeps_both_sinks_exact(
    weir_cluster: WeirCluster, unique: str, old_parallelism: int, new_parallelism: int
) -> None:
    old, params = start_job(weir_cluster, unique, old_parallelism)
    path = stop_with_savepoint(weir_cluster, old)
    assert f"/{old}/savepoints/sp-" in path
    # Self-contained: every object of the savepoint lies in its folder, no reference to shared files.
    location = locate_state(path)
    storage = open_storage(location.root_uri)
    objects = [key for key, _size in storage.list("")]
    assert "_metadata" in objects and any(k.endswith(".sst") for k in objects)
    metadata = json.loads(storage.get_bytes("_metadata"))
    assert metadata["kind"] == "savepoint"
    for task in metadata["tasks"]:
        for obj in task["objects"]:
            assert obj["key"] in objects and not obj["reused"], f"{obj['key']} is not in the savepoint's folder"
    resume_and_verify(weir_cluster, old, params, path, new_parallelism)


@pytest.mark.parametrize(
    ("first", "then"), [("records", "columnar"), ("columnar", "records"), ("columnar", "columnar")]
)
def test_a_savepoint_of_one_record_path_resumes_on_the_other(
    weir_cluster: WeirCluster, unique: str, first: str, then: str
) -> None:
    """The columnar window keeps the per-record window's state layout ((key, (count, sum)) per key and
    window): a savepoint taken on one path resumes on the other, at another parallelism, both sinks exact."""
    old, params = start_job(weir_cluster, unique, 2, path_parameters(first))
    path = stop_with_savepoint(weir_cluster, old)
    resume_and_verify(weir_cluster, old, params | path_parameters(then), path, 3)


def test_a_savepoint_copied_to_another_prefix_still_restores(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    old, params = start_job(weir_cluster, unique, 2)
    target = f"s3://{weir_cluster.endpoints.s3_bucket}/user-savepoints-{unique}"
    path = stop_with_savepoint(weir_cluster, old, target)
    assert path.startswith(f"{target}/savepoint-{old}-")
    copied = tmp_path / "moved-savepoint"
    source = open_storage(path)
    assert copy_folder(source, "", open_storage(str(copied))) > 0
    # Offline, from the copy alone: what it holds, and one operator's keyed state.
    info = json.loads(weir_cli("savepoint", "info", str(copied), "--keyed", "--json"))
    assert info["job_id"] == old and info["kind"] == "savepoint"
    dumped = [
        json.loads(line)
        for line in weir_cli("savepoint", "dump", str(copied), "--uid", "window-count-sum", "--limit", "5").splitlines()
    ]
    assert len(dumped) == 5 and all(d["state"] == "win" for d in dumped)
    resume_and_verify(weir_cluster, old, params, str(copied), 3)


def test_a_missing_uid_is_refused_unless_non_restored_state_is_allowed(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    old, params = start_job(weir_cluster, unique, 2)
    path = stop_with_savepoint(weir_cluster, old)
    renamed = tmp_path / "renamed_sink.py"
    renamed.write_text(JOB.read_text().replace('uid="postgres-sink"', 'uid="postgres-sink-v2"'))
    with pytest.raises(WeirError, match="operator\\(s\\) postgres-sink that the new job does not have"):
        weir_cluster.client.submit_job(renamed, params, 2, from_checkpoint=path)
    accepted = weir_cluster.client.submit_job(renamed, params, 2, from_checkpoint=path, allow_non_restored_state=True)
    done = polling.until(
        "the job without the old sink's state to end",
        180.0,
        lambda: (s := weir_cluster.client.job_status(accepted)).summary.status.terminal and s,
    )
    assert done.summary.status is JobStatus.FINISHED, done.failure


def test_a_failed_savepoint_leaves_the_job_running(weir_cluster: WeirCluster, unique: str) -> None:
    old, _params = start_job(weir_cluster, unique, 2)
    client = weir_cluster.client
    savepoint_id = client.trigger_savepoint(old, f"s3://no-such-bucket-{unique}/savepoints", stop=True)
    with pytest.raises(SavepointFailedError, match=f"savepoint {savepoint_id} of job {old} failed"):
        client.wait_for_savepoint(old, savepoint_id, timeout_s=120.0)
    assert client.job_status(old).summary.status is JobStatus.RUNNING
    infos = {c.checkpoint_id: c for c in client.list_checkpoints(old)}
    assert infos[savepoint_id].status is CheckpointStatus.FAILED and infos[savepoint_id].failure
    client.cancel_job(old)
    polling.until("the job to be cancelled", 120, lambda: client.job_status(old).summary.status is JobStatus.CANCELED)


def test_a_path_with_no_savepoint_is_a_clear_error(weir_cluster: WeirCluster, tmp_path: Path) -> None:
    with pytest.raises(JobDefinitionError, match="no checkpoint or savepoint metadata at"):
        weir_cluster.client.submit_job(JOB, {}, 2, from_checkpoint=str(tmp_path))


def test_a_changed_state_version_needs_a_migration_and_one_is_applied(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    old, params = start_job(weir_cluster, unique, 2)
    path = stop_with_savepoint(weir_cluster, old)
    source = JOB.read_text()
    anchor = 'uid="window-count-sum")'
    assert anchor in source
    unmigrated = tmp_path / "v2_without_migration.py"
    unmigrated.write_text(source.replace(anchor, 'uid="window-count-sum", state_version=2)'))
    client = weir_cluster.client
    refused = client.submit_job(unmigrated, params, 2, from_checkpoint=path)
    failed = polling.until(
        "the unmigrated job to fail", 120.0, lambda: (s := client.job_status(refused)).summary.status.terminal and s
    )
    assert failed.summary.status is JobStatus.FAILED
    assert failed.failure is not None and not failed.failure.retriable
    assert "operator 'window-count-sum' state 'win'" in failed.failure.message
    assert "holds version 1 (pickle), the job declares version 2 (pickle) and no migration" in failed.failure.message
    # The same change with a migration of the (count, sum) accumulator: resumes exactly.
    migrated = tmp_path / "v2_with_migration.py"
    migrated.write_text(
        source.replace(anchor, 'uid="window-count-sum", state_version=2, migrate=lambda version, acc: tuple(acc))')
    )
    new = client.submit_job(migrated, params | UNTHROTTLED, 3, from_checkpoint=path)
    done = polling.until(
        "the migrated job to end", 180, lambda: (s := client.job_status(new)).summary.status.terminal and s
    )
    assert done.summary.status is JobStatus.FINISHED, done.failure
    assert_sinks_exact(migrated, params, new, weir_cluster.endpoints, earlier_job_ids=(old,))


def test_a_failure_right_after_a_savepoint_restores_from_the_savepoint(weir_cluster: WeirCluster, unique: str) -> None:
    """The sinks committed through the savepoint, so it is the job's restore point until a newer
    checkpoint completes: a TaskManager killed before one restores from the savepoint's own folder
    (keys relative to it), and the output stays exact."""
    endpoints = weir_cluster.endpoints
    params = keyed_aggregation_inputs(endpoints, unique, EVENTS, records_per_second=3000, checkpoint_interval="10min")
    params |= {"restart.strategy": "fixed-delay", "restart.delay": "1s"}
    client = weir_cluster.client
    job_id = client.submit_job(JOB, params, 2)
    polling.until("part of the input read", 120, lambda: events_read(client.job_status(job_id)) > EVENTS // 4)
    savepoint_id = client.trigger_savepoint(job_id)
    info = client.wait_for_savepoint(job_id, savepoint_id, timeout_s=120.0)
    assert f"/{job_id}/savepoints/sp-" in info.external_path
    victim = next(t.taskmanager_id for t in client.job_status(job_id).tasks if t.vertex_uid == "window-count-sum")
    kill_process(weir_cluster.directory, victim)
    done = polling.until(
        "the job to restore and end", 240.0, lambda: (s := client.job_status(job_id)).summary.status.terminal and s
    )
    assert done.summary.status is JobStatus.FINISHED, done.failure
    assert done.summary.restarts >= 1
    assert_sinks_exact(JOB, params, job_id, endpoints)


def test_checkpoint_on_request_and_dispose_of_a_savepoint_from_the_cli(weir_cluster: WeirCluster, unique: str) -> None:
    """`weir checkpoint JOB_ID` completes a checkpoint outside a 10-minute interval; `weir savepoint JOB_ID
    DIR` then `weir savepoint --dispose PATH` leaves none of the savepoint's objects; a retained
    checkpoint's path is refused by --dispose (exit 2) and keeps its files."""
    # Unbounded: the job still runs however long the loaded machine's `weir` commands take (bounded at
    # 500 records/s it finished before the cancel at load 25, and the wait for CANCELED timed out).
    job_id, _params = start_job(
        weir_cluster,
        unique,
        2,
        {"checkpointing.interval": "10min", "source.records_per_second": "500", "source.bounded": "false"},
    )
    client = weir_cluster.client
    taken = json.loads(weir_cli("checkpoint", job_id, "--json"))
    infos = {c.checkpoint_id: c for c in client.list_checkpoints(job_id)}
    assert infos[taken["checkpoint_id"]].status is CheckpointStatus.COMPLETED and taken["size_bytes"] > 0
    target = f"s3://{weir_cluster.endpoints.s3_bucket}/cli-savepoints-{unique}"
    path = weir_cli("savepoint", job_id, target).strip().rpartition(": ")[2]
    location = locate_state(path)
    storage = open_storage(location.root_uri, weir_cluster.endpoints)
    assert any(key == "_metadata" for key, _ in storage.list("")), path
    disposed = weir_cli("savepoint", "--dispose", path)
    assert disposed.startswith("disposed savepoint ") and list(storage.list("")) == []
    assert taken["path"], taken  # retained (checkpointing.retained: 3): the path a restore takes
    refused = subprocess.run(
        [sys.executable, "-m", "weir.tools.cli", "savepoint", "--dispose", taken["path"]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "not a savepoint" in refused.stderr, refused.stderr
    checkpoint_root = locate_state(taken["path"])
    assert open_storage(checkpoint_root.root_uri, weir_cluster.endpoints).exists(checkpoint_root.metadata_key)
    client.cancel_job(job_id)
    ended = weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=120.0)
    assert ended.summary.status is JobStatus.CANCELED, (ended.summary.status, ended.failure)


def checkpoint_object_keys(cluster: WeirCluster, path: str) -> set[str]:
    """Every object key a retained checkpoint's ``_metadata`` references (relative to the storage root)."""
    location = locate_state(path)
    metadata = json.loads(open_storage(location.root_uri, cluster.endpoints).get_bytes(location.metadata_key))
    return {obj["key"] for task in metadata["tasks"] for obj in task["objects"]}


def test_a_full_checkpoint_references_no_earlier_file_and_the_job_restores_from_it(
    weir_cluster: WeirCluster, unique: str
) -> None:
    """`weir checkpoint --full` (Flink's FULL checkpoint type): an incremental checkpoint on request
    references SSTs an earlier checkpoint uploaded; the full one after it references none of the
    earlier checkpoints' objects, the history says it is full, and a TaskManager killed after it
    restores the job from it (no periodic checkpoint in between) with both sinks exact."""
    # 36 s of input at 500 a second: the three checkpoints on request took its first 9 s on a loaded
    # machine (load 10); the kill must come before its end (asserted).
    params = keyed_aggregation_inputs(
        weir_cluster.endpoints, unique, FULL_CHECKPOINT_EVENTS, records_per_second=500, checkpoint_interval="10min"
    )
    params |= {"restart.strategy": "fixed-delay", "restart.delay": "1s"}
    client = weir_cluster.client
    job_id = client.submit_job(JOB, params, 2)
    polling.until("some input read", 120, lambda: events_read(client.job_status(job_id)) > 1000)
    first = json.loads(weir_cli("checkpoint", job_id, "--json"))
    read = events_read(client.job_status(job_id))
    polling.until("more input read", 120, lambda: events_read(client.job_status(job_id)) > read + 500)
    second = json.loads(weir_cli("checkpoint", job_id, "--json"))
    read = events_read(client.job_status(job_id))
    polling.until("more input read", 120, lambda: events_read(client.job_status(job_id)) > read + 500)
    full = json.loads(weir_cli("checkpoint", job_id, "--full", "--json"))
    read = events_read(client.job_status(job_id))
    assert read < FULL_CHECKPOINT_EVENTS, "the job read all its input: the kill would prove nothing"
    assert full["full"] and not second["full"] and first["path"] and second["path"] and full["path"]

    first_keys = checkpoint_object_keys(weir_cluster, first["path"])
    second_keys = checkpoint_object_keys(weir_cluster, second["path"])
    full_keys = checkpoint_object_keys(weir_cluster, full["path"])
    assert any(k.endswith(".sst") for k in full_keys), full_keys
    assert {k for k in second_keys & first_keys if k.endswith(".sst")}, "the incremental checkpoint reused nothing"
    assert not full_keys & (first_keys | second_keys), sorted(full_keys & (first_keys | second_keys))
    infos = {c.checkpoint_id: c for c in client.list_checkpoints(job_id)}
    assert infos[full["checkpoint_id"]].full and not infos[second["checkpoint_id"]].full

    victim = next(t.taskmanager_id for t in client.job_status(job_id).tasks if t.vertex_uid == "window-count-sum")
    kill_process(weir_cluster.directory, victim)
    done = polling.until(
        "the job to restore and end", 240.0, lambda: (s := client.job_status(job_id)).summary.status.terminal and s
    )
    assert done.summary.status is JobStatus.FINISHED, done.failure
    assert done.summary.restarts >= 1
    assert_sinks_exact(JOB, params, job_id, weir_cluster.endpoints)
