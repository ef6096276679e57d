"""``make demo``: the seed's keyed aggregation end to end, with a TaskManager killed mid-run.

1. starts the local cluster (JobManager + 3 TaskManagers) with checkpoints in the S3 bucket;
2. recreates the topics ``events``, ``window-results``, ``events-dlq`` and the table ``window_results``;
3. produces the demo events (some malformed) with a progress bar;
4. runs ``examples/keyed_aggregation.py`` over them (bounded, a checkpoint every second) and kills
   ``taskmanager-2`` once a checkpoint has completed: the job restores and finishes;
5. shows the results and runs ``weir verify``, which checks both sinks against the reference.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from weir.tools.client import JobManagerClient
from weir.tools.drive import DriveError, recreate_inputs, s3_endpoints, start_local_cluster, wait_for_job
from weir.tools.events import EventSpec, produce_events
from weir.tools.supervisor import cluster_dir, kill_process

JOB_FILE = Path(__file__).resolve().parents[2] / "examples" / "keyed_aggregation.py"
TOPICS = {"events": 6, "window-results": 3, "events-dlq": 1}
TABLE = "window_results"
TABLE_DEFINITION = (
    "key text, window_start bigint, window_end bigint, count bigint, sum bigint, PRIMARY KEY (key, window_start)"
)

console = Console()


def demo_events() -> EventSpec:
    """The demo's input: 200k events over 1000 keys, every 20,000th malformed (the dead-letter topic)."""
    return EventSpec(count=200_000, keys=1000, malformed_every=20_000)


def main() -> int:
    try:
        return _demo()
    except DriveError as exc:
        raise SystemExit(f"demo: {exc}") from None


def _demo() -> int:
    endpoints = s3_endpoints()
    console.rule("[bold]Weir demo: keyed aggregation with a TaskManager killed mid-run")
    start_local_cluster(console, endpoints)

    recreate_inputs(endpoints, TOPICS, TABLE, TABLE_DEFINITION)
    spec = demo_events()
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
        wait_for_job(client, job_id, lambda s: (s.last_completed_checkpoint or 0) >= 2, 120, "checkpoint 2")
        pid = kill_process(cluster_dir(), "taskmanager-2")
        console.print(f"[red]killed taskmanager-2 (pid {pid}, SIGKILL)[/] after checkpoint 2 completed")
        status = wait_for_job(client, job_id, lambda s: s.summary.status == "FINISHED", 300, "its end")
        console.print(
            f"job {job_id} [green]FINISHED[/]: restarts {status.summary.restarts}, "
            f"last checkpoint {status.last_completed_checkpoint}"
        )

    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(
            f"SELECT key, window_start, window_end, count, sum FROM {TABLE} ORDER BY sum DESC, key LIMIT 5"
        ).fetchall()
        total = conn.execute(f"SELECT count(*), sum(count) FROM {TABLE}").fetchone()
    assert total is not None  # an aggregate always has one row
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
