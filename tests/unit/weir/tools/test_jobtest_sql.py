"""``weir test SCRIPT.sql``: a SQL script run in this process as the job ``weir sql`` submits for it,
its tables' sources fed from files (named by table or by source uid), its sinks captured per sink
uid, and with ``--failures`` a failure at every checkpoint and crash point leaving each sink's
committed output as plain Python computes it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from weir.core.errors import CommandLineError
from weir.sql import SqlError, operators_of, plan_script
from weir.sql.types import timestamp_text
from weir.tools.cli import app, run_cli
from weir.tools.sql_job import script_sources

ROOT = Path(__file__).resolve().parents[4]
SCRIPT = ROOT / "examples" / "sql" / "orders.sql"
ORDERS = ROOT / "examples" / "sql" / "orders.jsonl"
MINUTE_MS = 60_000
EPOCH_2024_MS = 1_704_067_200_000  # 2024-01-01 00:00:00 UTC, where the example's orders start


def orders() -> list[dict[str, Any]]:
    """The example's orders, their times as epoch milliseconds."""
    found = []
    for line in ORDERS.read_text().splitlines():
        order = json.loads(line)
        minutes, seconds = order["ts"].removeprefix("2024-01-01 00:").removesuffix(".000").split(":")
        found.append({**order, "ts": EPOCH_2024_MS + (int(minutes) * 60 + int(seconds)) * 1000})
    return found


def sink_uid(script: str, table: str) -> str:
    """The uid of the sink operator writing ``table`` (as ``weir sql --explain`` prints it)."""
    planned = plan_script(script)
    (uid,) = (
        op.uid
        for statement in planned.inserts
        if statement.insert.sink == table
        for op in operators_of(statement, script)
        if op.kind == "sink"
    )
    return uid


def committed(out: Path, uid: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / f"{uid}.jsonl").read_text().splitlines()]


def whole(record: Any) -> str:
    return json.dumps(record, sort_keys=True)


# The tables a script reads -------------------------------------------------------------------------


def test_the_sources_are_the_tables_the_inserts_read_by_name_or_uid() -> None:
    sources = script_sources(SCRIPT.read_text(), "orders.sql")
    assert dict(sources.read) == {"orders": "sql-source-orders"}
    assert set(sources.tables) == {"orders", "orders_per_minute", "orders_per_user"}
    assert sources.uid_of("orders") == "sql-source-orders"
    assert sources.uid_of("sql-source-orders") == "sql-source-orders"


def test_a_table_not_in_the_script_is_one_line_naming_what_it_reads() -> None:
    sources = script_sources(SCRIPT.read_text(), "orders.sql")
    with pytest.raises(CommandLineError) as refused:
        sources.uid_of("payments")
    assert str(refused.value) == (
        "--source payments: orders.sql has no table payments (the tables it reads: orders (sql-source-orders))"
    )
    with pytest.raises(CommandLineError, match="no table sql-source-payments"):
        sources.uid_of("sql-source-payments")


def test_a_table_the_script_only_writes_takes_no_input() -> None:
    sources = script_sources(SCRIPT.read_text(), "orders.sql")
    with pytest.raises(CommandLineError) as refused:
        sources.uid_of("orders_per_user")
    assert str(refused.value) == (
        "--source orders_per_user: table orders_per_user of orders.sql is not read by its INSERTs, so it takes "
        "no input (the tables it reads: orders (sql-source-orders))"
    )


def test_a_table_read_once_by_two_inserts_is_one_source() -> None:
    script = """
CREATE TABLE t (a BIGINT) WITH ('connector' = 'kafka', 'topic' = 't', 'format' = 'json');
CREATE TABLE g (n BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '5');
CREATE TABLE s (a BIGINT) WITH ('connector' = 'kafka', 'topic' = 's', 'format' = 'json');
INSERT INTO s SELECT a FROM t WHERE a > 0;
INSERT INTO s SELECT a + 1 FROM t;
INSERT INTO s SELECT n FROM g;
"""
    sources = script_sources(script, "two.sql")
    assert dict(sources.read) == {"t": "sql-source-t", "g": "sql-source-g"}


def test_an_upsert_kafka_table_is_refused_as_its_records_need_keys() -> None:
    script = """
CREATE TABLE users (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'upsert-kafka', 'topic' = 'users', 'key.format' = 'json', 'value.format' = 'json');
CREATE TABLE names (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://localhost:5432/weir', 'table-name' = 'names');
INSERT INTO names SELECT id, name FROM users;
"""
    sources = script_sources(script, "users.sql")
    for name in ("users", "sql-source-users"):
        with pytest.raises(CommandLineError) as refused:
            sources.uid_of(name)
        assert str(refused.value) == (
            f"--source {name}: table users of users.sql is an 'upsert-kafka' table, whose records need their key "
            "(the primary key): weir test feeds record values only"
        )


def test_a_script_weir_does_not_run_is_refused_with_its_position() -> None:
    with pytest.raises(SqlError, match=r"\d+:\d+"):
        script_sources("CREATE TABLE t (a BIGINT) WITH ('connector' = 'kafka', 'topic' = 't');\nSELECT * FROM;", "x")


# The command ---------------------------------------------------------------------------------------


