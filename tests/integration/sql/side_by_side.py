"""One SQL statement set run at once on Apache Flink 2.2.1 (bench/flink's ``NexmarkSql`` runner) and
on the session's Weir cluster (the job ``weir sql`` submits), over the same topic; both must finish."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.contenders import flink_environment
from bench.nexmark_bench import PARALLELISM, flink_sql_argv, free_port, weir_sql_statement_set
from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import WeirCluster
from weir.tools.cli import sql_job_source

TIMEOUT_S = 600.0


def run_on_both_sides(
    cluster: WeirCluster,
    build: Path,
    work: Path,
    *,
    queries: Sequence[str],
    topic: str,
    weir_out: str,
    flink_out: str,
    job_name: str,
    edit: Callable[[str], str] = lambda script: script,
) -> None:
    """Flink's job of ``queries`` (each into ``<flink_out>-<query>``, or ``flink_out`` for one) and Weir's
    job of the same statements (``edit`` applied to its script), without mini-batch, both finished."""
    endpoints = cluster.endpoints
    log = work / "flink.log"
    argv = flink_sql_argv(
        build,
        query=",".join(queries),
        bootstrap=endpoints.kafka_bootstrap,
        topic=topic,
        output=flink_out,
        group=f"{flink_out}-group",
        checkpoint_uri=f"file://{work / 'flink-checkpoints'}",
        checkpoint_interval="2s",
        rest_port=free_port(),
        mini_batch=False,
    )
    with log.open("wb") as out:
        flink = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=work,
            env=flink_environment(build, endpoints),
        )  # fmt: skip
    try:
        script = weir_sql_statement_set(
            tuple(queries), topic=topic, output=weir_out, bootstrap=endpoints.kafka_bootstrap, group=weir_out
        )
        job_file = work / f"{job_name}.py"
        job_file.write_text(sql_job_source(edit(script)))
        job_id = cluster.submit(str(job_file), {"checkpointing.interval": "1s"}, parallelism=PARALLELISM)
        final = wait_until(cluster, job_id, lambda s: s.summary.is_terminal, "Weir's job to finish", TIMEOUT_S)
        assert final.summary.status == "FINISHED", final.failure
        code = flink.wait(timeout=TIMEOUT_S)
    finally:
        if flink.poll() is None:
            flink.kill()
            flink.wait(30)
    assert code == 0, f"Flink's job failed (exit {code}):\n" + log.read_text()[-3000:]
