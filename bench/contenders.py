"""The contenders of ``bench/run.py``, each started on an input and an output topic and watched.

A contender answers, while it runs: how many input events it has consumed (``progress``), whether
its output is complete (``done``, bounded runs), and which processes are its own (``pids``), so
that the runner measures every contender the same way.

- Weir: a private cluster started for the run (JobManager, three TaskManagers, their supervisor)
  and the job submitted to it; its processes are the cluster's, counted from their start, as a
  JVM's start-up is in Flink's CPU. The cluster is stopped when the run stops.
- Quix Streams, the raw limit and the ceiling: three processes each (``bench/quix_app.py``,
  ``bench/raw_worker.py``, ``bench/ceiling_worker.py``) reporting progress on stdout; their CPU and
  peak RSS come from ``os.wait4`` when they are reaped.
- Apache Flink: one JVM running the same job on a local MiniCluster at parallelism 3
  (``bench/flink/``, built by ``bench/flink/build.sh`` into ``$WEIR_CACHE_DIR/bench/flink``); its CPU
  and peak RSS are the whole JVM's, from ``os.wait4`` too. Its checkpoints go to the S3 server,
  under the run's checkpoint prefix, as Weir's do (Flink's S3 plugin, ``flink_environment``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import psycopg
import psycopg.sql
from confluent_kafka import KafkaException

from bench import dataset
from bench.harness import (
    REPO_ROOT,
    BenchCluster,
    BenchEnvironment,
    BenchError,
    ProcessSampler,
    Reaped,
    log,
    reap,
    start_private_cluster,
)
from weir.core.config import Endpoints

WORKERS: Final = 3
FLINK_MODULE: Final = "flink"  # the Java job of bench/flink/, not a Python module
FLINK_VERSION: Final = "2.2.1"  # as in bench/flink/pom.xml (a unit test holds the two together)
FLINK_KAFKA_CONNECTOR: Final = "5.0.0-2.2"
FLINK_MAIN: Final = "weir.bench.WindowJob"
FLINK_BUILD: Final = REPO_ROOT / "bench" / "flink" / "build.sh"
KEYED_AGGREGATION: Final = REPO_ROOT / "examples" / "keyed_aggregation.py"
SOURCE_UID: Final = "events-source"


@dataclass(frozen=True)
class Topics:
    input: str
    output: str


class Running(Protocol):
    def ready(self) -> bool: ...
    def progress(self) -> int: ...
    def done(self) -> bool: ...
    def pids(self) -> dict[str, int]: ...
    def stop(self, sampler: ProcessSampler) -> None: ...


class Contender(Protocol):
    key: str  # short id: weir, weir-kafka, quix, raw
    label: str  # as shown in the results
    sinks: str
    guarantee: str

    def start(self, topics: Topics, *, bounded: bool, tag: str) -> Running: ...


# Weir ------------------------------------------------------------------------------------------------


@dataclass
class WeirContender:
    key: str
    label: str
    env: BenchEnvironment
    with_postgres: bool
    columnar: bool = False  # -D columnar=true: the job's columnar path (Arrow batches, built-in aggregates)
    sinks: str = ""
    guarantee: str = "exactly-once (checkpoints every 1 s)"
    tables: list[str] = field(default_factory=list)
    job_ids: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sinks = "Kafka (transactions) + PostgreSQL (2PC)" if self.with_postgres else "Kafka (transactions)"

    @property
    def job_file(self) -> Path:
        return KEYED_AGGREGATION  # the Kafka-only variant is the same job with -D sink.postgres=false

    def start(self, topics: Topics, *, bounded: bool, tag: str, extra: dict[str, str] | None = None) -> WeirRunning:
        """A fresh cluster (``cluster-<tag>``) and the job on it; stopping the run stops the cluster."""
        endpoints = self.env.endpoints
        dlq = f"{topics.input}-dlq-{tag}"
        dataset.create_topics(endpoints, {dlq: 1})
        params = {
            "source.topic": topics.input,
            "source.bounded": "true" if bounded else "false",
            "source.dlq_topic": dlq,
            "sink.topic": topics.output,
            "checkpointing.interval": "1s",
            **(extra or {}),
        }
        if self.columnar:
            params["columnar"] = "true"
        if not self.with_postgres:
            params["sink.postgres"] = "false"
        else:
            table = f"bench_{self.env.run_id}_{tag}".replace("-", "_")
            create_window_table(endpoints, table)
            self.tables.append(table)
            params["sink.table"] = table
        cluster = start_private_cluster(self.env, f"cluster-{tag}", quiet=True)
        try:
            job_id = cluster.submit(self.job_file, params, WORKERS)
        except Exception:
            cluster.stop()
            raise
        self.job_ids.append(job_id)
        return WeirRunning(cluster, job_id)

    def cleanup(self) -> None:
        drop_tables(self.env.endpoints, self.tables, self.job_ids)
        self.tables.clear()


@dataclass
class WeirRunning:
    """A Weir job on the cluster started for it."""

    cluster: BenchCluster
    job_id: str
    _finished: bool = False
    _stopped: bool = False

    def progress(self) -> int:
        return self.cluster.source_records_read(self.job_id, SOURCE_UID)

    def done(self) -> bool:
        if not self._finished:
            status = self.cluster.status(self.job_id)
            if status is not None and status.summary.status in ("FAILED", "CANCELED"):
                raise BenchError(f"Weir job {self.job_id} {status.summary.status}: {status.failure}")
            self._finished = status is not None and status.summary.status == "FINISHED"
        return self._finished

    def ready(self) -> bool:
        """Every task of the job RUNNING."""
        status = self.cluster.status(self.job_id)
        return status is not None and bool(status.tasks) and all(t.state == "RUNNING" for t in status.tasks)

    def pids(self) -> dict[str, int]:
        return self.cluster.process_pids()

    def stop(self, sampler: ProcessSampler) -> None:
        """Cancel the job if it still runs, then stop its cluster (once)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if not self._finished:
                self.cluster.cancel(self.job_id)
        finally:
            self.cluster.stop()


