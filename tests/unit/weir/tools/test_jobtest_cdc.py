"""``weir test`` over a job whose source is the PostgreSQL CDC source: the change events given as test
data, played as the source delivers them (the snapshot's reads chunk by chunk, then whole
transactions), checkpointed in the source's own state and replayed from the checkpointed position
after every failure. No database is reached."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from weir.connectors import postgres, postgres_cdc
from weir.core.cdc import ChangeEvent, Phase, decode_cdc_state
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.core.errors import JobDefinitionError
from weir.core.keygroups import KeyGroup, KeyGroupRange
from weir.operators.base import OperatorContext
from weir.testing import run_job
from weir.tools.cdc_input import CdcInput, CdcInputError, read_change_events
from weir.tools.cdc_replay import ReplayCdcSource
from weir.tools.cli import app, run_cli
from weir.tools.jobtest import (
    Deserialized,
    FailurePoint,
    JobTestError,
    SourceLines,
    check_job,
    records_of_lines,
    run_once,
)
from weir.tools.jobtest import (
    Phase as FailurePhase,
)

TABLE = "public.customers"
READS = 7
CHUNK = 3  # the job's chunk_size: the 7 reads come in 3 polls (3, 3, 1 rows)


def changes() -> list[dict[str, Any]]:
    """The input: 7 rows read, then 12 transactions of one to three changes (inserts, updates,
    deletes, a key updated twice in one transaction), with commit times."""
    out: list[dict[str, Any]] = [
        {"op": "read", "table": "customers", "after": {"id": i, "name": f"c{i}"}} for i in range(READS)
    ]
    xid, lsn = 100, 0x100
    for t in range(12):
        xid += 1
        batch: list[dict[str, Any]] = []
        key = t % READS
        match t % 4:
            case 0:
                batch = [{"op": "insert", "after": {"id": 100 + t, "name": f"new{t}"}}]
            case 1:
                batch = [
                    {"op": "update", "before": None, "after": {"id": key, "name": f"u{t}"}},
                    {"op": "update", "before": None, "after": {"id": key, "name": f"u{t}b"}},
                ]
            case 2:
                batch = [
                    {"op": "delete", "before": {"id": key}},
                    {"op": "insert", "after": {"id": key, "name": "back"}},
                ]
            case _:
                batch = [
                    {"op": "insert", "after": {"id": 200 + t, "name": "x"}},
                    {"op": "delete", "before": {"id": 200 + t}},
                    {"op": "update", "before": None, "after": {"id": 100 + t - 3, "name": "y"}},
                ]
        for change in batch:
            lsn += 8
            out.append({**change, "table": TABLE, "xid": xid, "lsn": f"0/{lsn:X}", "ts_ms": 10_000 + 100 * t})
    for document in out[:READS]:
        document["lsn"] = "0/100"
    return out


def change_lines() -> list[bytes]:
    return [json.dumps(d).encode() for d in changes()]


def given() -> CdcInput:
    return read_change_events(change_lines(), "test input")


# The replayed source alone -------------------------------------------------------------------------------


class Collect:
    def __init__(self) -> None:
        self.records: list[tuple[ChangeEvent, int | None]] = []

    def emit(self, value: Any, timestamp: int | None) -> None:
        self.records.append((value, timestamp))

    def emit_watermark(self, watermark: int) -> None:
        raise AssertionError("the CDC source emits no watermarks")


SPEC = PostgresCdcSourceSpec(tables=("customers",), slot_name="customers_cdc", publication="p", chunk_size=CHUNK)


def replay(out: Collect, state: bytes | None = None) -> ReplayCdcSource:
    source = ReplayCdcSource(SPEC, "cdc", given())
    ctx = OperatorContext("job", "job", "cdc", 0, 1, 128, 0, KeyGroupRange(KeyGroup(0), KeyGroup(127)), {}, None)
    source.setup(ctx, out)
    if state is not None:
        source.restore_state(state)
    source.open()
    return source


def play_to_end(source: ReplayCdcSource) -> int:
    polls = 0
    while source.poll(1):
        polls += 1
    return polls


def test_the_source_plays_the_reads_chunk_by_chunk_then_each_transaction_per_poll() -> None:
    out = Collect()
    source = replay(out)
    polls = []
    while True:
        before = len(out.records)
        more = source.poll(1)
        polls.append([e.op.value for e, _ in out.records[before:]])
        if not more:
            break
    expected = given()
    assert polls[:3] == [["read"] * 3, ["read"] * 3, ["read"]]
    assert polls[3:-1] == [[e.op.value for e in t.changes] for t in expected.transactions]
    assert polls[-1] == []  # the given changes ended: the source ends
    stamps = [ts for _, ts in out.records]
    assert stamps == [None] * READS + [t.commit_ms for t in expected.transactions for _ in t.changes]
    assert tuple(e for e, _ in out.records) == expected.events


def test_a_restore_after_any_poll_resumes_at_the_checkpointed_position_each_event_once() -> None:
    """For every poll k: checkpoint after it, restore a new source from that state, play to the end:
    what the first emitted before the checkpoint and the second after it is every event exactly once,
    in order. The state is the CDC source's own (docs/formats.md), in the snapshot phase while
    chunks remain, then streaming at the last emitted transaction's position."""
    everything = given().events
    total_polls = 3 + len(given().transactions)
    for k in range(total_polls + 1):
        first = Collect()
        source = replay(first)
        for _ in range(k):
            assert source.poll(1)
        state = source.snapshot_state(1)
        assert state is not None
        decoded = decode_cdc_state(state, SPEC.slot_name)
        if k < 3:
            assert decoded.phase is Phase.SNAPSHOT and len(decoded.chunks) == k
        else:
            assert decoded.phase is Phase.STREAMING
            assert decoded.position == (given().transactions[k - 4].commit_end if k > 3 else given().consistent_point)
        after = Collect()
        play_to_end(replay(after, state))
        replayed = [e for e, _ in first.records] + [e for e, _ in after.records]
        assert Counter(map(repr, replayed)) == Counter(map(repr, everything)), k
        assert tuple(replayed) == everything, k