def test_weir_test_runs_a_sql_aggregation_under_failures_and_commits_what_python_computes(tmp_path: Path) -> None:
    """Both sinks of the example exact after the failure matrix: the per-minute windows appended to
    Kafka, each once, and the per-user table (an updating GROUP BY) as its final rows."""
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "test",
            str(SCRIPT),
            "--source",
            f"orders={ORDERS}",
            "--failures",
            "--checkpoint-every",
            "5",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "test: every failure run committed what the failure-free run did" in result.output
    script = SCRIPT.read_text()
    by_minute: dict[tuple[str, int], tuple[int, int]] = {}
    by_user: dict[str, tuple[int, int]] = {}
    for order in orders():
        minute = order["ts"] - order["ts"] % MINUTE_MS
        n, total = by_minute.get((order["user"], minute), (0, 0))
        by_minute[order["user"], minute] = (n + 1, total + order["amount"])
        n, total = by_user.get(order["user"], (0, 0))
        by_user[order["user"]] = (n + 1, total + order["amount"])
    windows = committed(out, sink_uid(script, "orders_per_minute"))
    assert Counter(whole(w["value"]) for w in windows) == Counter(
        whole({"who": who, "minute": timestamp_text(minute), "orders": n, "total": total})
        for (who, minute), (n, total) in by_minute.items()
    )
    rows = committed(out, sink_uid(script, "orders_per_user"))
    final: dict[str, Any] = {}
    for row in rows:  # the table the upserts and deletes leave, per primary key
        if "delete" in row:
            final.pop(row["delete"]["who"], None)
        else:
            final[row["value"]["who"]] = row["value"]
    assert final == {who: {"who": who, "orders": n, "total": total} for who, (n, total) in by_user.items()}


def test_a_source_named_by_its_uid_runs_the_same(tmp_path: Path) -> None:
    by_name, by_uid = tmp_path / "name", tmp_path / "uid"
    for out, name in ((by_name, "orders"), (by_uid, "sql-source-orders")):
        result = CliRunner().invoke(app, ["test", str(SCRIPT), "--source", f"{name}={ORDERS}", "--out", str(out)])
        assert result.exit_code == 0, result.output
    assert sorted(p.name for p in by_name.iterdir()) == sorted(p.name for p in by_uid.iterdir())
    for path in by_name.iterdir():
        assert path.read_text() == (by_uid / path.name).read_text()


def test_a_source_given_by_name_and_by_uid_is_given_twice(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(["test", str(SCRIPT), "--source", f"orders={ORDERS}", "--source", f"sql-source-orders={ORDERS}"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        f"weir: error: --source sql-source-orders={ORDERS}: source 'sql-source-orders' is given twice"
    )


def test_a_table_not_in_the_script_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(["test", str(SCRIPT), "--source", f"payments={ORDERS}"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err == (
        f"weir: error: --source payments: {SCRIPT} has no table payments (the tables it reads: "
        "orders (sql-source-orders))\n"
    )


def test_a_table_read_without_input_is_one_line_naming_its_uid(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(["test", str(SCRIPT)])
    assert code == 2
    assert "no input for Kafka source 'sql-source-orders'" in capsys.readouterr().err


def test_a_state_bug_in_a_sql_job_s_python_function_is_caught_at_its_operator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scalar function the script declares (CREATE FUNCTION ... LANGUAGE PYTHON) that numbers the rows
    in a module global: a failure restarts the numbering, so the failure runs diverge, at the
    project that calls it."""
    (tmp_path / "numbering.py").write_text("SEQ = 0\n\n\ndef seq(x):\n    global SEQ\n    SEQ += 1\n    return SEQ\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    script = tmp_path / "numbered.sql"
    script.write_text(
        "CREATE FUNCTION seq AS 'numbering.seq' LANGUAGE PYTHON;\n"
        "CREATE TABLE orders (id BIGINT, `user` STRING)\n"
        "  WITH ('connector' = 'kafka', 'topic' = 'o', 'format' = 'json');\n"
        "CREATE TABLE numbered (id BIGINT, n BIGINT) WITH ('connector' = 'kafka', 'topic' = 'n', 'format' = 'json');\n"
        "INSERT INTO numbered SELECT id, seq(id) FROM orders;\n"
    )
    result = CliRunner().invoke(
        app, ["test", str(script), "--source", f"orders={ORDERS}", "--failures", "--checkpoint-every", "5"]
    )
    assert result.exit_code == 1, result.output
    assert "divergence at operator 'sql-" in result.output and "-project'" in result.output, result.output


def test_the_functions_a_script_calls_come_from_functions_as_weir_sql_takes_them(tmp_path: Path) -> None:
    functions = tmp_path / "pricing.py"
    functions.write_text("def with_tax(amount):\n    return amount * 6 // 5\n")
    script = tmp_path / "taxed.sql"
    script.write_text(
        "CREATE TABLE orders (id BIGINT, amount BIGINT)\n"
        "  WITH ('connector' = 'kafka', 'topic' = 'o', 'format' = 'json');\n"
        "CREATE TABLE taxed (id BIGINT, gross BIGINT) WITH ('connector' = 'kafka', 'topic' = 't', 'format' = 'json');\n"
        "INSERT INTO taxed SELECT id, with_tax(amount) FROM orders;\n"
    )
    out = tmp_path / "out"
    args = ["test", str(script), "--functions", str(functions), "--source", f"orders={ORDERS}", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--failures", "--checkpoint-every", "5"])
    assert result.exit_code == 0, result.output
    (written,) = out.iterdir()  # the one sink's
    rows = [json.loads(line) for line in written.read_text().splitlines()]
    assert Counter(whole(r["value"]) for r in rows) == Counter(
        whole({"id": o["id"], "gross": o["amount"] * 6 // 5}) for o in orders()
    )


def test_functions_are_for_a_sql_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.py"
    job.write_text("def build(env):\n    env.from_collection([1], uid='one').print(uid='out')\n")
    code = run_cli(["test", str(job), "--functions", str(job)])
    assert code == 2
    assert capsys.readouterr().err == (
        "weir: error: --functions FILE.py is for a SQL script: a job file imports its functions\n"
    )