def create_window_table(endpoints: Endpoints, table: str) -> None:
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(
            f"CREATE TABLE {table} (key text, window_start bigint, window_end bigint, count bigint, sum bigint, "
            "PRIMARY KEY (key, window_start))"
        )


def drop_tables(endpoints: Endpoints, tables: list[str], job_ids: list[str]) -> None:
    """Drop the run's tables, first rolling back the transactions its (cancelled) jobs' two-phase sinks
    left prepared: a prepared transaction holds its row locks until someone ends it."""
    if not tables:
        return
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall():
            if any(job_id in gid for job_id in job_ids):
                conn.execute(psycopg.sql.SQL("ROLLBACK PREPARED {}").format(psycopg.sql.Literal(gid)))
        conn.execute("SET lock_timeout = '30s'")
        for table in tables:
            try:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
            except psycopg.errors.LockNotAvailable:
                log(f"table {table} is still locked by another transaction: not dropped")


def table_results(endpoints: Endpoints, table: str) -> list[dataset.WindowResult]:
    """The window results the PostgreSQL sink committed, as whole records (the sentinels' left out)."""
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(
            f"SELECT key, window_start, window_end, count, sum FROM {table} WHERE key NOT LIKE 'end-%'"
        ).fetchall()
    return [(str(k), int(ws), int(we), int(c), int(t)) for k, ws, we, c, t in rows]


# Quix Streams and the raw limit: three processes each --------------------------------------------------------