def test_a_change_of_a_table_the_source_does_not_capture_is_refused() -> None:
    stray = read_change_events([b'{"op": "insert", "table": "orders", "after": {"id": 1}}'], "test input")
    with pytest.raises(CdcInputError, match="change event of table 'public.orders', which the source does not capture"):
        ReplayCdcSource(SPEC, "cdc", stray)


# A job under weir test -----------------------------------------------------------------------------------

JOB = f"""
from weir.api import ChangeOp, Delete, Environment

SEEN = {{}}


def copy_change(event):
    if event.op is ChangeOp.DELETE:
        return Delete((event.row["id"],))
    return (event.row["id"], event.row["name"])


def changes(env):
    return env.from_postgres_cdc(["customers"], uid="cdc", slot_name="customers_cdc", chunk_size={CHUNK})


def count_changes(acc, event):
    return {{**event, "n": acc["n"] + 1}}
"""

COPY_AND_COUNT = """
def build(env: Environment) -> None:
    by_id = changes(env).key_by(lambda e: e.row["id"])
    by_id.sink_to_postgres("customers_copy", uid="copy", columns=("id", "name"), key_columns=("id",), row=copy_change)
    counted = by_id.map(lambda e: {"id": e.row["id"], "op": e.op.value, "n": 1}, uid="ops").key_by(
        lambda c: c["id"]).reduce(count_changes, uid="count")
    counted.sink_to_kafka("counts", uid="counts-sink")
"""

GLOBAL_COUNT = """
def number(e):
    SEEN[e.row["id"]] = SEEN.get(e.row["id"], 0) + 1
    return {"id": e.row["id"], "op": e.op.value, "n": SEEN[e.row["id"]]}


def build(env: Environment) -> None:
    changes(env).map(number, uid="ops").sink_to_kafka("counts", uid="counts-sink")
"""


