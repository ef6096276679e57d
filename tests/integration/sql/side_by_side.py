"""One SQL statement set run at once on Apache Flink 2.2.1 (bench/flink's ``NexmarkSql`` runner) and
on the session's Weir cluster (the job ``weir sql`` submits), over the same topic; both must finish.
The comparison tests start Flink only through here."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import pytest

from bench.contenders import flink_available, flink_build_dir, flink_environment
from bench.nexmark_bench import PARALLELISM, flink_sql_argv, free_port, weir_sql_statement_set
from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import WeirCluster
from weir import nexmark as nx
from weir.connectors import kafka
from weir.core.config import Endpoints
from weir.tools.cli import sql_job_source
from weir.tools.nexmark_load import load

TIMEOUT_S = 600.0
NO_RETENTION = {"retention.ms": "-1"}  # Weir's sink stamps records with their (old) event time


def flink_build() -> Path:
    """The Flink runner's build directory (bench/flink/build.sh, as ``make bench-deps`` builds it);
    the test fails, saying why, when Flink cannot run here."""
    reason = flink_available()
    if reason is not None:
        pytest.fail(f"Flink is needed for this test and cannot run: {reason}", pytrace=False)
    return flink_build_dir()


def load_nexmark_topic(
    endpoints: Endpoints, topic: str, partitions: int, events: int, config: nx.NexmarkConfig
) -> None:
    """``topic`` created (its records kept for ever) and loaded with Nexmark's first ``events`` events,
    each partition in event-time order (``weir.tools.nexmark_load``)."""
    assert kafka.create_topic(endpoints, topic, partitions, 1, NO_RETENTION)
    producer = kafka.producer(endpoints, linger_ms=50, batch_num_messages=10_000, enable_idempotence=True)
    assert load(producer, topic, partitions, events, config=config) == events


def output_topics(endpoints: Endpoints, weir_out: str, flink_out: str, queries: Sequence[str]) -> dict[str, str]:
    """Each side's output topic per query (``weir-<query>``, ``flink-<query>`` -> ``<prefix>-<query>``),
    created with two partitions and no retention."""
    topics = {
        f"{side}-{q}": f"{prefix}-{q}" for side, prefix in (("weir", weir_out), ("flink", flink_out)) for q in queries
    }
    for name in topics.values():
        assert kafka.create_topic(endpoints, name, 2, 1, NO_RETENTION)
    return topics


QUICK_START_JVM: Final = ("-XX:TieredStopAtLevel=1",)
"""The comparisons' JVM compiles with C1 only: their Flink runs are short (a few thousand events), most
of their time is the SQL planner's first run, and C2 compiling it on a busy 2-core machine doubled
that (one changelog-join run at load 10-18: 55-57 s with C2, 28 s without). The benchmarks, which
measure throughput, keep the default JIT."""


def flink_argv(
    build: Path, work: Path, endpoints: Endpoints, queries: Sequence[str], topic: str, output: str, mini_batch: bool
) -> list[str]:
    """NexmarkSql's command line: ``queries`` in one job over ``topic``, checkpointed into ``work``."""
    java, *arguments = flink_sql_argv(
        build,
        query=",".join(queries),
        bootstrap=endpoints.kafka_bootstrap,
        topic=topic,
        output=output,
        group=f"{output}-group",
        checkpoint_uri=f"file://{work / 'flink-checkpoints'}",
        checkpoint_interval="2s",  # the final checkpoint (tasks finished) commits the last transactions
        rest_port=free_port(),
        mini_batch=mini_batch,
    )
    return [java, *QUICK_START_JVM, *arguments]


def run_on_flink_only(build: Path, work: Path, endpoints: Endpoints, query: str, topic: str) -> tuple[int, str]:
    """``query`` alone on Flink (as the comparisons run it, with mini-batch): its exit code and output."""
    ran = subprocess.run(
        flink_argv(build, work, endpoints, (query,), topic, f"{topic}-flink-only-{query}", mini_batch=True),
        stdin=subprocess.DEVNULL, capture_output=True, cwd=work, env=flink_environment(build, endpoints),
        timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    return ran.returncode, (ran.stdout + ran.stderr).decode(errors="replace")


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
    mini_batch: bool = False,
    weir_only: Sequence[str] = (),
    functions_module: str | None = None,
) -> None:
    """Flink's job of ``queries`` (each into ``<flink_out>-<query>``, or ``flink_out`` for one) and Weir's
    job of the same statements and of ``weir_only`` (queries Flink refuses; ``edit`` applied to its
    script, ``functions_module`` its SQL functions), both with NexmarkSql's mini-batch settings or both
    without, both finished."""
    endpoints = cluster.endpoints
    log = work / "flink.log"
    with log.open("wb") as out:
        flink = subprocess.Popen(
            flink_argv(build, work, endpoints, queries, topic, flink_out, mini_batch),
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=work,
            env=flink_environment(build, endpoints),
        )  # fmt: skip
    try:
        script = weir_sql_statement_set(
            (*queries, *weir_only),
            topic=topic,
            output=weir_out,
            bootstrap=endpoints.kafka_bootstrap,
            group=weir_out,
            mini_batch=mini_batch,
        )
        job_file = work / f"{job_name}.py"
        job_file.write_text(sql_job_source(edit(script), functions_module))
        job_id = cluster.submit(str(job_file), {"checkpointing.interval": "1s"}, parallelism=PARALLELISM)
        final = wait_until(cluster, job_id, lambda s: s.summary.is_terminal, "Weir's job to finish", TIMEOUT_S)
        assert final.summary.status == "FINISHED", final.failure
        code = flink.wait(timeout=TIMEOUT_S)
    finally:
        if flink.poll() is None:
            flink.kill()
            flink.wait(30)
    assert code == 0, f"Flink's job failed (exit {code}):\n" + log.read_text()[-3000:]
