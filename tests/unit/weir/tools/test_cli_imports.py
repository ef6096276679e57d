"""What ``weir --help`` and ``weir test`` import: each command imports the libraries it uses when it
runs, so neither pays for the gRPC client, Arrow, the S3, Kafka admin or SQL libraries, or RocksDB.
Each case runs the command in a new interpreter and reads ``sys.modules`` after it: a module-level
import that brings one of them back fails here (a check of the import set, not of the time it takes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[4]

RUN = """
import json, sys
from weir.tools.cli import run_cli
code = run_cli(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""

NOT_FOR_ANY_OF_THEM = (
    "grpc",  # the JobManager's client: the commands that call it
    "weir.tools.client",
    "boto3",  # S3: checkpoint storage, the file sink
    "botocore",
    "sqlglot",  # weir sql
    "pyarrow",  # the columnar path: a job that makes record batches
    "numpy",
    "rocksdict",  # RocksDB: the TaskManager's state, reference mode
    "weir.taskmanager.state",
    "weir.jobmanager",
    "psycopg",  # PostgreSQL: a sink or CDC source that talks to the server (weir test's never does)
    "weir.connectors.postgres",
)
NOT_FOR_HELP = (
    *NOT_FOR_ANY_OF_THEM,
    "weir.api",  # the job API: commands that load a job
    "weir.operators",
    "confluent_kafka",
    "structlog",
    "prometheus_client",
    "weir.wire",  # the plan's in-flight state format: commands that plan a job
    "google.protobuf",
)

KAFKA_JOB = """
import json
from weir.api import Environment


def build(env: Environment) -> None:
    events = env.from_kafka("events", uid="events", deserializer=json.loads)
    totals = events.key_by(lambda e: e["key"]).reduce(lambda a, b: {**b, "n": a.get("n", 1) + 1}, uid="totals")
    totals.sink_to_kafka("totals", uid="sink")
    totals.sink_to_postgres(
        "totals", uid="table", columns=("key", "n"), key_columns=("key",), row=lambda t: (t["key"], t.get("n", 1))
    )
"""


def imported_by(tmp_path: Path, *argv: str) -> set[str]:
    """The modules loaded once ``weir ARGV`` ran in a new interpreter (which must exit 0)."""
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(out), *argv],
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "WEIR_LOCAL_MODE": "true", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(out.read_text())
    assert found["code"] == 0, done.stdout + done.stderr
    return set(found["modules"])


def loaded(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


@pytest.mark.parametrize("argv", [("--help",), ("test", "--help")], ids=["weir --help", "weir test --help"])
def test_help_imports_no_client_job_api_or_connector_library(tmp_path: Path, argv: tuple[str, ...]) -> None:
    modules = imported_by(tmp_path, *argv)
    assert "typer" in modules and "weir.tools.cli" in modules  # the check reads a real run's modules
    assert loaded(modules, NOT_FOR_HELP) == []


def test_weir_test_imports_the_job_api_but_no_client_arrow_s3_sql_rocksdb_or_postgres_driver(tmp_path: Path) -> None:
    """Over a job with a Kafka source, a Kafka sink and a PostgreSQL sink: the sinks are built (their
    operators' modules imported), none talks to its server, so psycopg stays out."""
    job = tmp_path / "job.py"
    job.write_text(KAFKA_JOB)
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"key": f"k{i % 3}"}) + "\n" for i in range(30)))
    modules = imported_by(
        tmp_path, "test", str(job), "--source", f"events={events}", "--failures", "--checkpoint-every", "5"
    )
    assert "weir.api" in modules and "weir.tools.jobtest" in modules  # the job ran through the job API
    assert loaded(modules, NOT_FOR_ANY_OF_THEM) == []


SQL_SCRIPT = """
CREATE TABLE events (key STRING) WITH ('connector' = 'kafka', 'topic' = 'events', 'format' = 'json');
CREATE TABLE totals (key STRING, n BIGINT, PRIMARY KEY (key) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://localhost:5432/weir', 'table-name' = 'totals');
INSERT INTO totals SELECT key, COUNT(*) FROM events GROUP BY key;
"""


def test_weir_test_of_a_sql_script_imports_the_sql_parser_but_no_client_s3_rocksdb_or_postgres_driver(
    tmp_path: Path,
) -> None:
    """A script is planned, so the SQL parser is imported (the case above keeps it out of a Python
    job's test); what a script's job does not run stays out as for a job file."""
    script = tmp_path / "totals.sql"
    script.write_text(SQL_SCRIPT)
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"key": f"k{i % 3}"}) + "\n" for i in range(30)))
    modules = imported_by(
        tmp_path, "test", str(script), "--source", f"events={events}", "--failures", "--checkpoint-every", "5"
    )
    assert "sqlglot" in modules and "weir.tools.jobtest" in modules  # the script planned, then run as a job
    assert loaded(modules, tuple(m for m in NOT_FOR_ANY_OF_THEM if m != "sqlglot")) == []
