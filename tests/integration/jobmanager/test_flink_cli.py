"""Apache Flink's own command-line client (flink-clients 2.2 from Maven Central, installed by
``deploy/local/flink-cli.sh``) pointed at Weir's REST API with ``-m``: ``flink list``, ``flink savepoint
JOB DIR``, ``flink savepoint -d PATH``, ``flink stop --savepointPath DIR JOB``, ``flink cancel JOB``, ``flink
checkpoint [-full] JOB`` and ``flink list -a/-r``,
each checked against Weir's own state afterwards (its gRPC client, the savepoint folders on disk).
Flink names a job by a 32-hex JobID: the test passes Weir's ids in that form (``docs/rest-api.md``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration import polling
from tests.integration.conftest import REPO_ROOT, WeirCluster
from weir.core.checkpointing import CheckpointKind, CheckpointStatus
from weir.core.states import JobStatus
from weir.jobmanager.rest.ids import flink_job_id

pytestmark = pytest.mark.integration

FLINK_CLI = REPO_ROOT / "deploy" / "local" / "flink-cli.sh"
JOB = REPO_ROOT / "tests" / "integration" / "jobmanager" / "jobs" / "fail_on_request.py"
PARALLELISM = 1
CLI_TIMEOUT_S = 180.0
DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def flink() -> Callable[..., str]:
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("Flink's CLI needs java and mvn (deploy/local/flink-cli.sh)")
    install = subprocess.run([str(FLINK_CLI), "install"], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, f"deploy/local/flink-cli.sh install failed: {install.stderr}"
    return run_flink


def run_flink(cluster: WeirCluster, *args: str) -> str:
    """``flink ARGS -m host:port``; answers its output, fails the test on a non-zero exit."""
    action, *rest = args
    command = [str(FLINK_CLI), action, "-m", f"127.0.0.1:{cluster.endpoints.jobmanager_rest_port}", *rest]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env={**os.environ, "JVM_ARGS": ""}
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{output}"
    return output


def submit_running(cluster: WeirCluster, directory: Path) -> str:
    params = {
        "fail_request": str(directory / "never"),
        "fail_done": str(directory / "done"),
        "output": str(directory / "out"),
        "checkpointing.interval": "1s",
    }
    job_id = cluster.submit(str(JOB), params, parallelism=PARALLELISM)
    polling.until(
        "the job running", DEADLINE_S, lambda: cluster.client.job_status(job_id).summary.status is JobStatus.RUNNING
    )
    polling.until(
        "every task running",
        DEADLINE_S,
        lambda: all(t.state == "RUNNING" for t in cluster.client.job_status(job_id).tasks),
    )
    return job_id


def savepoint_folders(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if (p / "_metadata").is_file()) if directory.exists() else []


def test_flink_list_savepoint_dispose_and_cancel(
    weir_cluster: WeirCluster, flink: Callable[..., str], tmp_path: Path
) -> None:
    job_id = submit_running(weir_cluster, tmp_path)
    flink_id = flink_job_id(job_id)
    assert len(flink_id) == 32

    listed = flink(weir_cluster, "list")
    (line,) = [line for line in listed.splitlines() if flink_id in line]
    assert line.endswith(f": {flink_id} : fail_on_request (RUNNING)"), listed

    target = tmp_path / "savepoints"
    out = flink(weir_cluster, "savepoint", flink_id, str(target))
    (folder,) = savepoint_folders(target)
    assert f"Savepoint completed. Path: {folder}/" in out, out
    (savepoint,) = [c for c in weir_cluster.client.list_checkpoints(job_id) if c.kind is CheckpointKind.SAVEPOINT]
    assert (savepoint.status, savepoint.external_path) == (CheckpointStatus.COMPLETED, f"{folder}/")
    assert weir_cluster.client.job_status(job_id).summary.status is JobStatus.RUNNING  # a savepoint goes on

    out = flink(weir_cluster, "savepoint", "-d", str(folder))
    assert f"Savepoint '{folder}' disposed." in out, out
    assert not [p for p in folder.rglob("*") if p.is_file()], f"{folder} still holds files"

    flink(weir_cluster, "cancel", flink_id)
    status = weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=DEADLINE_S)
    assert status.summary.status is JobStatus.CANCELED


@pytest.mark.parametrize("drain", [False, True], ids=["stop", "stop-drain"])
def test_flink_stop_with_savepoint_finishes_the_job_at_it(
    weir_cluster: WeirCluster, flink: Callable[..., str], tmp_path: Path, drain: bool
) -> None:
    job_id = submit_running(weir_cluster, tmp_path)
    target = tmp_path / "stopped"
    drain_flag = ["--drain"] if drain else []
    out = flink(weir_cluster, "stop", *drain_flag, "--savepointPath", str(target), flink_job_id(job_id))
    (folder,) = savepoint_folders(target)
    assert f"Savepoint completed. Path: {folder}/" in out, out
    status = weir_cluster.wait_for(job_id, ("FINISHED",), timeout_s=DEADLINE_S)
    assert status.summary.status is JobStatus.FINISHED
    (savepoint,) = [c for c in weir_cluster.client.list_checkpoints(job_id) if c.kind is CheckpointKind.SAVEPOINT]
    assert (savepoint.status, savepoint.external_path) == (CheckpointStatus.COMPLETED, f"{folder}/")


def test_flink_checkpoint_and_list_all_read_a_job_s_checkpoints_and_its_end(
    weir_cluster: WeirCluster, flink: Callable[..., str], tmp_path: Path
) -> None:
    """``flink checkpoint JOB`` (and ``-full``) triggers a checkpoint and waits for it; ``flink list -a``
    lists the running jobs and, once the job ended, it among the terminated ones."""
    job_id = submit_running(weir_cluster, tmp_path)
    flink_id = flink_job_id(job_id)
    for full in ([], ["-full"]):
        out = flink(weir_cluster, "checkpoint", *full, flink_id)
        completed = re.search(rf"Checkpoint\S* (\d+) for job {flink_id} completed\.", out)
        assert completed is not None, out
        checkpoint_id = int(completed.group(1))
        (taken,) = [c for c in weir_cluster.client.list_checkpoints(job_id) if c.checkpoint_id == checkpoint_id]
        assert (taken.status, taken.kind, taken.full) == (
            CheckpointStatus.COMPLETED,
            CheckpointKind.CHECKPOINT,
            bool(full),
        )

    running = flink(weir_cluster, "list", "-a")
    (line,) = [line for line in running.splitlines() if flink_id in line]
    assert line.endswith(f": {flink_id} : fail_on_request (RUNNING)"), running
    weir_cluster.client.cancel_job(job_id)
    weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=DEADLINE_S)
    ended = flink(weir_cluster, "list", "-a")
    terminated = ended.split("Terminated Jobs", 1)[1]
    (line,) = [line for line in terminated.splitlines() if flink_id in line]
    assert line.endswith(f": {flink_id} : fail_on_request (CANCELED)"), ended
    assert flink_id not in flink(weir_cluster, "list", "-r")