@pytest.fixture(autouse=True)
def no_database(monkeypatch: pytest.MonkeyPatch) -> None:
    """``weir test`` never connects anything: a connection or a slot call fails the test."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("weir test tried to reach PostgreSQL")

    monkeypatch.setattr(postgres, "connect", refuse)
    for name in ("captured_tables", "slot_found", "create_slot", "ChangeReader", "ChunkReader"):
        monkeypatch.setattr(postgres_cdc, name, refuse)


def job(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "cdc_job.py"
    path.write_text(JOB + body)
    return path


def expected_table() -> dict[int, str]:
    table: dict[int, str] = {}
    for d in changes():
        row = d.get("after") or d["before"]
        if d["op"] == "delete":
            del table[row["id"]]
        else:
            table[row["id"]] = row["name"]
    return table


def expected_counts() -> Counter[str]:
    """Per row id, each change numbered 1, 2, ... in order: the counts sink's records, whole."""
    seen: Counter[int] = Counter()
    out: Counter[str] = Counter()
    for d in changes():
        row = d.get("after") or d["before"]
        seen[row["id"]] += 1
        out[json.dumps({"id": row["id"], "op": d["op"], "n": seen[row["id"]]}, sort_keys=True)] += 1
    return out


def test_a_cdc_job_commits_each_change_once_whatever_fails(tmp_path: Path) -> None:
    path = job(tmp_path, COPY_AND_COUNT)
    report = check_job(path, {"cdc": SourceLines(tuple(change_lines()), "test")}, failures=True, checkpoint_every=2)
    assert report.ok, [d.describe() for d in report.divergences]
    clean = report.reference
    table = clean.sink_capture("copy").final_rows()
    assert table == {(k,): (k, v) for k, v in expected_table().items()}
    counts = Counter(json.dumps(v, sort_keys=True) for v, _ in clean.by_operator["counts-sink"])
    assert counts == expected_counts()
    polls = 3 + len(given().transactions) + 1  # the chunks, the transactions, the poll that finds the end
    assert clean.checkpoints == polls // 2 + 1  # every 2 polls, and the final one
    assert report.runs == 2 + len(report.failure_points)
    assert {p.phase for p in report.failure_points} == set(FailurePhase)


def test_a_restored_run_replays_from_the_checkpointed_position_not_from_the_start(tmp_path: Path) -> None:
    """A failure after checkpoint 3 completed (6 polls: the 3 chunks of reads and 3 transactions):
    the restored source emits the transactions after the third, not the reads again; committed output
    is each change once."""
    path = job(tmp_path, COPY_AND_COUNT)
    inputs = {"cdc": SourceLines(tuple(change_lines()), "test")}
    point = FailurePoint(3, FailurePhase.AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT)
    run = run_once(path, inputs, checkpoint_every=2, failure=point)
    assert run.failure_hit
    source = run.by_operator["cdc"]
    emitted_before = READS + sum(len(t.changes) for t in given().transactions[:3])
    assert [e for e, _ in source[:emitted_before]] == list(given().events[:emitted_before])
    assert Counter(repr(e) for e, _ in source) == Counter(repr(e) for e in given().events)
    counts = Counter(json.dumps(v, sort_keys=True) for v, _ in run.by_operator["counts-sink"])
    assert counts == expected_counts()


def test_state_outside_managed_state_is_caught_at_its_operator_over_cdc_input(tmp_path: Path) -> None:
    report = check_job(
        job(tmp_path, GLOBAL_COUNT),
        {"cdc": SourceLines(tuple(change_lines()), "test")},
        failures=True,
        checkpoint_every=2,
    )
    assert not report.ok
    (divergence,) = report.divergences
    assert (divergence.operator, divergence.sink) == ("ops", "counts-sink")
    assert divergence.point == FailurePoint(1, FailurePhase.AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT)


