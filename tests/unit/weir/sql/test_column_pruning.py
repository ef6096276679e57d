"""Column pruning of a SQL source (weir.sql.decode): the source decodes only the columns a statement
reads, and the job's records are those of the full decoding, record for record, malformed input too."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bench.nexmark_bench import kafka_events_ddl, query_sql, sink_options
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir import nexmark as nx
from weir.api import Environment
from weir.sql import compile as sql_compile
from weir.sql import explain, plan_script, sql
from weir.sql.compile import RowDecoder, compile_insert
from weir.sql.decode import coercer
from weir.sql.types import Kind, coerce

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

ROOT = Path(__file__).resolve().parents[4]
QUERIES = ROOT / "bench/flink/src/main/resources/nexmark"
CONFIG = nx.NexmarkConfig(events_per_second=100)
EVENTS = 2_000
TOPIC = "nexmark"
SOURCE = "sql-source-events"
TUMBLE = """
CREATE TABLE out_tumble (bidder BIGINT, bid_count BIGINT, total BIGINT, top BIGINT,
  starttime TIMESTAMP(3), endtime TIMESTAMP(3)) WITH (${SINK});
INSERT INTO out_tumble
SELECT bidder, COUNT(*), SUM(price), MAX(price), window_start, window_end
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
GROUP BY bidder, window_start, window_end;
"""
# each breaks one column's type, a column some query reads (price, auction, dateTime, event_type) or
# one none reads (reserve, initialBid, expires); a value that is not an object; a field as text
MALFORMED = [
    b'{"event_type": 2, "auction": 1000, "bidder": 1001, "price": "dear", "dateTime": 1000}',
    b'{"event_type": 2, "auction": "x", "bidder": 1001, "price": 5, "dateTime": 1000}',
    b'{"event_type": 2, "auction": 1000, "bidder": 1001, "price": 5, "dateTime": "soon"}',
    b'{"event_type": "bid", "auction": 1000, "bidder": 1001, "price": 5, "dateTime": 1000}',
    b'{"event_type": 2, "auction": 1000, "bidder": 1001, "price": 5, "dateTime": 1000, "reserve": "lots"}',
    b'{"event_type": 1, "id": 1000, "seller": 1001, "category": 10, "dateTime": 1000, "initialBid": 1.5}',
    b'{"event_type": 1, "id": 1000, "seller": 1001, "category": 10, "dateTime": 1000, "expires": true}',
    b"[1, 2]",
    b"not json",
]
# well-formed but unusual: NULLs, missing fields, numbers as text and as whole floats
UNUSUAL = [
    b'{"event_type": 2, "auction": null, "bidder": 1001, "price": null, "dateTime": 2000}',
    b'{"event_type": 2, "auction": "1000", "bidder": 1001.0, "price": "7", "dateTime": 3000, "extra": 5}',
    b'{"event_type": 2, "bidder": 1002, "dateTime": 4000, "reserve": "12"}',
    b'{"event_type": 0, "id": 1001, "name": "n", "city": "c", "state": "OR", "dateTime": 5000}',
]


def inputs() -> list[bytes]:
    events = [json.dumps(nx.to_dict(nx.event(n, CONFIG))).encode() for n in range(EVENTS)]
    return events[:10] + MALFORMED + UNUSUAL + events[10:]


def script(query: str) -> str:
    ddl = kafka_events_ddl(TOPIC, bootstrap="127.0.0.1:1", group="g").replace(
        "'format' = 'json'\n", "'format' = 'json',\n  'scan.dead-letter-topic' = 'nexmark-dead'\n"
    )
    if query == "q11-tumble":
        return ddl + "\n" + TUMBLE.replace("${SINK}", sink_options("out", "127.0.0.1:1", "g"))
    return ddl + "\n" + query_sql(query, output="out", bootstrap="127.0.0.1:1", group="g")


def multiset(values: list[Any]) -> Counter[str]:
    return Counter(json.dumps(v, sort_keys=True, default=repr) for v in values)


def pruned_decoder(text: str) -> RowDecoder:
    (statement,) = plan_script(text).inserts
    decoders: dict[str, RowDecoder] = {}
    compile_insert(None, statement.plan, statement.uid_prefix, text, decoders=decoders)
    return decoders["events"]


@pytest.mark.parametrize(
    "query",
    ["q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q11", "q11-tumble", "q15", "q16", "q17", "q20", "q21", "q22"],
)
def test_pruned_source_gives_the_full_decodings_records(
    tmp_path: Path, weir_job: RunJob, monkeypatch: pytest.MonkeyPatch, query: str
) -> None:
    text = script(query)
    job = tmp_path / "job.py"
    job.write_text(f"from weir.sql import sql\n\nSCRIPT = {text!r}\n\n\ndef build(env):\n    sql(env, SCRIPT)\n")
    pruned = weir_job(job, sources={SOURCE: inputs()})
    with monkeypatch.context() as m:
        m.setattr(sql_compile, "reads", lambda _plan: None)  # every column read: the full decoding
        m.setattr(sql_compile, "read_above", lambda _plan: {})  # every projection and join's row whole
        full = weir_job(job, sources={SOURCE: inputs()})
    (sink,) = full.sinks
    assert multiset(pruned.sinks[sink]) == multiset(full.sinks[sink])
    assert len(full.sinks[sink]) > 0
    # the source's rows (with their event times): the same records, the unread columns NULL; the
    # malformed records are in neither (the dead letters)
    unread = pruned_decoder(text).pruned
    assert len(unread) > 0
    full_rows = [[{k: None if k in unread else v for k, v in row.items()}, ts] for row, ts in full.records(SOURCE)]
    assert multiset([[row, ts] for row, ts in pruned.records(SOURCE)]) == multiset(full_rows)
    assert len(full_rows) == len(inputs()) - len(MALFORMED)


@pytest.mark.parametrize("query", ["q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q11", "q11-tumble"])
def test_pruned_row_is_the_full_row_restricted_with_the_same_errors(query: str) -> None:
    text = script(query)
    pruned = pruned_decoder(text)
    full = RowDecoder(pruned.table, text)
    assert pruned.pruned, "the query reads every column: nothing pruned"
    outcomes: Counter[str] = Counter()
    for raw in inputs():
        try:
            expected: Any = {k: None if k in pruned.pruned else v for k, v in full(raw).items()}
        except ValueError as error:
            expected = str(error)
        try:
            got: Any = pruned(raw)
        except ValueError as error:
            got = str(error)
        assert got == expected, raw
        assert got if isinstance(got, str) else list(got) == list(expected), raw  # the same shape
        outcomes["error" if isinstance(got, str) else "row"] += 1
    assert outcomes["error"] == len(MALFORMED)


def test_explain_shows_the_decoded_columns() -> None:
    text = (QUERIES / "q2.sql").read_text().replace("${SINK}", "'connector' = 'print'")
    ddl = (ROOT / "examples/sql/nexmark-ddl.sql").read_text()
    out = explain(ddl + "\n" + text)
    assert "sql-source-events  source: nexmark generator (events; decodes event_type, auction, price, dateTime)" in (
        out.splitlines()
    )


def test_a_join_passes_each_side_the_columns_read_above_it_and_its_key() -> None:
    """Nexmark q4: the auctions' id, category, dateTime, expires and the bids' auction, price and
    dateTime are read (the join's key, its WHERE and the GROUP BY); no bid's url or extra."""
    text = script("q4")
    lines = explain(text).splitlines()
    sources = [line for line in lines if line.startswith(SOURCE)]  # one per view, the source read once
    assert len(sources) == 2
    for source in sources:
        assert source.endswith("decodes event_type, id, expires, category, auction, price, dateTime)")


def test_a_later_statement_widens_a_shared_sources_columns() -> None:
    ddl = (ROOT / "examples/sql/nexmark-ddl.sql").read_text()
    text = ddl + (
        "\nCREATE TABLE o1 (a BIGINT) WITH ('connector' = 'print');"
        "\nCREATE TABLE o2 (c STRING) WITH ('connector' = 'print');"
        "\nINSERT INTO o1 SELECT auction FROM bid;"
    )
    job = sql(Environment("j", parallelism=1), text)
    decoder = job.decoders["events"]
    assert "city" in decoder.pruned
    assert "auction" not in decoder.pruned
    job.query("SELECT city FROM person")  # read by the same source: its decoder now decodes city too
    assert "city" not in decoder.pruned
    assert "auction" not in decoder.pruned
    assert "reserve" in decoder.pruned


@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize(
    "value", [None, 0, 7, -3, 2.0, 2.5, "12", "1.5", "x", "true", "FALSE", True, False, "2026-01-02 03:04:05.006", [1]]
)
def test_a_coercer_is_coerce(kind: Kind, value: Any) -> None:
    try:
        expected: Any = ("value", coerce(value, kind), type(coerce(value, kind)))
    except ValueError as error:
        expected = ("error", str(error))
    try:
        converted = coercer(kind)(value)
        got: Any = ("value", converted, type(converted))
    except ValueError as error:
        got = ("error", str(error))
    assert got == expected
