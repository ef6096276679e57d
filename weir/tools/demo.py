"""``make demo``: the seed's keyed aggregation end to end, with a TaskManager killed mid-run.

1. starts the local cluster (JobManager + 3 TaskManagers) with checkpoints in the S3 bucket;
2. recreates the topics ``events``, ``window-results``, ``events-dlq`` and the table ``window_results``;
3. produces the demo events (some malformed) with a progress bar;
4. runs ``examples/keyed_aggregation.py`` over them (bounded, a checkpoint every second) and kills
   ``taskmanager-2`` once a checkpoint has completed: the job restores and finishes;
5. shows the results and runs ``weir verify``, which checks both sinks against the reference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from connectors import kafka
from weir.core.config import Endpoints
from weir.tools.client import JobManagerClient
from weir.tools.events import EventSpec, produce_events
from weir.tools.supervisor import cluster_dir, kill_process, start_cluster

JOB_FILE = Path(__file__).resolve().parents[2] / "examples" / "keyed_aggregation.py"
TOPICS = {"events": 6, "window-results": 3, "events-dlq": 1}
TABLE = "window_results"

console = Console()


def _recreate_inputs(endpoints: Endpoints) -> None:
    kafka.create_topics(endpoints, TOPICS, replace=True)
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(
            f"CREATE TABLE {TABLE} (key text, window_start bigint, window_end bigint, count bigint, sum bigint, "
            "PRIMARY KEY (key, window_start))"
        )


def _wait(client: JobManagerClient, job_id: str, done: object, timeout_s: float) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = client.job_status(job_id)
        except Exception:  # the JobManager may be restarting
            time.sleep(0.3)
            continue
        if done(status):  # type: ignore[operator]
            return status
        if status.summary.status in ("FAILED", "CANCELED"):
            raise SystemExit(f"demo: job {job_id} ended {status.summary.status}: {status.failure}")
        time.sleep(0.3)
    raise SystemExit(f"demo: job {job_id} did not get there within {timeout_s:.0f}s")


def main() -> int:
    os.environ.setdefault("WEIR_CHECKPOINT_DIR", f"s3://{Endpoints.from_env().s3_bucket}/checkpoints")
    endpoints = Endpoints.from_env()
    console.rule("[bold]Weir demo: keyed aggregation with a TaskManager killed mid-run")
    started = start_cluster(cluster_dir(), endpoints)
    console.print("cluster: " + ("already up" if started.already_running else "started") + f" ({cluster_dir()})")

    _recreate_inputs(endpoints)
    spec = EventSpec(count=200_000, keys=1000, malformed_every=20_000)
    with Progress(
        TextColumn("producing events"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        bar = progress.add_task("events", total=spec.count)
        produce_events(endpoints, "events", spec, on_progress=lambda n: progress.advance(bar, n))

    params = {
        "source.bounded": "true",
        "source.records_per_second": "20000",
        "checkpointing.interval": "1s",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    with JobManagerClient(endpoints.jobmanager_address) as client:
        job_id = client.submit_job(JOB_FILE, params, 3)
        console.print(
            f"job [bold]{job_id}[/] submitted: {JOB_FILE.name} -p 3 "
            + " ".join(f"-D {k}={v}" for k, v in params.items())
        )
        _wait(client, job_id, lambda s: (s.last_completed_checkpoint or 0) >= 2, 120)
        pid = kill_process(cluster_dir(), "taskmanager-2")
        console.print(f"[red]killed taskmanager-2 (pid {pid}, SIGKILL)[/] after checkpoint 2 completed")
        status = _wait(client, job_id, lambda s: s.summary.status == "FINISHED", 300)
        console.print(
            f"job {job_id} [green]FINISHED[/]: restarts {status.summary.restarts}, "  # type: ignore[attr-defined]
            f"last checkpoint {status.last_completed_checkpoint}"  # type: ignore[attr-defined]
        )

    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(
            f"SELECT key, window_start, window_end, count, sum FROM {TABLE} ORDER BY sum DESC, key LIMIT 5"
        ).fetchall()
        total = conn.execute(f"SELECT count(*), sum(count) FROM {TABLE}").fetchone()
    table = Table("key", "window_start", "window_end", "count", "sum", title=f"top windows in {TABLE}")
    for row in rows:
        table.add_row(*map(str, row))
    console.print(table)
    console.print(
        f"{total[0]} windows, {total[1]} events counted (of {spec.count}; "
        f"{spec.count // spec.malformed_every} malformed → events-dlq)"
    )

    console.rule("weir verify")
    verify = subprocess.run(
        [sys.executable, "-m", "weir.tools.cli", "verify", str(JOB_FILE), "--job-id", job_id],
        check=False,
    )
    return verify.returncode


if __name__ == "__main__":
    sys.exit(main())
