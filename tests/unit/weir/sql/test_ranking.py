"""Top-N and deduplication without a window (weir.sql.ranking): ``ROW_NUMBER() OVER (PARTITION BY k
ORDER BY ...) AS r ... WHERE r <= N`` over an append input, its result a changelog keyed by the
partition and the row number. Each job runs in this process (``weir_job``), its upsert sink's final
table (the writes applied in order) compared, as a multiset of whole rows, with plain Python over the
same input, with and without injected failures; the pure decision on its own; a refusal per
construct, one line with its line:column."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_retract import JDBC, UPSERT, final_table, job_file, multiset, sink_values
from tests.unit.weir.sql.test_run import ORDERS, ms_of, orders
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir.sql import plan_script, source_uid
from weir.sql.changelog import RowKind
from weir.sql.errors import SqlError
from weir.sql.ranking import ranked_changes

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

TOP3 = f"""CREATE TABLE best (u STRING, id BIGINT, amount DOUBLE, r BIGINT, PRIMARY KEY (u, r) NOT ENFORCED)
  WITH ({UPSERT});
INSERT INTO best
SELECT u, id, amount, r FROM (
  SELECT u, id, amount, ROW_NUMBER() OVER (PARTITION BY u ORDER BY amount DESC, id) AS r
  FROM orders WHERE amount IS NOT NULL)
