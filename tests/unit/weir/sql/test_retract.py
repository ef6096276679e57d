"""Retractions between SQL operators (weir.sql.changelog, weir.sql.retract): an aggregation of an
updating GROUP BY's result. Each job runs in this process (``weir_job``: the job's own operators and
checkpoints, no services), its upsert sink's final table (the upserts and deletes applied in order)
compared, as a multiset of whole rows, with what plain Python computes over the same input; the pure
decisions are tested on their own."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_run import ORDERS, orders
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir import nexmark as nx
from weir.sql import plan_script, source_uid
from weir.sql.changelog import RETRACT, WITH_DELETES, Change, RowKind, accumulates, aggregation_mode
from weir.sql.errors import SqlError
from weir.sql.plan import AggregateCall, NamedExpression
from weir.sql.retract import RetractingAccumulators, group_changes
from weir.tools import nexmark_reference as ref

if TYPE_CHECKING:
    from weir.testing import JobRun, RunJob

pytest_plugins = ["weir.testing"]

ROOT = Path(__file__).resolve().parents[4]
QUERIES = ROOT / "bench/flink/src/main/resources/nexmark"
UPSERT = "'connector' = 'upsert-kafka', 'topic' = 'out', 'key.format' = 'json', 'value.format' = 'json'"
JDBC = "'connector' = 'jdbc', 'url' = 'jdbc:postgresql://localhost:5432/weir', 'table-name' = 'out'"


def final_table(values: Iterable[Any], key: Sequence[str]) -> Counter[str]:
    """The rows a sink's committed values leave, applied in order: an upsert-kafka sink's rows (each
    its key's new row) or a PostgreSQL sink's changes (+I/+U upsert, -D deletes), as a multiset."""
    table: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for value in values:
        if isinstance(value, Change):
            assert value.kind is not RowKind.UPDATE_BEFORE, "a -U reached the sink"
            if not accumulates(value.kind):
                table.pop(tuple(value.row[k] for k in key))
                continue
            value = value.row
        table[tuple(value[k] for k in key)] = value
    return Counter(json.dumps(dict(r), sort_keys=True) for r in table.values())


def multiset(rows: Iterable[Mapping[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(dict(r), sort_keys=True) for r in rows)


def sink_values(run: JobRun, script: str) -> list[Any]:
    (statement,) = plan_script(script).inserts
    (uid,) = [uid for uid in run.sinks if uid.startswith(statement.uid_prefix + "-")]
    return run.sinks[uid]


def job_file(tmp_path: Path, script: str) -> Path:
    job = tmp_path / "sql_job.py"
    job.write_text(f"from weir.sql import sql\n\nSCRIPT = {script!r}\n\n\ndef build(env):\n    sql(env, SCRIPT)\n")
    return job


# -- Nexmark q4, the benchmark's file unmodified ---------------------------------------------------

EVENTS = 3_000
CONFIG = nx.NexmarkConfig(events_per_second=100)


def q4_script(events: int) -> str:
    ddl = (ROOT / "examples/sql/nexmark-ddl.sql").read_text()
    ddl = ddl.replace("'events.num' = '100000'", f"'events.num' = '{events}'")
    ddl = ddl.replace("'first-event.rate' = '10000'", f"'first-event.rate' = '{CONFIG.events_per_second}'")
    return ddl + "\n" + (QUERIES / "q4.sql").read_text().replace("${UPSERT_SINK}", UPSERT)


def test_nexmark_q4_final_table_equals_the_plain_python_query(tmp_path: Path, weir_job: RunJob) -> None:
    script = q4_script(EVENTS)
    run = weir_job(job_file(tmp_path, script))
    expected = multiset(ref.q4([nx.event(n, CONFIG) for n in range(EVENTS)]))
    assert sum(expected.values()) >= 5
    values = sink_values(run, script)
    assert len(values) > sum(expected.values())  # updated, not only inserted
    assert final_table(values, ("id",)) == expected


def test_nexmark_q4_under_injected_failures(tmp_path: Path, weir_job: RunJob) -> None:
    events = 600
    script = q4_script(events)
    run = weir_job(job_file(tmp_path, script), checkpoint_every=40)
    expected = multiset(ref.q4([nx.event(n, CONFIG) for n in range(events)]))
    assert sum(expected.values()) >= 3
    assert final_table(sink_values(run, script), ("id",)) == expected
    run.with_failures()  # a failure at every checkpoint and crash point: the same committed output


MINI_BATCH = (
    "SET 'table.exec.mini-batch.enabled' = 'true';\nSET 'table.exec.mini-batch.allow-latency' = '1 s';\n"
    "SET 'table.exec.mini-batch.size' = '25';\n"
)
"""Batches of at most 25 rows, or of 1 s of processing time (the in-process run's clock: 1 ms per record)."""


def test_nexmark_q4_in_mini_batches_ends_in_the_same_table_with_fewer_updates(tmp_path: Path, weir_job: RunJob) -> None:
    script = q4_script(EVENTS)
    per_record = sink_values(weir_job(job_file(tmp_path, script)), script)
    batched_script = MINI_BATCH + script
    (tmp_path / "batched").mkdir()
    batched = sink_values(weir_job(job_file(tmp_path / "batched", batched_script)), batched_script)
    expected = multiset(ref.q4([nx.event(n, CONFIG) for n in range(EVENTS)]))
    assert final_table(batched, ("id",)) == expected == final_table(per_record, ("id",))
    assert len(batched) < len(per_record)  # one change per key and batch, not one per row


def test_nexmark_q4_in_mini_batches_under_injected_failures(tmp_path: Path, weir_job: RunJob) -> None:
    events = 600
    script = MINI_BATCH + q4_script(events)
    run = weir_job(job_file(tmp_path, script), checkpoint_every=40)
    expected = multiset(ref.q4([nx.event(n, CONFIG) for n in range(events)]))
    assert final_table(sink_values(run, script), ("id",)) == expected
    run.with_failures()  # every checkpoint flushes the batches first: the same committed output


# -- retracting aggregates over an updating subquery, against plain Python ----------------------------

PAIRED = f"""CREATE TABLE out (u STRING, groups BIGINT, rows_ BIGINT, low DOUBLE, high DOUBLE, mean DOUBLE,
  tops BIGINT, total DOUBLE, PRIMARY KEY (u) NOT ENFORCED) WITH ({UPSERT});
INSERT INTO out
SELECT Q.u, COUNT(*), SUM(Q.n), MIN(Q.low), MAX(Q.top), AVG(Q.top), COUNT(DISTINCT Q.top), SUM(Q.top)
FROM (SELECT u, qty, MAX(amount) AS top, MIN(amount) AS low, COUNT(*) AS n FROM orders GROUP BY u, qty) AS Q
GROUP BY Q.u;
"""


def inner_results(rows: Iterable[Mapping[str, Any]], key: Sequence[str]) -> list[dict[str, Any]]:
    """Per inner key: MAX(amount) AS top, MIN(amount) AS low, COUNT(*) AS n, MAX(qty) AS q (NULLs skipped)."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in key)].append(r)
    out = []
    for k, group in groups.items():
        amounts = [g["amount"] for g in group if g["amount"] is not None]
        out.append(
            dict(zip(key, k, strict=True))
            | {
                "top": max(amounts, default=None),
                "low": min(amounts, default=None),
                "n": len(group),
                "q": max(g["qty"] for g in group),
            }
        )
    return out


@pytest.mark.parametrize("failures", [False, True], ids=["failure-free", "injected-failures"])
def test_an_aggregation_of_an_updating_aggregation_retracts(tmp_path: Path, weir_job: RunJob, failures: bool) -> None:
    """The outer key is a column of the inner key: an updated inner row moves within one outer key
    (-U, +U), MIN/MAX retract through the multiset of values, AVG/SUM/COUNT by subtraction."""
    script = ORDERS + PAIRED
    rows = orders()
    run = weir_job(
        job_file(tmp_path, script),
        sources={source_uid("orders"): [json.dumps(r).encode() for r in rows]},
        checkpoint_every=25,
    )
    if failures:
        run.with_failures()
        run.with_failures(rescale=2)  # each failure's restore also at parallelism 2 (keyed state redistributed)
    per_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for inner in inner_results(rows, ("u", "qty")):
        per_user[inner["u"]].append(inner)
    expected = []
    for u, inner_rows in per_user.items():
        tops = [i["top"] for i in inner_rows if i["top"] is not None]
        lows = [i["low"] for i in inner_rows if i["low"] is not None]
        expected.append(
            {
                "u": u,
                "groups": len(inner_rows),
                "rows_": sum(i["n"] for i in inner_rows),
                "low": min(lows, default=None),
                "high": max(tops, default=None),
                "mean": sum(tops) / len(tops) if tops else None,
                "tops": len(set(tops)),
                "total": sum(tops) if tops else None,
            }
        )
    values = sink_values(run, script)
    assert len(values) > len(expected) and len(expected) == 4
    assert final_table(values, ("u",)) == multiset(expected)


MOVING = f"""CREATE TABLE out (top DOUBLE, users BIGINT, total BIGINT, low BIGINT, high BIGINT, mean BIGINT,
  qtys BIGINT, PRIMARY KEY (top) NOT ENFORCED) WITH ({JDBC});
INSERT INTO out
SELECT Q.top, COUNT(*), SUM(Q.n), MIN(Q.n), MAX(Q.n), AVG(Q.n), COUNT(DISTINCT Q.q)
FROM (SELECT u, MAX(amount) AS top, COUNT(*) AS n, MAX(qty) AS q FROM orders WHERE amount < 8 GROUP BY u) AS Q
GROUP BY Q.top;
"""


@pytest.mark.parametrize("failures", [False, True], ids=["failure-free", "injected-failures"])
def test_an_outer_key_left_by_its_last_row_is_deleted(tmp_path: Path, weir_job: RunJob, failures: bool) -> None:
    """The outer key (an inner aggregate's value) is not of the inner key: an inner row moves from one
    outer key to another, and an outer key it was the last row of is deleted (-D) in PostgreSQL."""
    script = ORDERS + MOVING
    rows = orders()
    run = weir_job(
        job_file(tmp_path, script),
        sources={source_uid("orders"): [json.dumps(r).encode() for r in rows]},
        checkpoint_every=25,
    )
    if failures:
        run.with_failures()
        run.with_failures(rescale=2)  # each failure's restore also at parallelism 2 (keyed state redistributed)
    kept = [r for r in rows if r["amount"] is not None and r["amount"] < 8]
    per_top: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for inner in inner_results(kept, ("u",)):
        per_top[inner["top"]].append(inner)
    expected = [
        {
            "top": top,
            "users": len(inner_rows),
            "total": sum(i["n"] for i in inner_rows),
            "low": min(i["n"] for i in inner_rows),
            "high": max(i["n"] for i in inner_rows),
            "mean": sum(i["n"] for i in inner_rows) // len(inner_rows),
            "qtys": len({i["q"] for i in inner_rows}),
        }
        for top, inner_rows in per_top.items()
    ]
    values = sink_values(run, script)
    assert any(isinstance(v, Change) and v.kind is RowKind.DELETE for v in values)
    assert final_table(values, ("top",)) == multiset(expected)


# -- the pure parts -----------------------------------------------------------------------------------

OLD, NEW = {"k": 1, "v": 1}, {"k": 1, "v": 2}
INS, UB, UA, D = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE


@pytest.mark.parametrize(
    ("emitted", "result", "kind", "paired", "changes", "after"),
    [
        (None, NEW, INS, True, [(INS, NEW)], NEW),
        (None, NEW, UA, False, [(INS, NEW)], NEW),
        (OLD, NEW, INS, True, [(UB, OLD), (UA, NEW)], NEW),
        (OLD, OLD, UA, True, [], OLD),
        (OLD, NEW, UB, False, [(UB, OLD), (UA, NEW)], NEW),
        (OLD, None, UB, True, [], OLD),  # its +U follows to this key
        (OLD, None, UB, False, [(D, OLD)], None),
        (OLD, None, D, True, [(D, OLD)], None),
        (None, None, D, False, [], None),
        (None, None, UB, True, [], None),
        (OLD, NEW, D, True, [(UB, OLD), (UA, NEW)], NEW),
    ],
)
def test_group_changes_decides_what_a_keys_new_result_emits(
    emitted: dict[str, int] | None,
    result: dict[str, int] | None,
    kind: RowKind,
    paired: bool,
    changes: list[tuple[RowKind, dict[str, int]]],
    after: dict[str, int] | None,
) -> None:
    step = group_changes(emitted, result, kind, paired=paired)
    assert [(c.kind, dict(c.row)) for c in step.changes] == changes
    assert step.emitted == after


def test_an_added_row_without_a_result_is_a_broken_invariant() -> None:
    with pytest.raises(AssertionError):
        group_changes(OLD, None, RowKind.INSERT, paired=True)


def test_the_changelog_of_an_aggregation() -> None:
    assert aggregation_mode(RETRACT, paired=True) == RETRACT
    assert aggregation_mode(RETRACT, paired=False) == WITH_DELETES
    assert aggregation_mode(WITH_DELETES, paired=True) == WITH_DELETES
    assert str(RETRACT) == "[+I, -U, +U]" and not RETRACT.deletes and WITH_DELETES.deletes
    assert [accumulates(k) for k in RowKind] == [True, False, True, False]


def call(name: str, function: Any, *, distinct: bool = False, star: bool = False) -> AggregateCall:
    argument = None if star else NamedExpression("x", "x", lambda row: row["x"])
    return AggregateCall(name, function, distinct, argument, name)


CALLS = (
    call("n", "COUNT", star=True),
    call("nx", "COUNT"),
    call("s", "SUM"),
    call("lo", "MIN"),
    call("hi", "MAX"),
    call("avg", "AVG"),
    call("dn", "COUNT", distinct=True),
    call("ds", "SUM", distinct=True),
    call("dlo", "MIN", distinct=True),
    call("davg", "AVG", distinct=True),
)


def direct(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The calls' results computed from the rows present (Flink's AVG of BIGINT truncates)."""
    xs = [r["x"] for r in rows if r["x"] is not None]
    ds = sorted(set(xs))
    return {
        "n": len(rows),
        "nx": len(xs),
        "s": sum(xs) if xs else None,
        "lo": min(xs, default=None),
        "hi": max(xs, default=None),
        "avg": sum(xs) // len(xs) if xs else None,
        "dn": len(ds),
        "ds": sum(ds) if ds else None,
        "dlo": min(ds, default=None),
        "davg": sum(ds) // len(ds) if ds else None,
    }


def test_retracting_accumulators_equal_the_aggregates_of_the_rows_present() -> None:
    """A random sequence of adds and retractions (of rows present, NULLs among them): after each
    step every call's result is the one computed from the multiset of rows present."""
    import random

    accumulators = RetractingAccumulators(CALLS)
    accs = accumulators.create()
    present: list[dict[str, Any]] = []
    shuffle = random.Random(35)
    for step in range(2_000):
        if present and shuffle.random() < 0.45:
            row = present.pop(shuffle.randrange(len(present)))
            accs = accumulators.retract(accs, row)
        else:
            row = {"x": None if shuffle.random() < 0.1 else shuffle.randrange(0, 12)}
            present.append(row)
            accs = accumulators.add(accs, row)
        assert accumulators.results(accs) == direct(present), step
    while present:
        accs = accumulators.retract(accs, present.pop())
    assert accs == accumulators.create()


# -- refused, one line with line:column ----------------------------------------------------------------

UPDATING = "(SELECT `user` AS u, COUNT(*) AS n FROM orders GROUP BY `user`)"
REFUSED = [
    (f"INSERT INTO totals SELECT u, n FROM {UPDATING} AS t;", "without GROUP BY is not supported", "u, n FROM"),
    (
        f"INSERT INTO out SELECT o.id, t.u FROM orders o JOIN {UPDATING} AS t ON o.`user` = t.u;",
        "INSERT INTO out: an outer join, or a join of an updating result, gives updating results; the sink must be",
        "o.id, t.u",
    ),
    (
        f"INSERT INTO out SELECT n, u FROM {UPDATING} AS t GROUP BY n, u;",
        "the sink must be 'upsert-kafka' or 'jdbc'",
        "n, u FROM",
    ),
    (
        f"INSERT INTO totals SELECT u, spread(n) FROM {UPDATING} AS t GROUP BY u;",
        "Python aggregate spread over an updating result",
        "spread(",
    ),
]


class Spread:
    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], value: int) -> tuple[int, int]:
        return (min(acc[0], value), max(acc[1], value))

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (min(a[0], b[0]), max(a[1], b[1]))

    def result(self, acc: tuple[int, int]) -> int:
        return acc[1] - acc[0]


@pytest.mark.parametrize(("statement", "message", "at"), REFUSED, ids=[r[1][:40] for r in REFUSED])
def test_a_refused_construct_over_an_updating_result_is_one_line_with_its_position(
    statement: str, message: str, at: str
) -> None:
    from tests.unit.weir.sql.test_script import ORDERS as TABLES
    from tests.unit.weir.sql.test_script import SINKS

    prefix = TABLES + SINKS.strip() + "\nCREATE TABLE bycount (n BIGINT, c BIGINT, PRIMARY KEY (n) NOT ENFORCED) WITH ("
    prefix += UPSERT + ");\n"
    line = prefix.count("\n") + 1
    with pytest.raises(SqlError) as raised:
        plan_script(prefix + statement, functions={"spread": Spread})
    text = str(raised.value)
    assert "\n" not in text
    assert message in text, text
    assert text.startswith(f"SQL {line}:{statement.index(at) + 1}: "), text