@dataclass
class ProcessGroupContender:
    key: str
    label: str
    module: str  # bench.quix_app, bench.raw_worker, bench.ceiling_worker, or FLINK_MODULE
    sinks: str
    guarantee: str
    endpoints: Endpoints
    work_dir: Path
    run_id: str
    reads_only: bool = False  # the ceiling: no output, its check is the count of input records read
    checkpoint_uri: str = ""  # Flink: the run's checkpoint prefix (s3://bucket/bench-<run id>), as Weir's

    def start(self, topics: Topics, *, bounded: bool, tag: str) -> ProcessGroupRunning:
        group = f"bench-{self.run_id}-{tag}"
        logs = self.work_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        environ = flink_environment(flink_build_dir(), self.endpoints) if self.module == FLINK_MODULE else None
        procs = []
        for index, argv in enumerate(self.argvs(topics, bounded=bounded, tag=tag, group=group)):
            with open(logs / f"{tag}-{index}.log", "ab") as err:
                procs.append(
                    subprocess.Popen(
                        argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1, env=environ
                    )
                )
        ends = dataset.end_offsets(self.endpoints, topics.input) if bounded else {}
        uses_group = self.module == "bench.quix_app"
        # Flink commits its source offsets to the group after a checkpoint, apart from the sink's
        # transactions: only its exit (after the final checkpoint) says the output is all committed.
        done_on_exit = self.module in (FLINK_MODULE, "bench.ceiling_worker")
        return ProcessGroupRunning(
            self.key, self.endpoints, group, topics.input, procs, ends, bounded, uses_group, done_on_exit
        )

    def argvs(self, topics: Topics, *, bounded: bool, tag: str, group: str) -> list[list[str]]:
        """The command line of each of the contender's processes."""
        bootstrap = self.endpoints.kafka_bootstrap
        if self.module == FLINK_MODULE:
            return [
                flink_argv(
                    flink_build_dir(),
                    bootstrap=bootstrap,
                    input_topic=topics.input,
                    output_topic=topics.output,
                    group=group,
                    checkpoint_uri=flink_checkpoint_uri(self.checkpoint_uri, self.work_dir, tag),
                    bounded=bounded,
                    parallelism=WORKERS,
                )
            ]
        out = []
        for index in range(WORKERS):
            argv = [sys.executable, "-m", self.module, "--bootstrap", bootstrap, "--input", topics.input]
            if self.module != "bench.ceiling_worker":
                argv += ["--output", topics.output]
            argv += ["--group", group]
            if self.module in ("bench.raw_worker", "bench.ceiling_worker"):
                argv += ["--index", str(index), "--of", str(WORKERS), "--partitions", str(dataset.PARTITIONS)]
                if bounded and self.module == "bench.raw_worker":
                    argv.append("--bounded")
            else:
                argv += ["--state-dir", str(self.work_dir / "quix-state" / tag / str(index))]
            out.append(argv)
        return out