WHERE r <= 3;
"""


@pytest.mark.parametrize("failures", [False, True], ids=["failure-free", "injected-failures"])
def test_top_n_without_a_window_keeps_each_partitions_first_rows(
    tmp_path: Path, weir_job: RunJob, failures: bool
) -> None:
    script = ORDERS + TOP3
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
    for r in rows:
        if r["amount"] is not None:
            per_user[r["u"]].append(r)
    expected = [
        {"u": u, "id": r["id"], "amount": r["amount"], "r": n}
        for u, group in per_user.items()
        for n, r in enumerate(sorted(group, key=lambda r: (-r["amount"], r["id"]))[:3], start=1)
    ]
    values = sink_values(run, script)
    assert len(values) > len(expected) == 12  # ranks updated as better rows arrive
    assert final_table(values, ("u", "r")) == multiset(expected)


LAST = f"""CREATE TABLE latest (u STRING, id BIGINT, qty INT, PRIMARY KEY (u) NOT ENFORCED) WITH ({JDBC});
INSERT INTO latest
SELECT u, id, qty FROM (SELECT u, id, qty, ts, ROW_NUMBER() OVER (PARTITION BY u ORDER BY ts DESC) AS rn FROM orders)
WHERE rn = 1;
"""


@pytest.mark.parametrize("failures", [False, True], ids=["failure-free", "injected-failures"])
def test_deduplication_keeps_each_keys_last_row(tmp_path: Path, weir_job: RunJob, failures: bool) -> None:
    """N = 1 by the event time descending (Nexmark q18's shape): each key's latest row, the row
    number not selected, the sink keyed by the partition."""
    script = ORDERS + LAST
    rows = orders()
    run = weir_job(
        job_file(tmp_path, script),
        sources={source_uid("orders"): [json.dumps(r).encode() for r in rows]},
        checkpoint_every=25,
    )
    if failures:
        run.with_failures()
        run.with_failures(rescale=2)  # each failure's restore also at parallelism 2 (keyed state redistributed)
    last: dict[str, dict[str, Any]] = {}
    for r in sorted(rows, key=ms_of):
        last[r["u"]] = {"u": r["u"], "id": r["id"], "qty": r["qty"]}
    values = sink_values(run, script)
    assert len(values) > len(last) == 4
    assert final_table(values, ("u",)) == multiset(last.values())


A, B, C = {"x": 1}, {"x": 2}, {"x": 3}


@pytest.mark.parametrize(
    ("before", "after", "changes"),
    [
        ([], [A], [(RowKind.INSERT, {"x": 1, "r": 1})]),
        ([A], [A], []),
        (
            [A],
            [B, A],
            [
                (RowKind.UPDATE_BEFORE, {"x": 1, "r": 1}),
                (RowKind.UPDATE_AFTER, {"x": 2, "r": 1}),
                (RowKind.INSERT, {"x": 1, "r": 2}),
            ],
        ),
        ([A, B], [A, C], [(RowKind.UPDATE_BEFORE, {"x": 2, "r": 2}), (RowKind.UPDATE_AFTER, {"x": 3, "r": 2})]),
    ],
)
def test_ranked_changes_update_each_row_number_whose_row_changed(
    before: list[dict[str, int]], after: list[dict[str, int]], changes: list[tuple[RowKind, dict[str, int]]]
) -> None:
    assert [(c.kind, dict(c.row)) for c in ranked_changes(before, after, "r")] == changes


def test_the_first_rows_of_an_append_input_never_shrink() -> None:
    with pytest.raises(AssertionError):
        ranked_changes([A, B], [A], "r")


SINKS = f"""CREATE TABLE keyed (u STRING, id BIGINT, r BIGINT, PRIMARY KEY (u, r) NOT ENFORCED) WITH ({UPSERT});
CREATE TABLE by_user (u STRING, id BIGINT, PRIMARY KEY (u) NOT ENFORCED) WITH ({UPSERT});
CREATE TABLE by_id (u STRING, id BIGINT, r BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ({UPSERT});
"""
RANKED = "(SELECT u, id, ROW_NUMBER() OVER (PARTITION BY u ORDER BY id DESC) AS r FROM orders)"
REFUSED = [
    (f"INSERT INTO by_user SELECT u, id FROM {RANKED} WHERE r <= 2;", "needs its row number r in the SELECT", "u, id"),
    (
        f"INSERT INTO by_id SELECT u, id, r FROM {RANKED} WHERE r <= 2;",
        "must hold exactly the Top-N's PARTITION",
        "u, id",
    ),
    (f"INSERT INTO keyed SELECT u, id, r FROM {RANKED} WHERE r <= 2 AND id > 3;", "WHERE over an updating", "id > 3"),
    (
        "INSERT INTO keyed SELECT u, id, r FROM (SELECT u, id, ROW_NUMBER() OVER (PARTITION BY u ORDER BY id) AS r "
        "FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '1' SECOND))) WHERE r <= 2;",
        "a Top-N directly over a window TVF's rows",
        "ROW_NUMBER",
    ),
]


@pytest.mark.parametrize(("statement", "message", "at"), REFUSED, ids=[r[1][:40] for r in REFUSED])
def test_a_refused_top_n_without_a_window_is_one_line_with_its_position(statement: str, message: str, at: str) -> None:
    prefix = ORDERS + SINKS
    line = prefix.count("\n") + 1
    with pytest.raises(SqlError) as raised:
        plan_script(prefix + statement)
    text = str(raised.value)
    assert "\n" not in text
    assert message in text, text
    assert text.startswith(f"SQL {line}:{statement.index(at) + 1}: "), text


def test_nexmark_q18_final_table_equals_the_plain_python_query(tmp_path: Path, weir_job: RunJob) -> None:
    """The benchmark's q18 file (the suite's query text, its sink upsert-kafka keyed by the partition)."""
    from tests.unit.weir.sql.test_retract import CONFIG, QUERIES, ROOT
    from weir import nexmark as nx
    from weir.tools import nexmark_reference as ref

    events = 1_500
    ddl = (ROOT / "examples/sql/nexmark-ddl.sql").read_text()
    ddl = ddl.replace("'events.num' = '100000'", f"'events.num' = '{events}'")
    ddl = ddl.replace("'first-event.rate' = '10000'", f"'first-event.rate' = '{CONFIG.events_per_second}'")
    script = ddl + "\n" + (QUERIES / "q18.sql").read_text().replace("${UPSERT_SINK}", UPSERT)
    run = weir_job(job_file(tmp_path, script))
    expected = multiset(ref.q18([nx.event(n, CONFIG) for n in range(events)]))
    assert sum(expected.values()) >= 200
    values = sink_values(run, script)
    assert len(values) > sum(expected.values())  # a key's later bid replaces its row
    assert final_table(values, ("bidder", "auction")) == expected


@pytest.mark.parametrize(
    "select",
    [
        f"SELECT u, id, r FROM {RANKED} WHERE r <= 2",
        "SELECT u, COUNT(*) AS c FROM (SELECT u, qty, COUNT(*) AS n FROM orders GROUP BY u, qty) GROUP BY u",
    ],
)
def test_a_python_jobs_query_of_a_changelog_is_refused_with_its_position(select: str) -> None:
    from weir.sql.plan import Catalog, plan_query
    from weir.sql.script import Text, parse_expression

    script = plan_script(ORDERS)
    parsed = parse_expression(Text(select), select, 0)
    with pytest.raises(SqlError) as raised:
        plan_query(parsed, 0, Catalog(script.tables, script.views), select)  # type: ignore[arg-type]
    assert str(raised.value).startswith("SQL 1:8: a query whose result is a changelog"), str(raised.value)


def test_nexmark_q19_final_table_equals_the_plain_python_query(tmp_path: Path, weir_job: RunJob) -> None:
    """The benchmark's q19 file (the suite's query text, its sink upsert-kafka keyed by the auction
    and the row number); bids of one auction at one price compared with the lowest row number among
    them (their order is undefined: the rows' values on Weir, the stream's order in the reference)."""
    from bench.nexmark_bench import SPECS, record_of, untied
    from tests.unit.weir.sql.test_retract import CONFIG, QUERIES, ROOT
    from weir import nexmark as nx
    from weir.tools import nexmark_reference as ref

    events = 1_500
    ddl = (ROOT / "examples/sql/nexmark-ddl.sql").read_text()
    ddl = ddl.replace("'events.num' = '100000'", f"'events.num' = '{events}'")
    ddl = ddl.replace("'first-event.rate' = '10000'", f"'first-event.rate' = '{CONFIG.events_per_second}'")
    script = ddl + "\n" + (QUERIES / "q19.sql").read_text().replace("${UPSERT_SINK}", UPSERT)
    run = weir_job(job_file(tmp_path, script))
    spec = SPECS["q19"]
    expected = Counter(
        untied(spec, [record_of(spec, r) for r in ref.q19([nx.event(n, CONFIG) for n in range(events)])])
    )
    assert sum(expected.values()) >= 500
    values = sink_values(run, script)
    table: dict[tuple[Any, Any], Any] = {}
    for change in values:  # upsert-kafka's changes, each its key's new row (no -U, no -D), in order
        assert change.kind in (RowKind.INSERT, RowKind.UPDATE_AFTER), change
        table[(change.row["auction"], change.row["rank_number"])] = change.row
    assert len(values) > len(table)  # a higher bid moves the lower ones down
    assert Counter(untied(spec, [record_of(spec, r) for r in table.values()])) == expected