def test_the_fixture_takes_change_events_as_python_values_and_as_json_lines(tmp_path: Path) -> None:
    path = job(tmp_path, COPY_AND_COUNT)
    events = list(given().events)
    as_values = run_job(path, records={"cdc": events}, checkpoint_every=2)
    as_lines = run_job(path, sources={"cdc": [line.decode() for line in change_lines()]}, checkpoint_every=2)
    assert Counter(map(repr, as_values.sinks["copy"])) == Counter(map(repr, events))
    assert as_values.sinks == as_lines.sinks
    assert as_lines.records("copy")[-1][1] == given().transactions[-1].commit_ms
    assert as_values.records("copy")[-1][1] is None  # Python values carry no commit time
    as_values.with_failures(rescale=3)  # the CDC source stays at parallelism 1, the rest runs at 3


def test_a_cdc_source_without_input_or_with_kafka_records_is_a_clear_error(tmp_path: Path) -> None:
    path = job(tmp_path, COPY_AND_COUNT)
    with pytest.raises(JobTestError, match="no input for postgres cdc source 'cdc': give --source cdc=CHANGES.jsonl"):
        run_once(path, {})
    with pytest.raises(JobTestError, match="source 'cdc' is a postgres cdc source: give change events, not Kafka"):
        run_once(path, {"cdc": records_of_lines([b"{}"])})
    with pytest.raises(CdcInputError, match=r"change event 1: a CDC source's input is ChangeEvent values, not 3"):
        run_once(path, {"cdc": Deserialized.of([3])})
    stray = r"input given for 'events', which is not a source of job 'cdc_job' \(its sources: cdc\)"
    with pytest.raises(JobTestError, match=stray):
        run_once(path, {"cdc": given(), "events": given()})


def test_kafka_and_generator_sources_refuse_change_events_and_input(tmp_path: Path) -> None:
    path = tmp_path / "kafka_job.py"
    path.write_text(
        "from weir.api import Environment\n"
        "def build(env: Environment) -> None:\n"
        "    numbers = env.from_collection([1], uid='numbers')\n"
        "    env.from_kafka('t', uid='events').union(numbers, uid='u').sink_to_kafka('o', uid='s')\n"
    )
    with pytest.raises(JobTestError, match="source 'events' is a Kafka source: give its record values, not change"):
        run_once(path, {"events": given()})
    with pytest.raises(JobTestError, match="source 'numbers' is a generator source: it takes no input"):
        run_once(path, {"events": records_of_lines([b"1"]), "numbers": records_of_lines([b"1"])})