class ProcessGroupRunning:
    def __init__(
        self,
        key: str,
        endpoints: Endpoints,
        group: str,
        input_topic: str,
        procs: list[subprocess.Popen[str]],
        ends: dict[int, int],
        bounded: bool,
        uses_group: bool,
        done_on_exit: bool = False,
    ) -> None:
        self.key = key
        self._endpoints = endpoints
        self._group = group
        self._input = input_topic
        self._procs = procs
        self._ends = ends
        self._bounded = bounded
        self._counts = [0] * len(procs)
        self._finished = [False] * len(procs)
        self._ready = [False] * len(procs)
        self._uses_group = uses_group
        self._done_on_exit = done_on_exit
        self._last_offsets_check = 0.0
        self._complete = False
        self.reaped: dict[int, Reaped] = {}
        self._admin: Any = None
        self._readers = [
            threading.Thread(target=self._read, args=(i, p), daemon=True, name=f"{key}-{i}-stdout")
            for i, p in enumerate(procs)
        ]
        for r in self._readers:
            r.start()

    def _read(self, index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("@progress "):
                with contextlib.suppress(ValueError, IndexError):  # a torn line: the next one counts
                    self._counts[index] = int(line.split()[1])
            elif line.startswith("@ready"):
                self._ready[index] = True
            elif line.startswith("@done"):
                self._finished[index] = True

    def ready(self) -> bool:
        """Every worker started; a consumer group (Quix Streams) stable with all partitions assigned."""
        self._reap_exited()
        if not all(self._ready):
            return False
        if not self._uses_group:
            return True
        if self._admin is None:
            self._admin = dataset.quiet_admin(self._endpoints)
        try:
            return dataset.group_fully_assigned(self._admin, self._group, len(self._procs), dataset.PARTITIONS)
        except KafkaException:
            return False

    def progress(self) -> int:
        return sum(self._counts)

    def _reap_exited(self) -> None:
        for proc in self._procs:
            if proc.pid not in self.reaped:
                result = reap(proc)
                if result is not None:
                    self.reaped[proc.pid] = result
                    if result.exit_code != 0:
                        raise BenchError(
                            f"{self.key} worker pid {proc.pid} exited with {result.exit_code}; see its log"
                        )

    def done(self) -> bool:
        """Bounded runs: every input offset committed by the group (in the transactions that also
        hold the output), so every result is visible to read_committed consumers."""
        self._reap_exited()
        if self._complete or not self._bounded:
            return self._complete
        if len(self.reaped) == len(self._procs):
            self._complete = True  # the raw workers exit after their last commit, Flink after its final checkpoint
            return True
        if self._done_on_exit:
            return False
        now = time.monotonic()
        if now - self._last_offsets_check < 0.2:
            return False
        self._last_offsets_check = now
        with contextlib.suppress(KafkaException):  # the group may not exist yet
            if self._admin is None:
                self._admin = dataset.quiet_admin(self._endpoints)
            committed = dataset.committed_offsets(self._admin, self._group, self._input)
            self._complete = all(committed.get(p, -1) >= end for p, end in self._ends.items())
        return self._complete

    def pids(self) -> dict[str, int]:
        return {f"{self.key}-{i}": p.pid for i, p in enumerate(self._procs) if p.pid not in self.reaped}

    def stop(self, sampler: ProcessSampler) -> None:
        """SIGTERM what still runs (Quix commits and leaves its group), then reap every worker with
        its exact CPU time and peak RSS."""
        for proc in self._procs:
            if proc.pid not in self.reaped:
                exited = reap(proc)
                if exited is not None:
                    self.reaped[proc.pid] = exited
                    continue
                # os.kill, not proc.send_signal: that polls first, and a poll() reaps a child that
                # has just exited without its rusage (wait4 would then find no child)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for index, proc in enumerate(self._procs):
            result = self.reaped.get(proc.pid) or reap(proc, timeout_s=60)
            if result is None:
                log(f"{self.key} worker {proc.pid} ignored SIGTERM for 60 s: killing it")
                os.kill(proc.pid, signal.SIGKILL)  # not proc.kill(): see above
                result = reap(proc, timeout_s=10)
            if result is not None:
                self.reaped[proc.pid] = result
                sampler.final(f"{self.key}-{index}", proc.pid, result.cpu_s, result.peak_rss_bytes)
        for r in self._readers:
            r.join(5)


def quix_contender(endpoints: Endpoints, work_dir: Path, run_id: str) -> ProcessGroupContender:
    return ProcessGroupContender(
        key="quix",
        label="Quix Streams 3.28.1",
        module="bench.quix_app",
        sinks="Kafka (transactions)",
        guarantee="exactly-once (commit every 1 s)",
        endpoints=endpoints,
        work_dir=work_dir,
        run_id=run_id,
    )


def raw_contender(endpoints: Endpoints, work_dir: Path, run_id: str) -> ProcessGroupContender:
    return ProcessGroupContender(
        key="raw",
        label="raw Python limit",
        module="bench.raw_worker",
        sinks="Kafka (transactions)",
        guarantee="exactly-once output, state not recoverable",
        endpoints=endpoints,
        work_dir=work_dir,
        run_id=run_id,
    )


def flink_contender(endpoints: Endpoints, work_dir: Path, run_id: str, checkpoint_uri: str) -> ProcessGroupContender:
    return ProcessGroupContender(
        key="flink",
        label=f"Apache Flink {FLINK_VERSION}",
        module=FLINK_MODULE,
        sinks="Kafka (transactions)",
        guarantee="exactly-once (checkpoints every 1 s, RocksDB, on the S3 server)",
        endpoints=endpoints,
        work_dir=work_dir,
        run_id=run_id,
        checkpoint_uri=checkpoint_uri,
    )


def ceiling_contender(endpoints: Endpoints, work_dir: Path, run_id: str) -> ProcessGroupContender:
    return ProcessGroupContender(
        key="ceiling",
        label="ceiling (bare consumer)",
        module="bench.ceiling_worker",
        sinks="none (reads only)",
        guarantee="none: reads the input, computes nothing",
        endpoints=endpoints,
        work_dir=work_dir,
        run_id=run_id,
        reads_only=True,
    )


def cache_dir(environ: dict[str, str] | None = None) -> Path:
    """``$WEIR_CACHE_DIR``, as deploy/local/lib.sh resolves it (default ~/.cache/weir)."""
    env = os.environ if environ is None else environ
    if env.get("WEIR_CACHE_DIR"):
        return Path(env["WEIR_CACHE_DIR"])
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "weir"


FLINK_SOURCES: Final = REPO_ROOT / "bench" / "flink"


def flink_sources_hash(sources: Path = FLINK_SOURCES) -> str:
    """The version of bench/flink's sources, as bench/flink/build.sh names its build folder: 12 hex
    digits of the sha256 of ``<sha256 of the file>  <path>`` lines (sha256sum's), one per file of
    pom.xml and src/, sorted bytewise."""
    files = [sources / "pom.xml", *(p for p in (sources / "src").rglob("*") if p.is_file())]
    relative = sorted((p.relative_to(sources).as_posix() for p in files), key=lambda r: r.encode())
    listing = "".join(f"{hashlib.sha256((sources / r).read_bytes()).hexdigest()}  {r}\n" for r in relative)
    return hashlib.sha256(listing.encode()).hexdigest()[:12]


def flink_build_dir(environ: dict[str, str] | None = None, sources: Path = FLINK_SOURCES) -> Path:
    """Where bench/flink/build.sh puts the job's jar, its lib/ and plugins/: a folder per version of
    the sources, so that two checkouts on one machine do not overwrite each other's build."""
    return cache_dir(environ) / "bench" / "flink" / flink_sources_hash(sources)


def flink_checkpoint_uri(run_checkpoints: str, work_dir: Path, tag: str) -> str:
    """Where a Flink run checkpoints: under the run's checkpoint prefix (the S3 server Weir's
    checkpoints go to, deleted with the run's), else a local directory of the run."""
    if run_checkpoints:
        return f"{run_checkpoints.rstrip('/')}/flink/{tag}"
    return f"file://{work_dir / 'flink-checkpoints' / tag}"


AWS_CREDENTIAL_VARIABLES: Final = (
    "AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def flink_s3_problem(checkpoint_uri: str, endpoints: Endpoints, environ: Mapping[str, str]) -> str | None:
    """Why Flink could not write its checkpoints to ``checkpoint_uri``, found before any run: an
    ``s3://`` prefix with neither an S3 endpoint (the local mode's server, or ``WEIR_S3_ENDPOINT``) nor
    any AWS credential in the environment. Flink would start, process its input and then fail every
    run at the bounded input's final checkpoint ("Failure to finalize checkpoint"), after minutes."""
    if not checkpoint_uri.startswith("s3://") or endpoints.s3_endpoint is not None:
        return None
    if any(environ.get(name) for name in AWS_CREDENTIAL_VARIABLES):
        return None  # AWS's own endpoint, through the environment's credential chain
    return (
        f"Flink's checkpoints go to {checkpoint_uri} but no S3 endpoint is set (WEIR_S3_ENDPOINT, or "
        "WEIR_LOCAL_MODE=true for the local server, as make sets it) and no AWS credentials are in the "
        "environment: run it through make (make bench, make bench-nexmark), or set one of them"
    )


def flink_environment(build_dir: Path, endpoints: Endpoints, base: dict[str, str] | None = None) -> dict[str, str]:
    """The JVM's environment: Flink's plugins folder (the S3 file system) and the S3 server's address
    and static keys as Weir has them (read by weir.bench.BenchConf; in the environment, not on the
    command line). What Weir leaves unset (outside the local mode: AWS's endpoint, boto3's credential
    chain) is not set for the JVM either: its S3 plugin takes the AWS chain of the environment."""
    environ = dict(os.environ if base is None else base)
    environ["FLINK_PLUGINS_DIR"] = str(build_dir / "plugins")
    if endpoints.s3_endpoint is not None:
        environ["WEIR_S3_ENDPOINT"] = endpoints.s3_endpoint
    if endpoints.s3_access_key is not None and endpoints.s3_secret_key is not None:
        environ["WEIR_S3_ACCESS_KEY"] = endpoints.s3_access_key
        environ["WEIR_S3_SECRET_KEY"] = endpoints.s3_secret_key.get_secret_value()
    return environ


def flink_argv(
    build_dir: Path,
    *,
    bootstrap: str,
    input_topic: str,
    output_topic: str,
    group: str,
    checkpoint_uri: str,
    bounded: bool,
    parallelism: int,
    java: str = "java",
) -> list[str]:
    """The JVM running the Flink job on its MiniCluster (JVM defaults for the heap, as a user's
    ``java -cp`` would have them)."""
    argv = [
        java,
        "-cp",
        f"{build_dir / 'weir-bench-flink.jar'}:{build_dir / 'lib'}/*",
        FLINK_MAIN,
        "--bootstrap",
        bootstrap,
        "--input",
        input_topic,
        "--output",
        output_topic,
        "--group",
        group,
        "--checkpoint-uri",
        checkpoint_uri,
        "--parallelism",
        str(parallelism),
    ]
    if bounded:
        argv.append("--bounded")
    return argv


def flink_available() -> str | None:
    """None when the Flink job is built (bench/flink/build.sh first, as ``make bench-deps`` does:
    it builds only when the jar is missing or older than the sources), else the reason it cannot run."""
    if shutil.which("java") is None:
        return "java not found (Java 17 is needed for the Flink contender)"
    built = flink_build_dir()
    if shutil.which("mvn") is not None:
        # a no-op when the jar is newer than bench/flink's sources; waits for a build under way
        result = subprocess.run([str(FLINK_BUILD)], capture_output=True, text=True, timeout=1800, check=False)
        if result.returncode != 0:
            lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
            return f"bench/flink/build.sh failed: {lines[-1] if lines else result.returncode}"
    complete = all((built / part).is_file() for part in ("weir-bench-flink.jar", "lib/.complete", "plugins/.complete"))
    if not complete:
        return f"the Flink job is not built in {built} and mvn is not found (make bench-deps builds it)"
    return None


def quix_available() -> str | None:
    """None when quixstreams 3.28.1 imports here, else the reason it does not."""
    probe = subprocess.run(
        [sys.executable, "-c", "import quixstreams; print(quixstreams.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit code {probe.returncode}"
    version = probe.stdout.strip()
    return None if version == "3.28.1" else f"quixstreams {version} is installed, the benchmark pins 3.28.1"


def describe(contender: Any) -> dict[str, str]:
    return {"key": contender.key, "label": contender.label, "sinks": contender.sinks, "guarantee": contender.guarantee}