def test_cli_runs_a_cdc_job_over_a_file_of_change_events(tmp_path: Path) -> None:
    events = tmp_path / "changes.jsonl"
    events.write_bytes(b"\n".join(change_lines()) + b"\n")
    out = tmp_path / "out"
    args = ["test", str(job(tmp_path, COPY_AND_COUNT)), "--source", f"cdc={events}", "--failures"]
    result = CliRunner().invoke(app, [*args, "--checkpoint-every", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "every failure run committed what the failure-free run did" in result.output
    written = (out / "counts-sink.jsonl").read_text().splitlines()
    counts = Counter(json.dumps(json.loads(line)["value"], sort_keys=True) for line in written)
    assert counts == expected_counts()


def test_cli_bad_change_events_exit_2_naming_file_and_event(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = tmp_path / "changes.jsonl"
    events.write_bytes(
        b'{"op": "insert", "table": "customers", "after": {"id": 1}}\n'
        b'{"op": "read", "table": "customers", "after": {"id": 2}}\n'
    )
    assert run_cli(["test", str(job(tmp_path, COPY_AND_COUNT)), "--source", f"cdc={events}"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"weir: error: source 'cdc' ({events}), change event 2 is a read after a change")


SQL_JOB = '''
from weir.sql import sql

SCRIPT = """CREATE TABLE accounts (id BIGINT, owner STRING, balance BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'postgres-cdc', 'hostname' = '127.0.0.1', 'port' = '15432', 'username' = 'weir',
        'password' = 'weir', 'database-name' = 'weir', 'table-name' = 'accounts', 'slot.name' = 'accounts_sql');
CREATE TABLE totals (owner STRING, n BIGINT, total BIGINT, PRIMARY KEY (owner) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://localhost:5432/weir', 'table-name' = 'totals');
INSERT INTO totals SELECT owner, COUNT(*), SUM(balance) FROM accounts GROUP BY owner;
"""


def build(env):
    sql(env, SCRIPT)
'''


def account_changes() -> list[dict[str, Any]]:
    """Accounts read, then moved between owners, their balances changed, some deleted (REPLICA
    IDENTITY FULL: every update and delete has the whole old row)."""
    rows = {i: {"id": i, "owner": f"o{i % 3}", "balance": i} for i in range(9)}
    out: list[dict[str, Any]] = [{"op": "read", "table": "accounts", "after": dict(r)} for r in rows.values()]
    for t in range(30):
        key = (t * 5) % 12
        old = rows.get(key)
        if old is None:
            rows[key] = {"id": key, "owner": f"o{t % 4}", "balance": t}
            out.append({"op": "insert", "table": "accounts", "after": dict(rows[key])})
        elif t % 4 == 3:
            out.append({"op": "delete", "table": "accounts", "before": rows.pop(key)})
        else:
            rows[key] = {**old, "owner": f"o{(t + key) % 4}", "balance": old["balance"] + t}
            out.append({"op": "update", "table": "accounts", "before": old, "after": dict(rows[key])})
    return out


def test_a_sql_job_over_a_postgres_cdc_table_keeps_its_totals_exact_whatever_fails(tmp_path: Path) -> None:
    """The SQL connector's changelog (each update as -U/+U, a key's changes in order) through a
    retracting GROUP BY into an upserted table: its final rows are those of plain Python over the
    final accounts, with a failure at every point and restored at parallelism 3."""
    path = tmp_path / "sql_job.py"
    path.write_text(SQL_JOB)
    changes = account_changes()
    inputs = {"sql-source-accounts": SourceLines(tuple(json.dumps(c).encode() for c in changes), "test")}
    report = check_job(path, inputs, failures=True, checkpoint_every=4, rescale=3)
    assert report.ok, [d.describe() for d in report.divergences]
    final: dict[int, dict[str, Any]] = {}
    for c in changes:
        if c["op"] == "delete":
            del final[c["before"]["id"]]
        else:
            final[c["after"]["id"]] = c["after"]
    totals: dict[str, tuple[int, int]] = {}
    for row in final.values():
        n, total = totals.get(row["owner"], (0, 0))
        totals[row["owner"]] = (n + 1, total + row["balance"])
    (sink,) = report.reference.sinks
    table = report.reference.sink_capture(sink).final_rows()
    assert table == {(owner,): (owner, n, total) for owner, (n, total) in totals.items()}


PARALLEL_SNAPSHOT = f"""
def changes(env):  # a parallel snapshot in a cluster
    return env.from_postgres_cdc(["customers"], uid="cdc", slot_name="customers_cdc", chunk_size={CHUNK}, parallelism=2)
"""


def test_a_parallel_snapshot_source_is_played_as_one_reader_and_refuses_rescale(tmp_path: Path) -> None:
    """A CDC source given parallelism=2 (a parallel snapshot in a cluster) is played as one reader:
    every event once, what the job commits unchanged by failures; --rescale, which would restore it
    at its own parallelism, is refused in one line."""
    path = job(tmp_path, PARALLEL_SNAPSHOT + COPY_AND_COUNT)
    inputs = {"cdc": SourceLines(tuple(change_lines()), "test")}
    report = check_job(path, inputs, failures=True, checkpoint_every=2)
    assert report.ok, [d.describe() for d in report.divergences]
    counts = Counter(json.dumps(v, sort_keys=True) for v, _ in report.reference.by_operator["counts-sink"])
    assert counts == expected_counts()
    with pytest.raises(JobDefinitionError, match="weir test plays a CDC source as one reader, and --rescale would"):
        check_job(path, inputs, failures=True, checkpoint_every=2, rescale=3)
